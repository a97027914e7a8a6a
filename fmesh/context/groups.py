"""The one owner of fmesh's process groups: which exist, how each is created, what it cost, how they end.

A :class:`GroupRegistry` answers two questions and remembers the answers:

* :meth:`GroupRegistry.target`: what ``(mesh, axes)`` means on this rank, a :class:`Target`
  (the checked axis names, this rank's ordered group, and the group's :class:`GroupSpec`).
  Pure arithmetic on the mesh, cached on the normalised ``(mesh, axes)``.
* :meth:`GroupRegistry.group`: the ``ProcessGroup`` of a target, created on first need by its
  members only (after they agree on what they mean, see :mod:`fmesh.context.store.agreement`) and
  shared by every target with the same spec.

:meth:`GroupRegistry.split` creates the groups of whole partitions of the world at once (one
``split_group`` per layout, for a default group bound to a device); it goes through the same
agreement and the same bookkeeping. :meth:`GroupRegistry.close` destroys the groups and lets go of
every reference to them while the interpreter is alive; :meth:`GroupRegistry.abort` tears them down
without waiting for peers, or for anything (it takes no lock: it runs from signal handlers and
watchdog threads while the context's thread may be creating a group).

One thread uses a group: the first that creates it or runs a collective on it. Collectives are matched across
ranks by their order on each group, so two threads of one rank using one group would mix their tensors: the
second is refused with an error saying so (:meth:`GroupRegistry.claim`). Threads on distinct groups (a pipeline
schedule's send/receive thread, an asynchronous checkpoint on a group of its own) run side by side, as torch
allows, once their groups exist: groups are created by one thread at a time (their creation shares the rank's store
connection), and a thread asking for a new group while another creates one is refused, saying to create them first
(``ctx.materialize``).

Connecting a group is bounded by the creation timeout (gloo's rendezvous otherwise waits the
collective timeout), and a member that fails meanwhile is named
(:func:`~fmesh.context.store.agreement.connect_failed`). Before a group is created, the process's
file descriptors are counted (:meth:`~fmesh.context.store.connections.Connections.check_room`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import Any

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.options import GroupSettings, GroupSpec
from fmesh.context.store.agreement import agree, connect_failed
from fmesh.context.store.board import Board
from fmesh.context.store.connections import open_sockets
from fmesh.context.store.keys import digest
from fmesh.context.store.recovery_vote import HeldGroup
from fmesh.context.world import World
from fmesh.errors import ContextClosedError, RankLostError
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg
from fmesh.plan.communicators import CREATE, SHRINK, Action, renewals

# Dynamo before torch 2.13 cannot hash a Mesh (an attrs class with its own __hash__), so a compiled region
# finds its groups by the mesh object's identity there, in entries that eager calls record (at most this many).
BY_IDENTITY = _torch.TORCH < (2, 13)
IDENTITY_ENTRIES = 256
_NOT_BEFORE_COMPILING = (
    "fmesh has no group yet along {axes!r} of {mesh!r} inside torch.compile: groups are made in eager (they need "
    "the store and every member); build meshes outside the compiled region and call ctx.materialize(mesh) (or the "
    "collective once) before compiling")


@attrs.frozen
class Target:
    """``axes`` of ``mesh`` as seen from this rank: its group's ordered ``ranks``, ``spec``, and
    ``member``, this rank's place in ``ranks`` (its group rank)."""

    mesh: Mesh
    axes: tuple[str, ...]
    ranks: tuple[int, ...]
    spec: GroupSpec
    member: int = attrs.field(kw_only=True)

    @property
    def size(self) -> int:
        """The group size."""
        return len(self.ranks)

    def describe(self) -> str:
        """What every member must mean by this group, compared across ranks before it is created: the
        mesh, the axes and the options (a few hundred bytes, whatever the group size)."""
        return describe_group(self.mesh, self.axes, self.spec)

    def label(self) -> str:
        """The group in errors: its axes, its mesh and its first ranks.

        >>> import fmesh
        >>> from fmesh.context.options import GroupSettings
        >>> spec = GroupSettings.of(None, 60, backend="gloo").spec(("dp",), (0, 2))
        >>> Target(fmesh.make_mesh((2, 2), ("dp", "tp")), ("dp",), (0, 2), spec, member=0).label()
        "the group [0, 2] along axes ('dp',) of Mesh(dp=2, tp=2; world=4)"
        """
        shown = list(self.ranks[:8])
        ranks = f"{shown}" if len(self.ranks) <= 8 else f"{str(shown)[:-1]}, ... ({len(self.ranks)} ranks)]"
        return f"the group {ranks} along axes {self.axes} of {self.mesh!r}"


