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

The registry owns the groups; its rooms do the rest: which thread uses each group and which creates one now
(:mod:`fmesh.context.threads`), how a group is created (:mod:`fmesh.context.creation`), which meshes a context
takes (:func:`check_mesh`), and what a recovery does with the groups held (:mod:`fmesh.context.renewal`).

Rules for group creation (what every rank must do):

* Only the members of a group take part in creating it, and each group's rendezvous is named
  after its content, so different groups may be created in any order on different ranks.
* Members of one group create it in the same program order relative to their other groups along
  the same axis names (the usual SPMD order). Before creating it they compare what they mean by
  it, so a mesh that differs between ranks raises :class:`~fmesh.MeshMismatchError` on the members
  instead of hanging, and a member that never comes raises :class:`~fmesh.GroupTimeoutError` after
  the timeout, naming the axes and the missing ranks.
* If the default group is bound to a device (``init_process_group(device_id=...)``, eager NCCL),
  a new communicator is split from it and every rank must take part: call
  :meth:`Context.materialize` on every rank, in the same order, before the first collective.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.creation import GroupMaker
from fmesh.context.options import GroupSettings, GroupSpec
from fmesh.context.renewal import Taken
from fmesh.context.store.board import Board
from fmesh.context.store.keys import digest
from fmesh.context.threads import GroupThreads
from fmesh.context.world import World
from fmesh.errors import ContextClosedError, RankLostError
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg
from fmesh.plan.communicators import Action

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


