"""After a loss: which communicators of the smaller job are kept, shrunk or created, and which shard each rank
loads, as a pure plan made before anything is torn down.

:func:`plan_recovery` compares the meshes of a job before a loss with those after it (the meshes that
:func:`fmesh.without` or :func:`fmesh.plan.rescale.scale_down` made, whose universe's :class:`~fmesh.mesh.Lineage` maps
each new rank to its old one). It takes each distinct communicator of the new job (as
:func:`fmesh.plan.communicators.plan_communicators` lists them; groups of one rank need none) and reads its groups
in the old numbering:

* **keep**: every group is a group of one old communicator, with the same members in the same order. No member
  was lost, so the old communicator can be used as it is;
* **shrink**: every group is the members that remain of a group of one old communicator, in the old order, and
  some groups lost members. A backend that can shrink a communicator
  (:func:`~fmesh.plan.communicators.can_shrink`) makes it from the old one;
* **create**: anything else, and a shrink where the backend cannot shrink. The communicator is made anew.

The old communicators that no new one keeps or shrinks are **dropped**: they are aborted.

:func:`recover_job` does this for a :class:`~fmesh.ParallelDims` job and a set of lost ranks (through
:func:`fmesh.plan.rescale.scale_down`), and adds the data that moves (:class:`Resharding`).
:func:`recover_manifests` does it for two manifests, which carry no lineage.

>>> import fmesh
>>> mesh = fmesh.make_mesh((4, 2), ("dp", "tp"))
>>> plan = plan_recovery([mesh], [fmesh.without(mesh, [3], "dp")], shrink_groups=True)
>>> [(c.names, c.action) for c in plan.communicators], plan.counts
([(('dp',), 'shrink'), (('tp',), 'keep')], {'keep': 1, 'shrink': 1, 'create': 0, 'dropped': 0})
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import attrs

from fmesh.layout.int_tuple import is_int, is_many
from fmesh.mesh import Universe, new_rank, old_rank
from fmesh.plan.communicators import (
    ACTIONS,
    CREATE,
    SHRINK,
    Request,
    plan_communicators,
    renewal,
    requests_of,
)
from fmesh.plan.jobs import job, job_degrees, job_requests
from fmesh.plan.manifest import Manifest
from fmesh.plan.parallel import DEGREE_NAMES, ParallelDims
from fmesh.plan.rescale import ELASTIC_AXES, scale_down

__all__ = ["JobRecovery", "OldCommunicator", "RecoveredCommunicator", "RecoveryPlan", "Resharding", "ShardLoad",
           "ShardPiece",
           "plan_recovery", "recover_job", "recover_manifests"]

@attrs.frozen
class OldCommunicator:
    """A communicator of the job before the loss: its place in that job's creation order, the names that use it,
    its group size, its number of groups, and the request that made it (a mesh of the old job and its axes)."""

    order: int
    names: tuple[str, ...]
    size: int
    num_groups: int
    request: Request = attrs.field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """The communicator as ``--json`` prints it."""
        return {"order": self.order, "names": list(self.names), "size": self.size, "num_groups": self.num_groups}


@attrs.frozen
class RecoveredCommunicator:
    """A communicator of the new job and what it takes (keep, shrink or create:
    :func:`~fmesh.plan.communicators.renewal`). ``source`` is the old communicator it keeps, or whose remaining
    members its groups are (for a shrink, and for a create where the backend cannot shrink); ``None`` where its
    groups are new. ``groups_shrunk`` counts its groups that lost members; ``request`` is the first that asks for
    it (a mesh of the new job and its axes)."""

    order: int
    names: tuple[str, ...]
    size: int
    num_groups: int
    action: str
    source: OldCommunicator | None
    groups_shrunk: int
    request: Request = attrs.field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """The communicator as ``--json`` prints it."""
        return {"order": self.order, "names": list(self.names), "size": self.size, "num_groups": self.num_groups,
                "action": self.action, "source": None if self.source is None else self.source.order,
                "groups_shrunk": self.groups_shrunk}


@attrs.frozen
class RecoveryPlan:
    """What :func:`plan_recovery` answers: every communicator of the new job in creation order with its action,
    the old ones dropped, and the names whose groups are single ranks (no communicator).

    >>> RecoveryPlan((8, 4), False, (), (), ()).counts
    {'keep': 0, 'shrink': 0, 'create': 0, 'dropped': 0}
    """

    world_size: tuple[int, int]  # before, after
    shrink_groups: bool  # whether the backend can shrink a communicator
    communicators: tuple[RecoveredCommunicator, ...]
    dropped: tuple[OldCommunicator, ...]
    trivial: tuple[str, ...]

    @property
    def counts(self) -> dict[str, int]:
        """How many communicators each action takes, and how many old ones are dropped."""
        found: dict[str, int] = {action: sum(c.action == action for c in self.communicators) for action in ACTIONS}
        return {**found, "dropped": len(self.dropped)}

    def to_exclude(self, communicator: RecoveredCommunicator, rank: int) -> tuple[int, ...]:
        """What new ``rank`` passes to ``torch.distributed.shrink_group`` as ``ranks_to_exclude`` for
        ``communicator`` (a shrink): the positions, in its group of the old communicator, of the members no longer
        in the job. ``()`` where that group lost none: it is kept as it is.

        >>> import fmesh
        >>> mesh = fmesh.make_mesh((4, 2), ("dp", "tp"))
        >>> plan = plan_recovery([mesh], [fmesh.without(mesh, [3], "dp")], shrink_groups=True)
        >>> plan.to_exclude(plan.communicators[0], 0)  # old rank 0's dp group (0, 2, 4, 6) lost rank 2
        (1,)
        """
        source = communicator.source
        if communicator.action != SHRINK or source is None:
            raise ValueError(f"to_exclude answers for a communicator to shrink, but {communicator.names} is to "
                             f"{communicator.action}")
        after, before = communicator.request.mesh.universe, source.request.mesh.universe
        old = _old_ranks(after, before, [rank])[0]
        if old is None:  # not for a plan's own communicators: every group with a source is made of old ranks
            raise ValueError(f"rank {rank} joined after the loss, so it has no old group to shrink")
        group = source.request.mesh.group(old, source.request.axes)
        chain = _chain(after, before)
        return tuple(i for i, member in enumerate(group) if _new_rank(chain, member) is None)

    def to_json(self) -> dict[str, Any]:
        """The plan as ``--json`` prints it."""
        return {"world_size": list(self.world_size), "shrink_groups": self.shrink_groups, "counts": self.counts,
                "communicators": [c.to_json() for c in self.communicators],
                "dropped": [c.to_json() for c in self.dropped], "trivial": list(self.trivial)}


def plan_recovery(before: Iterable[object], after: Iterable[object], *, shrink_groups: bool = False) -> RecoveryPlan:
    """The recovery plan from the meshes ``before`` a loss to those ``after`` it (module docstring). Each side is
    meshes (every axis, one by one) and ``(mesh, axes)`` pairs over one universe; the universe after must descend
    from the one before through :func:`fmesh.without`/:func:`fmesh.resize` (a rank that joined is in no old
    group, so its groups are created). ``shrink_groups``: whether the backend can shrink a communicator
    (:func:`~fmesh.plan.communicators.can_shrink`).

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    >>> plan = plan_recovery([mesh], [fmesh.without(mesh, [5], "dp")])
    >>> [(c.names, c.action, c.source) for c in plan.communicators], [c.names for c in plan.dropped], plan.trivial
    ([(('tp',), 'keep', OldCommunicator(order=1, names=('tp',), size=4, num_groups=2))], [('dp',)], ('dp',))
    """
    return _plan(requests_of(before, "plan_recovery"), requests_of(after, "plan_recovery"), shrink_groups)


def _one_universe(requests: Sequence[Request], side: str) -> Universe:
    if not requests:
        raise ValueError(f"plan_recovery needs at least one mesh {side} the loss, got none")
    universe = requests[0].mesh.universe
    for request in requests:
        if request.mesh.universe.id != universe.id:
            raise ValueError(f"the meshes {side} the loss must share one universe, but {request.mesh!r} is over "
                             f"{request.mesh.universe!r} and {requests[0].mesh!r} over {universe!r}")
    return universe


def _chain(after: Universe, before: Universe) -> list[Universe]:
    """The universes from ``after`` up to (not including) ``before``, each made from the next by one change."""
    chain = []
    universe = after
    while universe is not before and universe.lineage is not None and universe.id != before.id:
        chain.append(universe)
        universe = universe.lineage.parent
    if universe.id != before.id:
        raise ValueError(f"the universe after the loss ({after!r}) does not descend from the one before it "
                         f"({before!r}): make the meshes after with fmesh.without, fmesh.resize or "
                         "fmesh.plan.rescale.scale_down from the meshes before")
    return chain


def _old_ranks(after: Universe, before: Universe, ranks: Iterable[int] | None = None) -> list[int | None]:
    """Ranks of ``after`` (default: all) in the numbering of ``before`` (``None``: joined), through the lineages."""
    found: list[int | None] = list(range(after.world_size) if ranks is None else ranks)
    for step in _chain(after, before):
        found = [None if r is None else old_rank(step, r) for r in found]
    return found


def _new_rank(chain: Sequence[Universe], rank: int) -> int | None:
    """Old ``rank`` in the numbering at the start of ``chain`` (``None``: it is no longer in the job)."""
    found: int | None = rank
    for step in reversed(chain):
        found = None if found is None else new_rank(step, found)
    return found


def _match(request: Request, groups: Sequence[tuple[int | None, ...]], alive: bytearray
           ) -> tuple[int, tuple[int, ...]] | None:
    """How many of ``groups`` (old numbering) lost members, if each is the remaining members of its old group along
    ``request`` in the old order, and one old group that lost members (else the first); ``None`` if one is not."""
    mesh, axes = request.mesh, request.axes
    shrunk, example = 0, None
    for group in groups:
        first = group[0]
        if first is None or mesh.coordinate(first) is None:
            return None
        old = mesh.group(first, axes)
        if old == group:
            example = example or old
            continue
        if tuple(r for r in old if alive[r]) != group:
            return None
        shrunk, example = shrunk + 1, old if shrunk == 0 else example
    return None if example is None else (shrunk, example)


@attrs.frozen
class _Alive:
    """The old ranks that go on, as marks indexed by old rank (a set would cost memory at a million ranks)."""

    marks: bytearray

    def __contains__(self, rank: object) -> bool:
        return is_int(rank) and bool(self.marks[rank])


def _plan(before: Sequence[Request], after: Sequence[Request], can: bool) -> RecoveryPlan:
    old_universe, new_universe = _one_universe(before, "before"), _one_universe(after, "after")
    to_old = _old_ranks(new_universe, old_universe)
    alive = bytearray(old_universe.world_size)
    for rank in to_old:
        if rank is not None:
            alive[rank] = 1
    old_plan, new_plan = plan_communicators(before), plan_communicators(after)
    old = [OldCommunicator(order, tuple(r.label for r in c.requests), c.size, c.num_groups, c.first)
           for order, c in enumerate(c for c in old_plan.communicators if c.size > 1)]
    used: set[int] = set()
    found = []
    for order, communicator in enumerate(c for c in new_plan.communicators if c.size > 1):
        first = communicator.first
        groups = [tuple(to_old[r] for r in group) for group in first.mesh.groups(first.axes)]
        action, source, shrunk = CREATE, None, 0
        # The smallest old communicator first (one of the same size can only be kept, so a keep wins over a shrink),
        # as Context.recover chooses among the groups it holds (fmesh.plan.communicators.renewals).
        for candidate in sorted(old, key=lambda found: found.size):
            if candidate.size < communicator.size:
                continue
            matched = _match(candidate.request, groups[:1], alive)  # the first group rules out most at once
            matched = None if matched is None else _match(candidate.request, groups, alive)
            if matched is not None:
                source, (shrunk, example) = candidate, matched
                action = renewal(example, _Alive(alive), shrinkable=can)  # the rule Context.recover runs by
                break
        if action != CREATE and source is not None:
            used.add(source.order)
        found.append(RecoveredCommunicator(order, tuple(r.label for r in communicator.requests), communicator.size,
                                           len(groups), action, source, shrunk, first))
    trivial = tuple(r.label for c in new_plan.communicators if c.size == 1 for r in c.requests)
    return RecoveryPlan((old_universe.world_size, new_universe.world_size), can, tuple(found),
                        tuple(c for c in old if c.order not in used), trivial)


# ------------------------------------------------------------------------------------------ the data that moves


@attrs.frozen
class ShardPiece:
    """The part ``[start, stop)`` (fractions of its length) of old shard ``old_shard`` that a new shard holds."""

    old_shard: int
    start: Fraction
    stop: Fraction

    def __str__(self) -> str:
        whole = self.start == 0 and self.stop == 1
        return f"{self.old_shard}" + ("" if whole else f" [{self.start}, {self.stop})")


@attrs.frozen
class Resharding:
    """The data-parallel shards of a job's state before and after a loss. The state of each pipeline stage and
    tensor-parallel part is split evenly over the fsdp mesh (``dp_shard x cp``: ``old_shards`` before,
    ``new_shards`` after), so new shard ``j`` covers ``[j/new, (j+1)/new)`` of it, and ``pieces[j]`` says which
    parts of which old shards those are.

    >>> [", ".join(map(str, p)) for p in Resharding.even(4, 3).pieces]
    ['0, 1 [0, 1/3)', '1 [1/3, 1), 2 [0, 2/3)', '2 [2/3, 1), 3']
    """

    old_shards: int
    new_shards: int
    pieces: tuple[tuple[ShardPiece, ...], ...]

    @classmethod
    def even(cls, old_shards: int, new_shards: int) -> Resharding:
        """Shards of even length before (``old_shards``) and after (``new_shards``)."""
        for count in (old_shards, new_shards):
            if not is_int(count) or count < 1:
                raise ValueError(f"expected shard counts as positive ints, but got {old_shards!r} -> {new_shards!r}")
        pieces = []
        for j in range(new_shards):
            low, high = Fraction(j, new_shards), Fraction(j + 1, new_shards)
            found = []
            for k in range(math.floor(low * old_shards), math.ceil(high * old_shards)):
                start, stop = max(low, Fraction(k, old_shards)), min(high, Fraction(k + 1, old_shards))
                if start < stop:
                    found.append(ShardPiece(k, (start - Fraction(k, old_shards)) * old_shards,
                                            (stop - Fraction(k, old_shards)) * old_shards))
            pieces.append(tuple(found))
        return cls(old_shards, new_shards, tuple(pieces))

    @property
    def identity(self) -> bool:
        """Whether each new shard is the whole old shard of the same index (the same number of shards).

        >>> Resharding.even(4, 4).identity, Resharding.even(4, 2).identity
        (True, False)
        """
        return self.old_shards == self.new_shards

    def to_json(self) -> dict[str, Any]:
        """The resharding as ``--json`` prints it (fractions as ``"1/3"``)."""
        return {"old_shards": self.old_shards, "new_shards": self.new_shards,
                "pieces": [[{"old_shard": p.old_shard, "start": str(p.start), "stop": str(p.stop)} for p in shard]
                           for shard in self.pieces]}


@attrs.frozen
class ShardLoad:
    """What new rank ``rank`` (old rank ``old_rank``, which held old shard ``old_shard``) loads: new shard
    ``shard``, made of ``pieces``; ``holders[i]`` are the old ranks that held piece ``i``'s old shard at this rank's
    pipeline stage and tensor-parallel part (one per replica), ascending."""

    rank: int
    old_rank: int
    old_shard: int
    shard: int
    pieces: tuple[ShardPiece, ...]
    holders: tuple[tuple[int, ...], ...]

    @property
    def moves(self) -> bool:
        """Whether the rank needs data it did not hold: anything but the whole of its own old shard."""
        return self.pieces != (ShardPiece(self.old_shard, Fraction(0), Fraction(1)),)


def _stages(count: int) -> str:
    return f"{count} stage" + ("s" if count > 1 else "")


_WHY = {
    "dp_replicate": "dropping a replica loses no state: every other replica holds a full copy of the sharded "
                    "model and optimizer, and the replicas that remain keep their shards",
    "dp_shard": "the parameters and optimizer state are resharded over fewer ranks",
    "pp": "the model's layers are re-split over fewer stages",
}


@attrs.frozen
class JobRecovery:
    """What :func:`recover_job` answers: the job ``before`` and ``after`` the loss of ``lost``, the ``axis`` that
    absorbed it and ``reason`` (why that one), the communicator plan, and the ``resharding`` of the data-parallel
    shards (``None`` when ``pp`` absorbed the loss: the layers move, not shards)."""

    before: ParallelDims
    after: ParallelDims
    lost: tuple[int, ...]
    axis: str
    reason: str
    plan: RecoveryPlan
    resharding: Resharding | None

    def load(self, rank: int) -> ShardLoad:
        """What new ``rank`` loads (layout arithmetic: nothing is listed per rank).

        >>> import fmesh
        >>> job = recover_job(fmesh.ParallelDims(8, dp_shard=4, tp=2), [2])
        >>> load = job.load(0)
        >>> load.old_rank, load.shard, [str(p) for p in load.pieces], load.holders, load.moves
        (0, 0, ['0', '1 [0, 1/3)'], ((0,), (2,)), True)
        """
        if self.resharding is None:
            raise ValueError(f"pp absorbed the loss of {list(self.lost)}: the layers are re-split over "
                             f"{_stages(self.after.pp)}, so ranks load layers from a checkpoint, not shards")
        self.after.world_mesh.universe.check_rank(rank)
        old = old_rank(self.after.world_mesh, rank)
        if old is None:  # not after a shrink, which adds no rank
            raise ValueError(f"rank {rank} joined after the loss, so it held no shard")
        fsdp_before, fsdp_after = self.before.mesh("dp_shard_cp"), self.after.mesh("dp_shard_cp")
        shard = (fsdp_after.coordinate(rank) or (0,))[0]
        own = (fsdp_before.coordinate(old) or (0,))[0]
        mine = fsdp_before.group(old)  # my stage and part, every old shard, in shard order
        world = self.before.world_mesh
        pieces = self.resharding.pieces[shard]
        holders = tuple(tuple(sorted(world.group(mine[p.old_shard], "dp_replicate"))) for p in pieces)
        return ShardLoad(rank, old, own, shard, pieces, holders)

    def to_json(self) -> dict[str, Any]:
        """The recovery as ``plan --lose --json`` prints it."""
        return {"before": job_degrees(self.before), "after": job_degrees(self.after),
                "world_size": [self.before.world_size, self.after.world_size], "lost": list(self.lost),
                "axis": self.axis, "reason": self.reason, "plan": self.plan.to_json(),
                "resharding": None if self.resharding is None else self.resharding.to_json()}


def _reason(dims: ParallelDims, lost: Sequence[int], axis: str, axes: Sequence[str]) -> str:
    world = dims.world_mesh
    passed = []
    for name in axes[: list(axes).index(axis)]:
        position, size = world.axis_index(name), world.shape[name]
        hit = {c[position] for c in map(world.coordinate, lost) if c is not None}
        passed.append(f"{name}={size} could not (" + (f"the lost ranks lie in all {size} of its slices"
                                                      if len(hit) == size else "no valid expert layout") + ")")
    hit = {c[world.axis_index(axis)] for c in map(world.coordinate, lost) if c is not None}
    return "; ".join([*passed, f"{axis} {world.shape[axis]} -> {world.shape[axis] - len(hit)}: {_WHY[axis]}"])


def recover_job(dims: ParallelDims, lost: Iterable[int], *, axes: Sequence[str] = ELASTIC_AXES,
                shrink_groups: bool = False) -> JobRecovery:
    """The recovery of ``dims`` from the loss of ranks ``lost``: :func:`fmesh.plan.rescale.scale_down` chooses the
    smaller job (``axes`` in order), :func:`plan_recovery` compares every communicator of the two jobs
    (:func:`fmesh.plan.jobs.job_requests`; ``shrink_groups``: whether the backend can shrink), and
    :class:`Resharding` says how the shards move.

    >>> import fmesh
    >>> job = recover_job(fmesh.ParallelDims(16, dp_replicate=2, dp_shard=4, tp=2), [9])
    >>> job.axis, job.after.world_size, job.plan.counts, job.load(3).moves
    ('dp_replicate', 8, {'keep': 2, 'shrink': 0, 'create': 0, 'dropped': 2}, False)
    """
    ranks = list(lost) if is_many(lost) else lost  # read once
    after = scale_down(dims, ranks, axes=axes)
    lost = tuple(sorted(set(ranks)))
    axis = next(name for name in axes if getattr(after, name) != getattr(dims, name))  # scale_down changed this one
    plan = _plan(job_requests(dims), job_requests(after), shrink_groups)
    resharding = None if axis == "pp" else Resharding.even(dims.dp_shard * dims.cp, after.dp_shard * after.cp)
    return JobRecovery(dims, after, lost, axis, _reason(dims, lost, axis, axes), plan, resharding)


def recover_manifests(a: Manifest, b: Manifest, lost: Iterable[int], *, axes: Sequence[str] = ELASTIC_AXES,
                      shrink_groups: bool = False) -> JobRecovery:
    """The recovery from the job of manifest ``a`` to that of ``b`` after ranks ``lost``. Manifests carry no
    lineage, so ``a``'s job is rebuilt from its degrees, :func:`recover_job` loses ``lost`` from it (``axes`` in
    order), and ``b`` must
    have the degrees of the job that leaves (``ValueError`` naming both otherwise).

    >>> from fmesh.plan.manifest import plan_manifest
    >>> recover_manifests(plan_manifest(16, 8, dp_replicate=2, tp=2), plan_manifest(8, 8, tp=2), [9]).axis
    'dp_replicate'
    """
    degrees = {name: a.degrees[name] for name in DEGREE_NAMES if name in a.degrees}
    dims, _ = job(a.world_size, a.gpus_per_node, rank_order=a.rank_order, **degrees)
    recovery = recover_job(dims, lost, axes=axes, shrink_groups=shrink_groups)
    expected = job_degrees(recovery.after)
    if {name: b.degrees.get(name) for name in expected} != expected:
        shown = " ".join(f"{n}={v}" for n, v in expected.items())
        raise ValueError(f"B ({b.summary()}) is not the job A becomes after losing ranks {list(recovery.lost)}: "
                         f"that job has {shown} (world {recovery.after.world_size})")
    return recovery
