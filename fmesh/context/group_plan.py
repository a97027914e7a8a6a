"""Which groups a program will need, before any is created: :func:`plan_groups`.

A plan lists each distinct communicator once, in the order of :func:`fmesh.plan.communicators.plan_communicators`
(the pure planner the manifest also writes down), with its size, how many groups it has, how many hosts one
group touches, the backend, this rank's group, and whether that group exists yet.
:meth:`fmesh.Context.materialize` creates what a plan lists through the registry, like any other group, after
one meeting of the ranks the meshes cover on every group of the plan (:class:`Agenda`): one digest of all the
groups' descriptions, one arrival count, one verdict, instead of one agreement per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fmesh.context import _torch
from fmesh.context.groups import GroupRegistry, describe_group, describe_mesh
from fmesh.context.options import GroupSettings, wire_options
from fmesh.context.world import World
from fmesh.mesh import Mesh
from fmesh.plan.communicators import PlanItem as PlanItem  # what Context.plan takes: the planner's
from fmesh.plan.communicators import Request, plan_communicators, requests_of
from fmesh.plan.topology import Topology


@attrs.frozen
class PlannedGroup:
    """One distinct group layout a program needs (see :meth:`fmesh.Context.plan`).

    >>> import fmesh
    >>> with fmesh.Context.fake(8) as ctx:
    ...     print(ctx.plan(fmesh.make_mesh((2, 4), ("dp", "tp"))).groups[1])
    tp                       size 4     groups 2      hosts/group 1    fake  to create mine [0, 1, 2, 3]
    """

    mesh: Mesh
    axes: tuple[str, ...]
    size: int
    num_groups: int
    backend: str
    ranks: tuple[int, ...] | None
    hosts_per_group: int
    exists: bool

    def __str__(self) -> str:
        state = "exists" if self.exists else "to create"
        mine = "-" if self.ranks is None else list(self.ranks)
        return (
            f"{'x'.join(self.axes):<24} size {self.size:<5} groups {self.num_groups:<6} "
            f"hosts/group {self.hosts_per_group:<4} {self.backend:<5} {state:<9} mine {mine}"
        )


@attrs.frozen
class GroupPlan:
    """The groups a program will need, before any is created (see :meth:`fmesh.Context.plan`).

    >>> GroupPlan(()).to_create
    0
    """

    groups: tuple[PlannedGroup, ...]

    @property
    def to_create(self) -> int:
        """How many of the planned layouts still need a group on this rank."""
        return sum(1 for g in self.groups if not g.exists and g.ranks is not None)

    def __str__(self) -> str:
        header = f"{len(self.groups)} distinct group layouts, {self.to_create} to create on this rank"
        return "\n".join([header, *(str(g) for g in self.groups)])


@attrs.frozen
class Agenda:
    """The groups of some meshes as every rank must mean them, for one meeting on all of them: each group layout's
    description (``layouts``, as :meth:`~fmesh.context.groups.Target.describe` gives it, in plan order), and what
    the ranks compare (``description``: every mesh once, then each layout's axes, backend, options and timeout).

    >>> import fmesh
    >>> settings = GroupSettings.of(None, 60, backend="gloo")
    >>> agenda = Agenda.of([fmesh.make_mesh((2, 2), ("dp", "tp"))], settings)
    >>> len(agenda.layouts), agenda.description.split(": ", 1)[1]
    (2, "axes ('dp',) gloo none 60s, axes ('tp',) gloo none 60s")
    """

    layouts: tuple[str, ...]
    description: str
    meshes: tuple[Mesh, ...]

    @classmethod
    def of(cls, items: Iterable[object], settings: GroupSettings) -> Agenda:
        """The agenda of ``items`` (meshes and ``(mesh, axes)`` pairs, as :meth:`fmesh.Context.plan` takes them)
        under ``settings``."""
        layouts: list[str] = []
        by_mesh: dict[Mesh, list[str]] = {}
        for request in requests_of(items, "meshes"):
            spec = settings.spec(request.axes, ())
            layout = describe_group(request.mesh, request.axes, spec)
            if layout not in layouts:
                layouts.append(layout)
                by_mesh.setdefault(request.mesh, []).append(
                    f"axes {request.axes} {spec.backend} {spec.options_key} {spec.timeout.total_seconds():g}s")
        description = " | ".join(f"{describe_mesh(mesh)}: {', '.join(axes)}" for mesh, axes in by_mesh.items())
        return cls(tuple(layouts), description, tuple(by_mesh))

    def participants(self, world_size: int) -> tuple[int, ...]:
        """The ranks the meshes cover: those that meet on this agenda."""
        if any(mesh.num_covered == world_size for mesh in self.meshes):
            return tuple(range(world_size))
        return tuple(r for r in range(world_size) if any(m.coordinate(r) is not None for m in self.meshes))


def starting_with(items: Iterable[object], settings: GroupSettings,
                  check_tensors: str) -> Callable[[str], tuple[str, dict[str, str]]]:
    """What the ranks compare as they start with the meshes ``items`` (``Context(meshes=...)``) under ``settings``
    and the members' check ``check_tensors``, given the backend their world will have: the description of the
    meshes' groups ("" without meshes) and the Context's wire-relevant options (:func:`wire_options`). The items are
    checked now, before any group is touched."""
    items = tuple(items)
    if items:
        Agenda.of(items, settings)

    def agenda(backend: str) -> tuple[str, dict[str, str]]:
        chosen = attrs.evolve(settings, backend=backend)
        return (Agenda.of(items, chosen).description if items else ""), wire_options(chosen, check_tensors)

    return agenda


def agree_at_start(items: Iterable[object], registry: GroupRegistry, world: World) -> None:
    """The groups of the meshes ``items`` a context starts with, agreed on by every rank they cover: in the start's
    own meeting where it carried them (fmesh's env:// rendezvous, :func:`starting_with`), else in one meeting now.
    Their groups are then created on first use (or by :meth:`fmesh.Context.materialize`) without meeting again."""
    items = tuple(items)
    if not items:
        return
    agenda = Agenda.of(items, registry.settings)
    for mesh in agenda.meshes:
        registry.check_mesh(mesh)
    if agenda.description == world.agreed_at_start:
        registry.agreed(agenda.layouts)
    else:
        registry.meet(agenda.layouts, agenda.participants(world.world_size), agenda.description,
                      f"the groups of {', '.join(map(repr, agenda.meshes))}")


def plan_items(items: Iterable[object], registry: GroupRegistry) -> list[tuple[Mesh, tuple[str, ...]]]:
    """Meshes (every axis, one by one) and ``(mesh, axes)`` pairs as checked ``(mesh, names)`` pairs.

    >>> import fmesh
    >>> from fmesh.context.options import GroupSettings, wire_options
    >>> world = World.start(backend="fake", rank=0, world_size=4)
    >>> mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    >>> plan_items([mesh, (mesh, ["tp", "dp"])], GroupRegistry(world, GroupSettings.of(None, 60, backend="fake")))
    [(Mesh(dp=2, tp=2; world=4), ('dp',)), (Mesh(dp=2, tp=2; world=4), ('tp',)), \
(Mesh(dp=2, tp=2; world=4), ('tp', 'dp'))]
    >>> world.close()  # it started the default group, so it ended it
    True
    """
    return [(request.mesh, request.axes) for request in _requests(items, registry)]


def _requests(items: Iterable[object], registry: GroupRegistry) -> list[Request]:
    requests = requests_of(items, "plan/materialize")
    for request in requests:
        registry.check_mesh(request.mesh)
    return requests


def _topology(world: World) -> Topology | None:
    hosts = max(1, world.world_size // max(1, world.local_world_size))
    return Topology(hosts, world.world_size // hosts) if world.world_size % hosts == 0 else None


def plan_groups(items: Iterable[object], registry: GroupRegistry, world: World) -> GroupPlan:
    """The plan of ``items`` (see :func:`plan_items`) on this rank; creates nothing.

    The distinct communicators and their order are :func:`fmesh.plan.communicators.plan_communicators`'s; a
    communicator asked for with two backends or options is two groups.
    """
    registry.check_open()
    topology = _topology(world)
    requests = _requests(items, registry)
    communicators = plan_communicators(requests)
    planned: dict[tuple[Any, ...], PlannedGroup] = {}
    for request, order in zip(requests, communicators.of_request, strict=True):
        mesh, names = request.mesh, request.axes
        covered = mesh.coordinate(world.rank) is not None
        target = registry.target(mesh, names) if covered else None
        spec = target.spec if target is not None else registry.spec(names, ())
        key = (order, spec.backend, spec.options_key)
        if key in planned:
            continue
        size = communicators.communicators[order].size
        span = topology.span(mesh, names) if topology is not None else None
        planned[key] = PlannedGroup(
            mesh=mesh,
            axes=names,
            size=size,
            num_groups=mesh.num_covered // size,
            backend=spec.backend,
            ranks=target.ranks if target is not None else None,
            hosts_per_group=span.hosts_max if span is not None else 0,
            exists=target is not None and registry.exists(target),
        )
    return GroupPlan(tuple(planned.values()))


def materialize(items: Iterable[object], registry: GroupRegistry, world: World) -> GroupPlan:
    """Create every group :func:`plan_groups` lists for ``items``, now, in the plan's order
    (:meth:`fmesh.Context.materialize`); the plan, with every group of this rank existing."""
    plan = plan_groups(items, registry, world)
    split = _torch.bound_device() is not None and not world.fake
    if not split:  # every group of the plan agreed on at once (a split agrees on each layout with the whole world)
        agenda = Agenda.of(items, registry.settings)
        registry.meet(agenda.layouts, agenda.participants(world.world_size), agenda.description,
                      f"the groups of {', '.join(map(repr, agenda.meshes))}")
    for planned in plan.groups:
        if planned.exists:
            continue
        if split:
            registry.split(planned.mesh, planned.axes, planned.ranks)
        elif planned.ranks is not None:
            registry.group(registry.target(planned.mesh, planned.axes), claim=False)
    # Every pair asked for is resolved, not only one per distinct group: a compiled region looks up
    # (mesh, axes) as written (two axes of one layout share a group but are two lookups).
    for mesh, names in plan_items(items, registry):
        if mesh.coordinate(world.rank) is not None:
            registry.resolve(mesh, names, claim=False)
    # Every group this rank is a member of exists now; no need to plan (and walk the topology) again.
    return GroupPlan(tuple(attrs.evolve(g, exists=g.ranks is not None) for g in plan.groups))
