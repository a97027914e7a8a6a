"""The one owner of fmesh's process groups: which exist, how each is created, what it cost.

A :class:`GroupRegistry` answers two questions and remembers the answers:

* :meth:`GroupRegistry.target`: what ``(mesh, axes)`` means on this rank, a :class:`Target`
  (the checked axis names, this rank's ordered group, and the group's :class:`GroupSpec`).
  Pure arithmetic on the mesh, cached on the normalised ``(mesh, axes)``.
* :meth:`GroupRegistry.group`: the ``ProcessGroup`` of a target, created on first need by its
  members only (after they agree on what they mean, see :mod:`fmesh.context.agreement`) and
  shared by every target with the same spec.

:meth:`GroupRegistry.split` creates the groups of whole partitions of the world at once (one
``split_group`` per layout, for a default group bound to a device); it goes through the same
agreement and the same bookkeeping.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.agreement import agree
from fmesh.context.options import GroupSettings, GroupSpec
from fmesh.context.world import World
from fmesh.errors import ContextClosedError
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg


@attrs.frozen
class Target:
    """``axes`` of ``mesh`` as seen from this rank: its group's ordered ``ranks`` and ``spec``."""

    mesh: Mesh
    axes: tuple[str, ...]
    ranks: tuple[int, ...]
    spec: GroupSpec

    @property
    def size(self) -> int:
        """The group size."""
        return len(self.ranks)

    def describe(self) -> str:
        """What every member must mean by this group: compared across ranks before it is created."""
        return f"{describe_mesh(self.mesh)}, group {list(self.ranks)}"


def describe_mesh(mesh: Mesh) -> str:
    """A mesh as ranks must agree on it: its repr, universe and every axis's layout.

    >>> import fmesh; print(describe_mesh(fmesh.make_mesh((2,), ("dp",))))
    Mesh(dp=2; world=2) over Universe(world=2, 'cpu', id=3278e91e8d6ac839), layouts dp=(2,):(1,)
    """
    layouts = ";".join(f"{n}={lay.shape}:{lay.stride}" for n, lay in zip(mesh.axis_names, mesh.layouts, strict=True))
    return f"{mesh!r} over {mesh.universe!r}, layouts {layouts}"