def check_mesh(mesh: object, world_size: int) -> Mesh:
    """``mesh`` if it is a Mesh of a world of ``world_size``; ``TypeError``/``ValueError`` naming it otherwise.

    >>> import fmesh
    >>> check_mesh(fmesh.make_mesh((2, 4), ("dp", "tp")), 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Mesh(dp=2, tp=4; world=8) is built for 8 ranks, but this context has 4; expected a mesh of ...
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected an fmesh.Mesh, but got {type(mesh).__name__}: {mesh!r}")
    if mesh.world_size != world_size:
        raise ValueError(
            f"{mesh!r} is built for {mesh.world_size} ranks, but this context has {world_size}; "
            f"expected a mesh of this context's world: build it from ctx.world_size{_resized(mesh, world_size)}"
        )
    return mesh


def _resized(mesh: Mesh, world: int) -> str:
    """``", e.g. fmesh.make_mesh((4, 2), ('dp', 'tp')), its first axis ctx.world_size // 2"`` where the other
    axes divide ``world``, else nothing."""
    sizes = mesh.axis_sizes
    rest = 1
    for size in sizes[1:]:
        rest *= size
    if world % rest or not sizes:
        return ""
    first = f", its first axis ctx.world_size // {rest}" if len(sizes) > 1 else ""
    return f", e.g. fmesh.make_mesh({(world // rest, *sizes[1:])}, {mesh.axis_names}){first}"


def check_ascending(mesh: Mesh, names: tuple[str, ...]) -> None:
    """``ValueError`` unless every group along ``names`` of ``mesh`` has ascending ranks (what ``simulate()``, on
    torch's LocalTensorMode, can run collectives over)."""
    unsorted = next((g for g in mesh.groups(names) if list(g) != sorted(g)), None)
    if unsorted is not None:
        raise ValueError(
            f"simulate() can only run collectives over groups whose ranks ascend, but the group "
            f"{list(unsorted)} along axes {names} of {mesh!r} does not (a permuted rank map or a "
            "reversed axis order); run this mesh on real processes with fmesh.launch(...)"
        )


def _never_traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)`` without importing Dynamo (half a CPU-second in every process) before something
    else does (``torch.compile`` does): until then nothing traces, and ``fn`` runs as it is."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        disabled[:] = disabled or [torch.compiler.disable(fn)]
        return disabled[0](*args, **kwargs)

    return call


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
        self._threads = GroupThreads()  # which thread uses each group, and which creates one now
        self._maker = GroupMaker(world, settings, board)
        self._splits: set[str] = set()  # split_group calls made (every rank makes the same ones)
        # The group layouts (Target.describe) the ranks agreed on at once (a meeting, or the start): their groups are
        # created without meeting again. How many meetings this rank held with each set of participants, by digest.
        self._agreed: set[str] = set()
        self._meetings: dict[str, int] = {}
        self._hits = 0
        self._adopted: dict[GroupSpec, Action] = {}  # groups a recovery handed over: kept or shrunk
        self._seconds = 0.0
        self._closed = False

    # ------------------------------------------------------------- targets

    def check_open(self) -> None:
        """``ContextClosedError`` once :meth:`close` ran."""
        if self._closed:
            raise ContextClosedError("this fmesh Context is closed; create a new one (its groups were destroyed)")

    def claim(self, spec: GroupSpec | None, what: str, doing: str = "a collective") -> None:
        """Make the calling thread the one that uses ``spec``'s group (:meth:`GroupThreads.claim`)."""
        self._threads.claim(spec, what, doing)

    def enter(self, doing: str) -> None:
        """:meth:`check_open`, and, for the default group (``doing`` names the call), :meth:`claim`."""
        self.check_open()
        self.claim(None, "the default group", doing)

    def check_mesh(self, mesh: object) -> Mesh:
        """``mesh`` if it is a Mesh of this world (:func:`check_mesh`)."""
        return check_mesh(mesh, self._world.world_size)

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
            check_ascending(mesh, names)
        made = Target(mesh, names, ranks, self.spec(names, ranks), member=ranks.index(self._world.rank))
        if made.spec in self._groups:  # another mesh already made this group: shared
            self._count_hit()
        self._targets[(mesh, names)] = made
        return made

    def resolve(self, mesh: Mesh, axes: AxesArg, claim: bool = True) -> Route:
        """:meth:`target` and :meth:`group` in one cached lookup, as a :class:`Route`: what a collective's hot path
        asks. ``claim`` as in :meth:`group`."""
        if BY_IDENTITY:
            return self._resolve_by_identity(mesh, axes, claim)
        try:  # one axis by name is the common case: skip the call that normalises the others
            found = self._resolved.get((mesh, (axes,) if axes.__class__ is str else mesh.as_axes(axes)))
        except (AttributeError, TypeError):
            found = None
        compiling = torch.compiler.is_compiling()
        if found is None:  # outside the except block: a user's mistake carries no internal cache miss
            if compiling:
                raise RuntimeError(_NOT_BEFORE_COMPILING.format(axes=axes, mesh=mesh))
            target = self.target(mesh, axes)
            found = self._resolved[(mesh, target.axes)] = Route(target, self.group(target, claim), self._board)
            return found
        if not compiling:  # the hot path: one test for the claim and the count
            if claim:
                self._threads.claimed(found.target.spec, found.target.label)
            self._hits += 1
        return found

    def _resolve_by_identity(self, mesh: Mesh, axes: AxesArg, claim: bool = True) -> Route:
        """:meth:`resolve` where Dynamo cannot hash a Mesh: a compiled region looks the mesh object up by its
        identity (as recorded by eager calls); eager calls record it."""
        key = (id(mesh), mesh.as_axes(axes) if isinstance(mesh, Mesh) else axes)
        known = self._by_identity.get(key)
        if known is not None and known[0] is mesh:
            if not torch.compiler.is_compiling():  # counted and checked as on the hashing path
                if claim:
                    self._threads.claimed(known[1].target.spec, known[1].target.label)
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
        if claim and not torch.compiler.is_compiling():
            self._threads.claimed(target.spec, target.label)
        group = self._groups.get(target.spec)
        if group is not None:
            if usable(group, self._board):
                return group
            self._drop(target.spec)
            raise RankLostError(
                f"{target.label()} failed earlier on rank {self._world.rank} and was aborted then (its members are "
                "gone or broke it); this context cannot use it again: abort the context and restart, or recover "
                "onto a mesh without the lost ranks")
        with self._threads.creating(target.label(), self.check_open):
            return self._create(target)

    # Never traced: under torch.compile(fullgraph=False) a miss falls back to eager, whose frames Dynamo would
    # otherwise try to compile down into group creation (and crash on the process groups: not a fallback).
    @_never_traced
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
        started = time.perf_counter()
        description = target.describe()
        group = self._maker.create(target.spec, target.axes, target.label(), description, len(self._groups),
                                   agreed=description in self._agreed)
        self._record(target.spec, group, started)
        return group

    def split(self, mesh: Mesh, axes: tuple[str, ...], mine: tuple[int, ...] | None) -> None:
        """Create the groups along ``axes`` of ``mesh`` for the whole world at once (one
        ``split_group``): every rank calls this, for the same meshes, in the same order. ``mine`` is
        this rank's group (``None`` if the mesh does not cover it); it is recorded like any other."""
        with self._threads.creating(f"the split of axes {axes} of {mesh!r}", self.check_open):
            spec = self.spec(axes, mine or ())
            if mine is not None and spec in self._groups:
                return
            description = f"split of {describe_group(mesh, axes, spec)}"
            if digest(description) in self._splits:
                return
            self._splits.add(digest(description))
            started = time.perf_counter()
            group = self._maker.split(mesh, axes, spec, description)
            if group is not None and mine is not None and len(mine) > 1:
                self._record(spec, group, started)

    def _record(self, spec: GroupSpec, group: dist.ProcessGroup, started: float) -> None:
        self._groups[spec] = group
        self._seconds += time.perf_counter() - started

    def meet(self, layouts: tuple[str, ...], participants: tuple[int, ...], description: str, what: str) -> None:
        """One meeting of the ``participants`` on every group layout of ``layouts`` (their ``description``,
        ``what`` in errors), unless they agreed on all of them already: every rank the layouts' meshes cover calls
        this alike, and afterwards their groups are created without meeting again. A mismatch is
        :class:`~fmesh.MeshMismatchError` naming both ranks' descriptions; a participant that never comes,
        :class:`~fmesh.GroupTimeoutError` naming it."""
        if self._board is None or self._world.rank not in participants or self._agreed.issuperset(layouts):
            return
        with self._threads.creating(what, self.check_open):
            who = digest(repr(participants))
            count = self._meetings[who] = self._meetings.get(who, 0) + 1  # the n-th with these ranks, on each
            self._maker.agree(f"meeting-{who}-{count}", participants, description, what)
            self._agreed.update(layouts)

    def agreed(self, layouts: tuple[str, ...]) -> None:
        """The ranks agreed on ``layouts`` as they started (the start's meeting carried them): no meeting now."""
        self._agreed.update(layouts)

    @property
    def settings(self) -> GroupSettings:
        """The settings the groups are made with (the world's backend included)."""
        return self._settings

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
        with self._threads.lock:
            if self._closed:
                return False
            self._closed = True  # no creation starts now: each checks, under the creation lock, that this is open
        self._threads.settled()  # a creation under way finishes (or fails) first, and its group is ended too
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