@attrs.frozen(eq=False)
class Route:
    """Where a collective goes: this rank's ``target`` (its group along some axes of a mesh), the process
    ``group`` (``None`` for a group of one) and the status ``board`` that explains a failure (``None`` on the fake
    backend). The registry makes one per (mesh, axes) and hands the same object out again, so a compiled region
    reads it and never builds one."""

    target: Target
    group: dist.ProcessGroup | None
    board: Board | None


@attrs.frozen
class Taken:
    """A group a recovery takes into the new world: its ``spec`` under the new ranks, the torch group detached
    from the old world's registry, whether it was kept or shrunk (``action``), and its sockets."""

    spec: GroupSpec
    detached: Any
    action: Action
    sockets: frozenset[Any]


def describe_group(mesh: Mesh, axes: tuple[str, ...], spec: GroupSpec) -> str:
    """A group as ranks must agree on it: the mesh, the axes, the backend, options and timeout."""
    return (f"{describe_mesh(mesh)}; axes {axes}; backend {spec.backend}; options {spec.options_key}; "
            f"timeout {spec.timeout.total_seconds():g}s")


def describe_mesh(mesh: Mesh) -> str:
    """A mesh as ranks must agree on it: its repr, universe and every axis's layout.

    >>> import fmesh; print(describe_mesh(fmesh.make_mesh((2,), ("dp",))))
    Mesh(dp=2; world=2) over Universe(world=2, 'cpu', id=3278e91e8d6ac839), layouts dp=(2,):(1,)
    """
    layouts = ";".join(f"{n}={lay.shape}:{lay.stride}" for n, lay in zip(mesh.axis_names, mesh.layouts, strict=True))
    return f"{mesh!r} over {mesh.universe!r}, layouts {layouts}"


def usable(group: dist.ProcessGroup | None, board: Board | None) -> bool:
    """Whether ``group`` (``None``: the default group) can run collectives: torch still knows it, and no failure cut
    it (:meth:`~fmesh.context.store.connections.Connections.was_cut`; a cut group that can shrink stays registered
    until a recovery shrinks it or the context aborts it)."""
    return _torch.registered(group) and not (
        group is not None and board is not None and board.connections.was_cut(group.group_name))


