"""The recovery plan (fmesh.plan.recovery): keep/shrink/create counts against brute force over every group, the
resharding against coordinates, the backend choice, and the errors.

The references enumerate every group of every mesh and compare tuples of old ranks; the code under test plans
communicators by layout and checks one candidate at a time.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable, Sequence
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import COUNTED, Reached
from reference import dropped_coordinates
from strategies import jobs, lost_ranks, meshes

import fmesh
from fmesh.plan import recovery
from fmesh.plan.communicators import Request, can_shrink
from fmesh.plan.jobs import job_requests
from fmesh.plan.manifest import plan_manifest

# ----------------------------------------------------------------- reference


def communicators(requests: Sequence[Request], to_old: Callable[[int], int | None]) -> list[frozenset[tuple[int | None,
                                                                                                             ...]]]:
    """Each distinct communicator (its set of groups, read in the old numbering) with more than one rank per group,
    in the order first asked for."""
    found: list[frozenset[tuple[int | None, ...]]] = []
    for request in requests:
        groups = frozenset(tuple(map(to_old, g)) for g in request.mesh.groups(request.axes))
        if len(next(iter(groups))) > 1 and groups not in found:
            found.append(groups)
    return found


def brute_counts(before: Sequence[Request], after: Sequence[Request], shrink_groups: bool) -> dict[str, int]:
    universe = after[0].mesh.universe
    to_old = {r: fmesh.old_rank(universe, r) for r in range(universe.world_size)}
    alive = {r for r in to_old.values() if r is not None}
    old = communicators(before, lambda r: r)
    counts = {"keep": 0, "shrink": 0, "create": 0}
    used = set()
    for new in communicators(after, to_old.__getitem__):
        kept = [i for i, groups in enumerate(old) if new <= groups]
        survivors = [i for i, groups in enumerate(old)
                     if new <= {tuple(r for r in g if r in alive) for g in groups}]
        if kept:
            counts["keep"] += 1
            used.add(kept[0])
        elif survivors and shrink_groups:
            counts["shrink"] += 1
            used.add(survivors[0])
        else:
            counts["create"] += 1
    return {**counts, "dropped": len(old) - len(used)}


# ----------------------------------------------------------------- laws


def check_job_recovery(job: recovery.JobRecovery, after: fmesh.ParallelDims, dims: fmesh.ParallelDims,
                       shrink_groups: bool) -> None:
    """``job`` against brute force: its counts, its keeps and what each shrink leaves of the old groups."""
    assert job.after == after
    assert job.plan.counts == brute_counts(job_requests(dims), job_requests(after), shrink_groups)
    for communicator in job.plan.communicators:  # a keep reuses a communicator of the same size, unchanged
        assert (communicator.action == "keep") == (communicator.source is not None
                                                   and communicator.groups_shrunk == 0), communicator
        if communicator.action == "keep":
            assert communicator.source is not None and communicator.source.size == communicator.size
        if communicator.action == "shrink":  # what shrink_group leaves of each old group is the new group
            assert communicator.source is not None
            old_request, new_request = communicator.source.request, communicator.request
            for rank in range(after.world_size):
                gone = job.plan.to_exclude(communicator, rank)
                old_group = old_request.mesh.group(fmesh.old_rank(after.world_mesh, rank), old_request.axes)
                left = tuple(fmesh.new_rank(after.world_mesh, r)
                             for i, r in enumerate(old_group) if i not in gone)
                assert left == new_request.mesh.group(rank, new_request.axes)
                assert all(fmesh.new_rank(after.world_mesh, old_group[i]) is None for i in gone)


def test_the_counts_of_a_job_recovery_equal_brute_force_over_every_group() -> None:
    reached = Reached()

    @COUNTED
    @given(st.data())
    def law(data: st.DataObject) -> None:
        dims = data.draw(jobs())
        lost = data.draw(lost_ranks(dims.world_size))
        axes = data.draw(st.sampled_from((fmesh.plan.rescale.ELASTIC_AXES, ("pp", "dp_replicate", "dp_shard"))))
        try:
            after = fmesh.plan.rescale.scale_down(dims, lost, axes=axes)
        except ValueError:
            assume(False)
            raise
        branches = []
        for shrink_groups in (True, False):  # every loss on both kinds of backend: one that can shrink, one not
            job = recovery.recover_job(dims, lost, axes=axes, shrink_groups=shrink_groups)
            check_job_recovery(job, after, dims, shrink_groups)
            branches += [c.action + ("" if shrink_groups else " (no shrink)") for c in job.plan.communicators]
        reached.example(*branches, f"absorbed by {job.axis}")

    law()
    # At least 30% of the losses shrink a communicator (on a backend that can), each axis absorbs some.
    reached.floor({"shrink": 0.3, "keep": 0.3, "create (no shrink)": 0.3, "absorbed by dp_replicate": 0.1,
                   "absorbed by dp_shard": 0.05, "absorbed by pp": 0.05})


def test_the_counts_of_any_meshes_after_without_equal_brute_force() -> None:
    reached = Reached()

    @COUNTED
    @given(st.data())
    def law(data: st.DataObject) -> None:
        mesh = data.draw(meshes())
        axis = data.draw(st.sampled_from(mesh.axis_names))
        lost = data.draw(lost_ranks(mesh.world_size))
        assume(all(mesh.coordinate(r) is not None for r in lost))
        assume(len(dropped_coordinates(mesh, lost, axis)) < mesh.shape[axis])
        smaller = fmesh.without(mesh, lost, axis)
        before: list[object] = [mesh, (mesh, mesh.axis_names)]
        if data.draw(st.booleans()):  # a larger communicator first: a keep must still win over a shrink
            before.reverse()
        after = [smaller, (smaller, smaller.axis_names)]
        plan = recovery.plan_recovery(before, after, shrink_groups=True)
        requests = fmesh.plan.communicators.requests_of
        assert plan.counts == brute_counts(requests(before), requests(after), True)
        reached.example(*(c.action for c in plan.communicators), *(["dropped"] if plan.dropped else []))

    law()
    reached.floor({"shrink": 0.3, "keep": 0.1, "dropped": 0.1})


@given(st.data())
def test_each_new_rank_loads_its_even_share_from_the_ranks_that_held_it(data: st.DataObject) -> None:
    dims = data.draw(jobs())
    lost = data.draw(lost_ranks(dims.world_size))
    try:
        job = recovery.recover_job(dims, lost)
    except ValueError:
        assume(False)
        raise
    assert job.resharding is not None
    old_shards, new_shards = dims.dp_shard * dims.cp, job.after.dp_shard * job.after.cp
    world = dims.world_mesh
    for rank in range(job.after.world_size):
        load = job.load(rank)
        old = fmesh.old_rank(job.after.world_mesh, rank)
        assert load.old_rank == old and load.shard == job.after.mesh("fsdp").coordinate(rank)[0]  # type: ignore[index]
        # The pieces, in old-shard units, tile exactly [shard/new, (shard+1)/new) of the state, in order.
        edges = [(Fraction(p.old_shard) + p.start) / old_shards for p in load.pieces]
        ends = [(Fraction(p.old_shard) + p.stop) / old_shards for p in load.pieces]
        assert edges[0] == Fraction(load.shard, new_shards) and ends[-1] == Fraction(load.shard + 1, new_shards)
        assert edges[1:] == ends[:-1]
        # The holders: every old rank at my stage and tensor-parallel part that held that old shard.
        mine = world.coordinate(old)
        assert mine is not None
        for piece, holders in zip(load.pieces, load.holders, strict=True):
            expected = [r for r in range(dims.world_size) if (c := world.coordinate(r)) is not None
                        and (c[0], c[4]) == (mine[0], mine[4]) and c[2] * dims.cp + c[3] == piece.old_shard]
            assert list(holders) == expected
        assert load.moves == (job.axis != "dp_replicate")


# ----------------------------------------------------------------- the worked examples

DIMS = fmesh.ParallelDims(32, pp=2, dp_replicate=2, dp_shard=4, tp=2)


def test_losing_a_replica_keeps_every_communicator_that_remains_and_moves_nothing() -> None:
    job = recovery.recover_job(DIMS, [9], shrink_groups=True)
    assert job.axis == "dp_replicate" and job.after.world_size == 16
    assert [(c.names[0], c.action) for c in job.plan.communicators] == [("pp", "keep"), ("dp_shard", "keep"),
                                                                        ("tp", "keep")]
    assert [c.names[0] for c in job.plan.dropped] == ["dp_replicate", "dp"]
    assert job.resharding is not None and job.resharding.identity
    assert not any(job.load(r).moves for r in range(16))


def test_losing_a_shard_in_both_replicas_shrinks_with_nccl_and_creates_with_gloo() -> None:
    nccl = recovery.recover_job(DIMS, [1, 9], shrink_groups=True)
    gloo = recovery.recover_job(DIMS, [1, 9], shrink_groups=False)
    assert nccl.plan.counts == {"keep": 3, "shrink": 2, "create": 0, "dropped": 0}
    assert gloo.plan.counts == {"keep": 3, "shrink": 0, "create": 2, "dropped": 2}
    shrunk = nccl.plan.communicators[2]
    assert shrunk.names[0] == "dp_shard" and shrunk.source is not None and shrunk.source.size == 4
    assert [str(p) for p in nccl.load(1).pieces] == ["0", "1 [0, 1/3)"]
    assert nccl.load(1).holders == ((1, 9), (3, 11))  # old shard 0 of rank 1's part: only on the lost ranks


def test_losing_a_stage_moves_layers_not_shards() -> None:
    job = recovery.recover_job(DIMS, [0, 8, 2, 4, 6], axes=("dp_replicate", "dp_shard", "pp"))
    assert job.axis == "pp" and job.resharding is None
    with pytest.raises(ValueError, match="pp absorbed the loss"):
        job.load(0)


def test_a_recovery_from_two_manifests_is_that_of_the_job() -> None:
    a, b = plan_manifest(32, 8, pp=2, dp_replicate=2, dp_shard=4, tp=2), plan_manifest(24, 8, pp=2, dp_replicate=2,
                                                                                     dp_shard=3, tp=2)
    found = recovery.recover_manifests(a, b, [1, 9], shrink_groups=True)
    assert found == recovery.recover_job(DIMS, [1, 9], shrink_groups=True)
    names = [c.names for c in found.plan.communicators]
    assert names == [c.names for c in b.communicators]  # one line per communicator of B, in B's order


# ----------------------------------------------------------------- the backend choice


@pytest.mark.parametrize(("backend", "torch_release", "nccl", "expected"), [
    ("nccl", (2, 13), (2, 27, 5), True),
    ("nccl", (2, 10), (2, 27, 0), True),
    ("nccl", (2, 15), (2, 30, 7), True),
    ("nccl", (2, 9), (2, 27, 5), False),  # no torch.distributed.shrink_group
    ("nccl", (2, 13), (2, 26, 5), False),  # no ncclCommShrink
    ("nccl", (2, 13), None, False),  # NCCL version unknown
    ("gloo", (2, 15), (2, 30, 7), False),  # gloo's backend does not support shrinking
    ("fake", (2, 15), (2, 30, 7), False),
])
def test_only_nccl_with_new_enough_torch_and_nccl_shrinks(backend: str, torch_release: tuple[int, int],
                                                          nccl: tuple[int, ...] | None, expected: bool) -> None:
    assert can_shrink(backend, torch_release, nccl) is expected


# ----------------------------------------------------------------- errors

ERRORS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("rank outside", lambda: recovery.recover_job(DIMS, [40]), ValueError,
     "rank 40 is outside the universe: valid ranks are 0..31"),
    ("tp only", lambda: recovery.recover_job(fmesh.ParallelDims(8, tp=8), [3]), ValueError,
     "no axis of ('dp_replicate', 'dp_shard') can absorb the loss of ranks [3]"),
    ("unrelated universes", lambda: recovery.plan_recovery([fmesh.make_mesh((4,), ("dp",))],
                                                           [fmesh.make_mesh((3,), ("dp",))]), ValueError,
     "does not descend from the one before it"),
    ("two universes", lambda: recovery.plan_recovery([fmesh.make_mesh((4,), ("dp",)), fmesh.make_mesh((2,), ("dp",))],
                                                     [fmesh.make_mesh((4,), ("dp",))]), ValueError,
     "the meshes before the loss must share one universe"),
    ("nothing", lambda: recovery.plan_recovery([], []), ValueError, "needs at least one mesh before the loss"),
    ("not a mesh", lambda: recovery.plan_recovery(["dp"], []), TypeError, "take meshes or (mesh, axes) pairs"),
    ("wrong B", lambda: recovery.recover_manifests(plan_manifest(16, 8, dp_replicate=2, tp=2), plan_manifest(
        8, 8, dp_shard=2, tp=4), [9]), ValueError, "is not the job A becomes after losing ranks [9]: that job has "
                                                   "pp=1 dp_replicate=1 dp_shard=4"),
    ("exclude from a keep", lambda: (lambda plan: plan.to_exclude(plan.communicators[0], 0))(
        recovery.recover_job(DIMS, [9]).plan), ValueError,
     "to_exclude answers for a communicator to shrink, but ('pp',) is to keep"),
    ("no shards", lambda: recovery.Resharding.even(4, 0), ValueError,
     "expected shard counts as positive ints, but got 4 -> 0"),
    ("torch as text", lambda: can_shrink("nccl", "2.13", (2, 27)), TypeError,  # type: ignore[arg-type]
     "expected the torch release as (major, minor) such as (2, 13), but got '2.13'"),
    ("backend not text", lambda: can_shrink(None, (2, 13)), TypeError,  # type: ignore[arg-type]
     "expected a backend name such as 'nccl' or 'gloo', but got None"),
]


@pytest.mark.parametrize(("call", "kind", "fragment"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_is_a_clear_error(call: Callable[[], object], kind: type[Exception], fragment: str) -> None:
    with pytest.raises(kind) as raised:
        call()
    assert fragment in str(raised.value)


def test_the_module_examples_are_true() -> None:
    outcome = doctest.testmod(recovery, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted >= 8 and outcome.failed == 0


def test_a_group_kept_whole_is_kept_even_when_it_is_also_what_remains_of_a_larger_one() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    plan = recovery.plan_recovery([(mesh, ("dp", "tp")), mesh], [fmesh.without(mesh, [2], "dp")], shrink_groups=True)
    assert [(c.names, c.action) for c in plan.communicators] == [(("tp",), "keep")]
    assert [c.names for c in plan.dropped] == [("dp*tp",), ("dp",)]


def test_a_larger_job_losing_one_of_four_replicas_shrinks_the_replica_communicators() -> None:
    dims = fmesh.ParallelDims(2**12, pp=4, dp_replicate=4, dp_shard=32, tp=8)
    job = recovery.recover_job(dims, [5], shrink_groups=True)
    assert job.after.dp_replicate == 3 and job.after.world_size == 3 * 2**10
    assert [(c.names[0], c.action) for c in job.plan.communicators] == [
        ("pp", "keep"), ("dp_replicate", "shrink"), ("dp_shard", "keep"), ("tp", "keep"), ("dp", "shrink")]