class GroupRegistry:
    """Targets and process groups of one Context; see the module docstring.

    >>> import fmesh
    >>> world = World.start(backend="fake", rank=1, world_size=4)
    >>> registry = GroupRegistry(world, GroupSettings.of(None, 60, backend="fake"))
    >>> target = registry.target(fmesh.make_mesh((2, 2), ("dp", "tp")), "dp")
    >>> target.ranks, registry.group(target) is registry.group(target), registry.stats()["groups_created"]
    ((1, 3), True, 1)
    >>> registry.close(); world.close()
    """

    def __init__(self, world: World, settings: GroupSettings, *, ascending_only: bool = False) -> None:
        self._world = world
        self._settings = settings
        # fmesh.simulate: torch's LocalTensorMode runs collectives only over groups whose ranks ascend.
        self._ascending_only = ascending_only
        self._targets: dict[tuple[Mesh, tuple[str, ...]], Target] = {}
        self._groups: dict[GroupSpec, dist.ProcessGroup] = {}
        self._created_for: dict[str, int] = {}  # how many groups this rank made per axes label
        self._hits = 0
        self._seconds = 0.0
        self._closed = False

    # ------------------------------------------------------------- targets

    def check_open(self) -> None:
        """``ContextClosedError`` once :meth:`close` ran."""
        if self._closed:
            raise ContextClosedError("this fmesh Context is closed; create a new one (its groups were destroyed)")

    def check_mesh(self, mesh: object) -> Mesh:
        """``mesh`` if it is a Mesh of this world; ``TypeError``/``ValueError`` naming it otherwise."""
        if not isinstance(mesh, Mesh):
            raise TypeError(f"expected an fmesh.Mesh, but got {type(mesh).__name__}: {mesh!r}")
        if mesh.world_size != self._world.world_size:
            raise ValueError(
                f"{mesh!r} is built for {mesh.world_size} ranks, but this context has {self._world.world_size}"
            )
        return mesh

    def target(self, mesh: Mesh, axes: AxesArg) -> Target:
        """This rank's group along ``axes`` of ``mesh``, checked; cached on the normalised arguments.

        ``"tp"``, ``("tp",)`` and ``["tp"]`` are one entry (``close()`` empties the cache, so a hit
        also means the registry is open).
        """
        try:
            found = self._targets[(mesh, mesh.as_axes(axes))]
        except (KeyError, AttributeError, TypeError):  # new, not a Mesh, or unhashable: check it all
            return self._new_target(mesh, axes)
        self._hits += 1
        return found

    def _new_target(self, mesh: Mesh, axes: AxesArg) -> Target:
        self.check_open()
        self.check_mesh(mesh)
        names = mesh.resolve_axes(axes)
        ranks = mesh.group(self._world.rank, names)
        if self._ascending_only:
            self._check_ascending(mesh, names)
        made = Target(mesh, names, ranks, self.spec(names, ranks))
        if made.spec in self._groups:  # another mesh already made this group: shared
            self._hits += 1
        self._targets[(mesh, names)] = made
        return made

    def _check_ascending(self, mesh: Mesh, names: tuple[str, ...]) -> None:
        unsorted = next((g for g in mesh.groups(names) if list(g) != sorted(g)), None)
        if unsorted is not None:
            raise ValueError(
                f"simulate() can only run collectives over groups whose ranks ascend, but the group "
                f"{list(unsorted)} along axes {names} of {mesh!r} does not (a permuted rank map or a "
                "reversed axis order); run this mesh on real processes with fmesh.launch(...)"
            )

    # -------------------------------------------------------------- groups

    def group(self, target: Target) -> dist.ProcessGroup | None:
        """The target's process group, created on first need; ``None`` for a group of one."""
        if target.size == 1:
            return None
        return self.process_group(target)

    def process_group(self, target: Target) -> dist.ProcessGroup:
        """The target's process group, even for a group of one (made only when asked for)."""
        group = self._groups.get(target.spec)
        if group is not None:
            return group
        self.check_open()
        if _torch.bound_device() is not None and target.size > 1:
            raise RuntimeError(
                f"no group yet for axes {target.axes} of {target.mesh!r}: the default group is bound to a "
                "device, so creating one needs every rank; call ctx.materialize(...) on every rank before "
                "collectives"
            )
        started = time.perf_counter()
        what = f"creating the group along axes {target.axes} of {target.mesh!r}"
        self._agree(target.axes, target.describe(), target.ranks, target.spec, what)
        group = _torch.create_group(
            target.spec.ranks,
            f"{self._world.name}:{self._world.epoch}:{target.spec.digest()}",
            backend=target.spec.backend,
            timeout=target.spec.timeout,
            options=target.spec.options,
            description=f"fmesh_{'_'.join(target.axes)}",
        )
        self._record(target.spec, group, started)
        return group

    def split(self, mesh: Mesh, axes: tuple[str, ...], mine: tuple[int, ...] | None) -> None:
        """Create the groups along ``axes`` of ``mesh`` for the whole world at once (one
        ``split_group``): every rank calls this, for the same meshes, in the same order. ``mine`` is
        this rank's group (``None`` if the mesh does not cover it); it is recorded like any other."""
        self.check_open()
        spec = self.spec(axes, mine or ())
        if mine is not None and spec in self._groups:
            return
        started = time.perf_counter()
        world = tuple(range(self._world.world_size))
        what = f"splitting the groups along axes {axes} of {mesh!r}"
        self._agree(("split", *axes), f"split along {axes} of {describe_mesh(mesh)}", world, spec, what)
        group = _torch.split_groups(mesh.groups(axes), timeout=spec.timeout, options=spec.options)
        if group is not None and mine is not None and len(mine) > 1:
            self._record(spec, group, started)

    def _agree(self, label_axes: tuple[str, ...], description: str, members: tuple[int, ...], spec: GroupSpec,
               what: str) -> None:
        if self._world.fake or len(members) == 1:
            return
        label = ",".join(label_axes)
        sequence = self._created_for.get(label, 0)
        self._created_for[label] = sequence + 1
        key = f"fmesh/{self._world.name}/{self._world.epoch}/agree/{label}/{sequence}"
        agree(self._world.store(), key, self._world.rank, members, description, spec.timeout, what)

    def _record(self, spec: GroupSpec, group: dist.ProcessGroup, started: float) -> None:
        self._groups[spec] = group
        self._seconds += time.perf_counter() - started

    def spec(self, axes: tuple[str, ...], ranks: tuple[int, ...]) -> GroupSpec:
        """The spec of a group of ``ranks`` along ``axes`` under this registry's settings."""
        return self._settings.spec(axes, ranks)

    def exists(self, target: Target) -> bool:
        """Whether the target needs no group (a group of one) or has one already."""
        return target.size == 1 or target.spec in self._groups

    # ------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Groups created, cache hits, targets seen, seconds spent creating groups, and the groups."""
        return {
            "groups_created": len(self._groups),
            "cache_hits": self._hits,
            "meshes_seen": len(self._targets),
            "creation_seconds": round(self._seconds, 6),
            "groups": [(spec.ranks, spec.backend) for spec in self._groups],
        }

    def close(self) -> None:
        """Destroy every group made here; afterwards every question raises ``ContextClosedError``."""
        if self._closed:
            return
        self._closed = True
        if dist.is_initialized():
            for group in self._groups.values():
                dist.destroy_process_group(group)
        self._groups.clear()
        self._targets.clear()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def __len__(self) -> int:
        return len(self._groups)