class GroupRegistry:
    """Targets and process groups of one Context; see the module docstring.

    >>> import fmesh
    >>> world = World.start(backend="fake", rank=1, world_size=4)
    >>> registry = GroupRegistry(world, GroupSettings.of(None, 60, backend="fake"))
    >>> target = registry.target(fmesh.make_mesh((2, 2), ("dp", "tp")), "dp")
    >>> target.ranks, registry.group(target) is registry.group(target), registry.stats()["groups_created"]
    ((1, 3), True, 1)
    >>> registry.close(), world.close()  # released a group, ended the default group
    (True, True)
    """

    def __init__(self, world: World, settings: GroupSettings, *, board: Board | None = None,
                 ascending_only: bool = False) -> None:
        self._world = world
        self._settings = settings
        self._board = board  # None on the fake backend, whose store cannot be used
        # fmesh.simulate: torch's LocalTensorMode runs collectives only over groups whose ranks ascend.
        self._ascending_only = ascending_only
        self._targets: dict[tuple[Mesh, tuple[str, ...]], Target] = {}
        # The hot path: (mesh, axes) -> its target and group, once the group exists (one dict lookup).
        self._resolved: dict[tuple[Mesh, tuple[str, ...]], Route] = {}
        self._groups: dict[GroupSpec, dist.ProcessGroup] = {}
        # BY_IDENTITY: (id(mesh), axes) -> (mesh, target, group), and id(target) -> (target, group).
        self._by_identity: dict[tuple[int, Any], tuple[Mesh, Route]] = {}
        self._by_target: dict[int, tuple[Target, dist.ProcessGroup | None]] = {}
        self._creating = threading.Lock()  # held while a group (or a split) is created: one at a time; close waits
        self._creator: tuple[int, str] | None = None  # (ident, name) of the thread creating one now
        self._splits: set[str] = set()  # split_group calls made (every rank makes the same ones)
        self._hits = 0
        self._adopted: dict[GroupSpec, Action] = {}  # groups a recovery handed over: kept or shrunk
        self._seconds = 0.0
        self._closed = False
        # (ident, name) of the thread that uses each group (None: the default group)
        self._owners: dict[GroupSpec | None, tuple[int, str]] = {}
        self._owning = threading.Lock()  # two threads claiming one group (or making its lock) at once: one wins

    # ------------------------------------------------------------- targets

    def check_open(self) -> None:
        """``ContextClosedError`` once :meth:`close` ran."""
        if self._closed:
            raise ContextClosedError("this fmesh Context is closed; create a new one (its groups were destroyed)")

    def claim(self, spec: GroupSpec | None, what: str, doing: str = "a collective") -> None:
        """Make the calling thread the one that uses ``spec``'s group (``None``: the default group), named ``what``
        in errors, if no thread is yet; ``RuntimeError`` if another thread is."""
        me = threading.get_ident()
        owner = self._owners.get(spec)
        if owner is not None and owner[0] == me:
            return
        with self._owning:
            owner = self._owners.setdefault(spec, (me, threading.current_thread().name))
        if owner[0] == me:
            return
        raise RuntimeError(
            f"{what} is used by thread {owner[1]!r}, and thread {threading.current_thread().name!r} asked for "
            f"{doing} on it: a group's collectives belong to one thread (ranks match collectives by their order on "
            "each group, so two threads would mix each other's tensors). Run this group's collectives from one "
            "thread; threads on distinct groups (other axes, or meshes) run side by side")

    def enter(self, doing: str) -> None:
        """:meth:`check_open`, and, for the default group (``doing`` names the call), :meth:`claim`."""
        self.check_open()
        self.claim(None, "the default group", doing)

    def _claimed(self, target: Target) -> None:
        """:meth:`claim` of ``target``'s group, eager only (a compiled region runs on the thread that traced it),
        at the cost of one dict lookup once it is this thread's."""
        if torch.compiler.is_compiling():
            return
        owner = self._owners.get(target.spec)
        if owner is None or owner[0] != threading.get_ident():
            self.claim(target.spec, target.label())

    def check_mesh(self, mesh: object) -> Mesh:
        """``mesh`` if it is a Mesh of this world; ``TypeError``/``ValueError`` naming it otherwise."""
        if not isinstance(mesh, Mesh):
            raise TypeError(f"expected an fmesh.Mesh, but got {type(mesh).__name__}: {mesh!r}")
        if mesh.world_size != self._world.world_size:
            raise ValueError(
                f"{mesh!r} is built for {mesh.world_size} ranks, but this context has {self._world.world_size}; "
                f"expected a mesh of this context's world: build it from ctx.world_size{self._resized(mesh)}"
            )
        return mesh

    def _resized(self, mesh: Mesh) -> str:
        """``", e.g. fmesh.make_mesh((4, 2), ('dp', 'tp')), its first axis ctx.world_size // 2"`` where the other
        axes divide this world, else nothing."""
        world, sizes = self._world.world_size, mesh.axis_sizes
        rest = 1
        for size in sizes[1:]:
            rest *= size
        if world % rest or not sizes:
            return ""
        first = f", its first axis ctx.world_size // {rest}" if len(sizes) > 1 else ""
        return f", e.g. fmesh.make_mesh({(world // rest, *sizes[1:])}, {mesh.axis_names}){first}"

    def target(self, mesh: Mesh, axes: AxesArg) -> Target:
        """This rank's group along ``axes`` of ``mesh``, checked; cached on the normalised arguments.

        ``"tp"``, ``("tp",)`` and ``["tp"]`` are one entry (``close()`` empties the cache, so a hit
        also means the registry is open).
        """
        if BY_IDENTITY and torch.compiler.is_compiling():
            return self.resolve(mesh, axes).target
        try:
            found = self._targets.get((mesh, mesh.as_axes(axes)))
        except (AttributeError, TypeError):  # not a Mesh, or unhashable: checked below
            found = None
        if found is None:  # outside the except block: a user's mistake carries no internal cache miss
            return self._new_target(mesh, axes)
        self._count_hit()
        return found

    def _count_hit(self) -> None:
        """One more cache hit, counted in eager code only: a counter written while Dynamo traces becomes a guard
        on its value, which fails on the next call (a recompile every call)."""
        if not torch.compiler.is_compiling():
            self._hits += 1

    def _new_target(self, mesh: Mesh, axes: AxesArg) -> Target:
        self.check_open()
        self.check_mesh(mesh)
        names = mesh.resolve_axes(axes)
        ranks = mesh.group(self._world.rank, names)
        if self._ascending_only:
            self._check_ascending(mesh, names)
        made = Target(mesh, names, ranks, self.spec(names, ranks), member=ranks.index(self._world.rank))
        if made.spec in self._groups:  # another mesh already made this group: shared
            self._count_hit()
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

    def resolve(self, mesh: Mesh, axes: AxesArg, claim: bool = True) -> Route:
        """:meth:`target` and :meth:`group` in one cached lookup, as a :class:`Route`: what a collective's hot path
        asks. ``claim`` as in :meth:`group`."""
        if BY_IDENTITY:
            return self._resolve_by_identity(mesh, axes, claim)
        try:  # one axis by name is the common case: skip the call that normalises the others
            found = self._resolved.get((mesh, (axes,) if axes.__class__ is str else mesh.as_axes(axes)))
        except (AttributeError, TypeError):
            found = None
        if found is None:  # outside the except block: a user's mistake carries no internal cache miss
            if torch.compiler.is_compiling():
                raise RuntimeError(_NOT_BEFORE_COMPILING.format(axes=axes, mesh=mesh))
            target = self.target(mesh, axes)
            found = self._resolved[(mesh, target.axes)] = Route(target, self.group(target, claim), self._board)
            return found
        if claim:
            self._claimed(found.target)
        self._count_hit()
        return found

    def _resolve_by_identity(self, mesh: Mesh, axes: AxesArg, claim: bool = True) -> Route:
        """:meth:`resolve` where Dynamo cannot hash a Mesh: a compiled region looks the mesh object up by its
        identity (as recorded by eager calls); eager calls record it."""
        key = (id(mesh), mesh.as_axes(axes) if isinstance(mesh, Mesh) else axes)
        known = self._by_identity.get(key)
        if known is not None and known[0] is mesh:
            if not torch.compiler.is_compiling():  # counted and checked as on the hashing path
                if claim:
                    self._claimed(known[1].target)
                self._hits += 1
            return known[1]
        if torch.compiler.is_compiling():
            raise RuntimeError(_NOT_BEFORE_COMPILING.format(axes=axes, mesh=mesh))
        target = self.target(mesh, axes)  # checks a user's mistake outside any except block; counts its hit
        route = Route(target, self.group(target, claim), self._board)
        if len(self._by_identity) >= IDENTITY_ENTRIES:
            self._by_identity.clear()
            self._by_target.clear()
        self._by_identity[key] = (mesh, route)
        self._by_target[id(target)] = (target, route.group)
        return route

    # -------------------------------------------------------------- groups

    def group(self, target: Target, claim: bool = True) -> dist.ProcessGroup | None:
        """The target's process group, created on first need; ``None`` for a group of one. ``claim``: the calling
        thread becomes the one that uses it (``False``: it only creates it, as ``ctx.materialize`` does)."""
        if target.size == 1:
            return None
        if torch.compiler.is_compiling():  # traced: the group was made in eager; its eager checks stay out
            known = self._by_target.get(id(target)) if BY_IDENTITY else (target, self._groups.get(target.spec))
            if known is None or known[1] is None:
                raise RuntimeError(_NOT_BEFORE_COMPILING.format(axes=target.axes, mesh=target.mesh))
            return known[1]
        return self.process_group(target, claim)

    def process_group(self, target: Target, claim: bool = True) -> dist.ProcessGroup:
        """The target's process group, even for a group of one (made only when asked for); ``claim`` as in
        :meth:`group`."""
        if claim:
            self._claimed(target)
        group = self._groups.get(target.spec)
        if group is not None:
            if usable(group, self._board):
                return group
            self._drop(target.spec)
            raise RankLostError(
                f"{target.label()} failed earlier on rank {self._world.rank} and was aborted then (its members are "
                "gone or broke it); this context cannot use it again: abort the context and restart, or recover "
                "onto a mesh without the lost ranks")
        with self._creation(target.label()):
            return self._create(target)

    @contextlib.contextmanager
    def _creation(self, what: str) -> Iterator[None]:
        """Hold the creation lock while ``what`` (a group, or a split) is created: one thread at a time (creation
        shares this rank's store connection, and ranks would wait for each other's groups in different orders); a
        second thread asking meanwhile is refused, saying what to do. :meth:`close` waits for a creation under way."""
        me = threading.get_ident()
        with self._owning:
            if self._creator is not None and self._creator[0] != me:
                raise RuntimeError(
                    f"thread {threading.current_thread().name!r} asked for {what}, which does not exist yet, while "
                    f"thread {self._creator[1]!r} creates another group of this context: groups are created by one "
                    "thread at a time (their creation shares this rank's store connection, and ranks would wait for "
                    "each other's in different orders). Create every group first, from one thread "
                    "(ctx.materialize(mesh) for each mesh), then run collectives on distinct groups from distinct "
                    "threads")
            self._creator = (me, threading.current_thread().name)
        try:
            with self._creating:
                self.check_open()
                yield
        finally:
            with self._owning:
                self._creator = None

    # Never traced: under torch.compile(fullgraph=False) a miss falls back to eager, whose frames Dynamo would
    # otherwise try to compile down into group creation (and crash on the process groups: not a fallback).
    @torch.compiler.disable  # type: ignore[untyped-decorator]  # (torch leaves it untyped)
    def _create(self, target: Target) -> dist.ProcessGroup:
        group = self._groups.get(target.spec)
        if group is not None:  # another thread made it meanwhile (it asked first)
            return group
        if _torch.bound_device() is not None and target.size > 1:
            raise RuntimeError(
                f"no group yet for axes {target.axes} of {target.mesh!r}: the default group is bound to a "
                "device, so creating one needs every rank; call ctx.materialize(...) on every rank before "
                "collectives"
            )
        _torch.require(_torch.GROUPS)  # on every member before they meet: each raises it, none waits for another
        started = time.perf_counter()
        if self._board is not None and target.size > 1:
            board, held = self._board, len(self._groups)
            self._failing_as_posted(lambda: board.connections.check_room(target.size, held, target.label()))
        self._agree(target.spec.digest(), target.ranks, target.describe(), target.label())
        connect_timeout = self._connect_timeout(target.spec)
        group = self._connect(target.ranks, target.label(), lambda: _torch.create_group(
            target.spec.ranks,
            f"{self._world.namespace}:{target.spec.digest()}",
            rank=self._world.rank,
            backend=target.spec.backend,
            timeout=connect_timeout,
            options=target.spec.options,
            description=f"fmesh_{'_'.join(target.axes)}",
            store=None if self._board is None else self._board.store,
        ))
        if connect_timeout != target.spec.timeout:
            _torch.set_group_timeout(group, target.spec.timeout)
        self._record(target.spec, group, started)
        return group

    def _connect_timeout(self, spec: GroupSpec) -> Any:
        # gloo's rendezvous waits for every member with the group's timeout (the collectives', 10 min by
        # default): a member that died after agreeing would be waited for that long. Connect within the
        # creation timeout instead, then give the group its own.
        if spec.backend == "gloo" and self._board is not None:
            return min(spec.timeout, self._settings.creation_timeout)
        return spec.timeout

    def _connect(self, members: tuple[int, ...], what: str, create: Callable[[], Any]) -> Any:
        """``create()`` a group the members agreed on, noting its sockets; a failure is explained (a member
        that failed meanwhile is named) and posted in its status, so peers waiting for us learn it. A
        context aborted meanwhile aborts the new group and raises ``ContextClosedError``."""
        board = self._board
        if board is None:
            return create()
        before = open_sockets()
        try:
            group = create()
        except Exception as error:
            explained = connect_failed(board, members, what, error)
            board.failed(explained)
            if explained is error:
                raise
            raise explained from error
        if group is not None:
            board.connections.note(group.group_name, open_sockets() - before)
        if board.connections.halted.is_set():
            if group is not None:
                board.connections.sever(group.group_name)
                with contextlib.suppress(Exception):
                    _torch.abort_group(group)
            board.waiter.check_halted(f"connecting {what}")
        return group

    def split(self, mesh: Mesh, axes: tuple[str, ...], mine: tuple[int, ...] | None) -> None:
        """Create the groups along ``axes`` of ``mesh`` for the whole world at once (one
        ``split_group``): every rank calls this, for the same meshes, in the same order. ``mine`` is
        this rank's group (``None`` if the mesh does not cover it); it is recorded like any other."""
        with self._creation(f"the split of axes {axes} of {mesh!r}"):
            spec = self.spec(axes, mine or ())
            if mine is not None and spec in self._groups:
                return
            description = f"split of {describe_group(mesh, axes, spec)}"
            if digest(description) in self._splits:
                return
            self._splits.add(digest(description))
            started = time.perf_counter()
            world = tuple(range(self._world.world_size))
            what = f"the split of axes {axes} of {mesh!r}"
            self._agree(digest(description), world, description, what)
            group = self._connect(world, what, lambda: _torch.split_groups(
                mesh.groups(axes), rank=self._world.rank, timeout=spec.timeout, options=spec.options))
            if group is not None and mine is not None and len(mine) > 1:
                self._record(spec, group, started)

    def _agree(self, key: str, members: tuple[int, ...], description: str, what: str) -> None:
        if self._board is not None and len(members) > 1:
            agree(self._board, key, members, description, what)

    def _failing_as_posted(self, step: Callable[[], Any]) -> Any:
        """``step()``; a failure is posted in its status first, so peers waiting for us learn it."""
        try:
            return step()
        except Exception as error:
            if self._board is not None:
                self._board.failed(error)
            raise

    def _record(self, spec: GroupSpec, group: dist.ProcessGroup, started: float) -> None:
        self._groups[spec] = group
        self._seconds += time.perf_counter() - started

    def spec(self, axes: tuple[str, ...], ranks: tuple[int, ...]) -> GroupSpec:
        """The spec of a group of ``ranks`` along ``axes`` under this registry's settings."""
        return self._settings.spec(axes, ranks)

    def exists(self, target: Target) -> bool:
        """Whether the target needs no group (a group of one) or has one already."""
        return target.size == 1 or target.spec in self._groups

    # ------------------------------------------------------------- recovery

    def held(self) -> dict[GroupSpec, dist.ProcessGroup]:
        """The groups made here that torch still knows (not aborted after a failure)."""
        return {spec: group for spec, group in self._groups.items() if _torch.registered(group)}

    def held_groups(self) -> list[HeldGroup]:
        """The groups :meth:`held`, as a recovery's agreement counts and cuts them (digest, members, torch name)."""
        return [HeldGroup(spec.digest(), spec.ranks, group.group_name) for spec, group in self.held().items()]

    def cut_broken(self, lost: Iterable[int]) -> None:
        """Cut the connections of every group that lost a member, so a survivor still blocked in one (a collective
        fmesh did not run, FSDP's say, fails with the backend's error and no roll call) is released now."""
        gone = set(lost)
        if self._board is not None:
            for spec, group in self.held().items():
                if gone.intersection(spec.ranks):
                    self._board.connections.sever(group.group_name)

    def take_renewed(self, renumber: Mapping[int, int], holders: Mapping[str, int],
                     survivors: Container[int]) -> tuple[Taken, ...]:
        """The groups that go on into the new world (old rank -> new rank: ``renumber``), kept or shrunk by the
        planner's one rule (:func:`fmesh.plan.communicators.renewals`), detached from torch and renumbered;
        ``holders`` (how many of the ``survivors`` hold each group, by digest) says whether every surviving member
        can keep one."""
        if self._world.rank not in renumber:  # this rank leaves: it takes nothing, and never calls a shrink (torch
            return ()                         # refuses one from an excluded member; the others shrink without it)
        held = self.held()
        specs = sorted(held, key=lambda s: (len(s.ranks), s.digest()))  # one order on every rank; smallest first
        choices = renewals([spec.ranks for spec in specs], renumber,
                           shrinkable=[_torch.can_shrink(spec.backend) for spec in specs],
                           held_everywhere=[holders.get(spec.digest(), 0) == sum(m in survivors for m in spec.ranks)
                                            for spec in specs])
        taken = []
        for spec, action in zip(specs, choices, strict=True):
            group, members = held[spec], spec.ranks
            if action == CREATE:
                continue
            if action == SHRINK:  # the members that do not go on, lost or dropped by the new world, are excluded
                group = _torch.shrink_group(group, [i for i, r in enumerate(spec.ranks) if r not in renumber])
                members = tuple(r for r in spec.ranks if r in renumber)
            sockets = frozenset() if self._board is None else self._board.connections.take(group.group_name)
            taken.append(Taken(attrs.evolve(spec, ranks=tuple(renumber[m] for m in members)),
                               _torch.detach_group(group), action, sockets))
        return tuple(taken)

    def adopt_all(self, taken: Iterable[Taken]) -> None:
        """Hold the groups a recovery took (:meth:`take_renewed`), attached again under their new ranks."""
        for one in taken:
            self.adopt(one.spec, _torch.attach_group(one.detached, one.spec.ranks), one.action, one.sockets)

    def hand_over(self) -> None:
        """Close this registry without ending its groups: a recovery took the ones it keeps and aborts the
        rest (all at once); forgets every group, as :meth:`close` does, and the status board (its store connection
        goes with the recovery that took the groups)."""
        self._end(lambda group: None)
        self._board = None

    def adopt(self, spec: GroupSpec, group: dist.ProcessGroup, action: Action,
              sockets: frozenset[Any] = frozenset()) -> None:
        """Hold ``group`` (``action``: kept or shrunk by a recovery) as the group of ``spec``, with its ``sockets``."""
        self._groups[spec] = group
        self._adopted[spec] = action
        if self._board is not None:
            self._board.connections.note(group.group_name, sockets)

    # ------------------------------------------------------------ lifecycle

    def stats(self) -> dict[str, Any]:
        """Groups created, kept and shrunk (handed over by a recovery), cache hits, targets seen, seconds spent
        creating groups, and the groups."""
        adopted = [self._adopted[spec] for spec in self._groups if spec in self._adopted]
        return {
            "groups_created": len(self._groups) - len(adopted),
            "groups_kept": adopted.count("keep"),
            "groups_shrunk": adopted.count("shrink"),
            "cache_hits": self._hits,
            "meshes_seen": len(self._targets),
            "creation_seconds": round(self._seconds, 6),
            "groups": [(spec.ranks, spec.backend) for spec in self._groups],
        }

    def close(self) -> bool:
        """Destroy every group made here, and drop every reference to them now, while the interpreter is
        alive (a gloo group whose last reference dies during interpreter shutdown takes the process down
        with "terminate called without an active exception"). Afterwards every question raises
        ``ContextClosedError``. Whether any group was released (then the caller collects garbage once:
        a gloo group's worker threads end when the C++ object does)."""
        return self._end(_torch.destroy_group)

    def abort(self) -> bool:
        """Tear every group made here down at once, without waiting for peers or for any lock (a rank died,
        this one failed, a signal handler or a watchdog thread stops the job).

        Every wait of the context ends at its next poll; every group's connections are cut, so a collective
        this rank is blocked in fails now and the peers blocked with it fail too; then torch aborts each.
        Whether any group was released, as :meth:`close`."""
        self.halt()
        if self._closed:
            return False
        self._closed = True
        return self._forget_all(_torch.abort_group)

    def halt(self) -> None:
        """The first, instant part of :meth:`abort`: end every wait of the context at its next poll, and cut
        every group's connections (the collectives blocked in them fail now, here and on the peers)."""
        if self._board is not None:
            self._board.connections.halted.set()
            self._board.connections.sever_all()

    def _drop(self, spec: GroupSpec) -> None:
        """Forget the group of ``spec`` (torch aborted it after a failure) and every target resolved to it."""
        self._groups.pop(spec, None)
        for key, route in list(self._resolved.items()):
            if route.target.spec == spec:
                del self._resolved[key]
        for identity, (_, route) in list(self._by_identity.items()):
            if route.target.spec == spec:
                del self._by_identity[identity]
                self._by_target.pop(id(route.target), None)

    def _end(self, end_group: Any) -> bool:
        with self._owning:
            if self._closed:
                return False
            self._closed = True  # no creation starts now: each checks, under the creation lock, that this is open
        with self._creating:  # a creation under way finishes (or fails) first, and its group is ended too
            pass
        return self._forget_all(end_group)

    def _forget_all(self, end_group: Any) -> bool:
        groups = list(self._groups.values())
        self._groups.clear()
        self._targets.clear()
        self._resolved.clear()
        self._by_identity.clear()
        self._by_target.clear()
        if dist.is_initialized():
            for group in groups:
                # Aborted already (after a failed collective: ValueError), or the backend's abort failed: the
                # groups left must still end, and the context still close. One a failure cut is aborted, never
                # destroyed: the orderly way would wait for its broken members.
                orderly = end_group is _torch.destroy_group
                ending = _torch.abort_group if orderly and not usable(group, self._board) else end_group
                with contextlib.suppress(ValueError if ending is _torch.destroy_group else Exception):
                    ending(group)
                if self._board is not None:
                    self._board.connections.forget(group.group_name)
        released = bool(groups)
        del groups
        return released

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def __len__(self) -> int:
        return len(self._groups)
