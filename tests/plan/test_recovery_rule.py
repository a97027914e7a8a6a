"""The one keep / shrink / create rule (``fmesh.plan.communicators.renewal``): what ``python -m fmesh plan --lose``
prints and what ``Context.recover`` does are the same decision, group by group.

``Context.recover`` decides for each group a rank holds: ``renewal(group, new world, shrinkable=...)``. The printed
plan decides for each communicator of the smaller job, matched to the old communicator it comes from. The law: for
every communicator the plan keeps or shrinks, the Context, deciding on any of the old communicator's groups whose
members go on, takes the same action (a shrunk communicator's intact groups are kept); for every old communicator
the plan drops, the Context keeps none of its groups that lost a member. The one difference is knowledge, not rule:
the Context does not know which meshes the smaller job will ask for, so it may shrink a group of an old
communicator that no new one comes from (the plan, which knows the new job, drops it).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import COUNTED, Reached
from strategies import jobs, lost_ranks

import fmesh
from fmesh.context.recovery import new_world
from fmesh.plan import recovery
from fmesh.plan.communicators import CREATE, KEEP, SHRINK, plan_communicators, renewal, renewals
from fmesh.plan.jobs import job_requests

# ---------------------------------------------------------------------------------------------- the rule itself


@pytest.mark.parametrize(("members", "kept", "shrinkable", "held", "expected"), [
    ((0, 1), (0, 1, 2), False, True, KEEP),  # nobody lost: the same communicator
    ((0, 1), (0, 1, 2), True, True, KEEP),  # nobody lost, on NCCL too: keeping beats shrinking
    ((0, 1), (0, 1, 2), False, False, CREATE),  # a member does not hold it (was still connecting)
    ((2, 1, 0), (0, 1, 2), False, True, KEEP),  # any order of members
    ((1, 2), (0, 2), False, True, CREATE),  # nobody lost, but rank 1 does not go on (outside the new world)
    ((1, 2), (0, 2), True, True, CREATE),  # and one member left needs no communicator
    ((2, 3), (0, 1, 2), True, True, CREATE),  # one survivor: a group of one needs no communicator
    ((0, 2, 3), (0, 1, 2), False, True, CREATE),  # a backend that cannot shrink (gloo; NCCL < 2.27)
    ((0, 2, 3), (0, 1, 2), True, True, SHRINK),  # one that can: the survivors' communicator in place
    ((0, 2, 3), (0, 1, 2), True, False, CREATE),
    ((1, 3, 5, 7), (0, 1, 4, 5, 6, 7), True, True, SHRINK),  # rank 3 is alive but dropped: excluded as well
    ((1, 3, 5, 7), (0, 1, 4, 5, 6, 7), False, True, CREATE),
])
def test_renewal_keeps_shrinks_or_creates(members: tuple[int, ...], kept: tuple[int, ...], shrinkable: bool,
                                          held: bool, expected: str) -> None:
    assert renewal(members, kept, shrinkable=shrinkable, held_everywhere=held) == expected


# ------------------------------------------------------------------- the printed plan and the Context agree


def context_actions(before: fmesh.ParallelDims, after: fmesh.ParallelDims, lost: list[int],
                    shrinkable: bool) -> dict[tuple[int, ...], str]:
    """What ``Context.recover`` decides for every group of every communicator of the job before the loss (each rank
    holds its group of each), as it decides: the new world from the mesh after, then the rule."""
    kept = set(new_world(before.world_size, sorted(set(lost)), after.world_mesh))
    held = [group for communicator in plan_communicators(job_requests(before)).communicators
            for group in communicator.first.mesh.groups(communicator.first.axes) if len(group) > 1]
    decided: dict[tuple[int, ...], str] = {}
    for rank in sorted(kept):  # each rank that goes on decides over the groups it holds, smallest first
        mine = sorted((g for g in held if rank in g), key=lambda g: (len(g), g))
        choices = renewals(mine, kept, shrinkable=[shrinkable] * len(mine), held_everywhere=[True] * len(mine))
        for group, choice in zip(mine, choices, strict=True):
            assert decided.setdefault(group, choice) == choice, f"members of {group} decide differently"
    return decided


def check_agreement(before: fmesh.ParallelDims, lost: list[int], shrinkable: bool) -> list[str]:
    """The law of the module docstring for one loss; the branches it reached."""
    job = recovery.recover_job(before, lost, shrink_groups=shrinkable)
    decided = context_actions(before, job.after, lost, shrinkable)
    kept = set(new_world(before.world_size, sorted(set(lost)), job.after.world_mesh))
    reached = []
    used = set()
    for communicator in job.plan.communicators:
        source = communicator.source
        if source is None or communicator.action == CREATE:
            reached.append(f"plan {communicator.action}")
            continue
        used.add(source.order)
        groups = [g for g in source.request.mesh.groups(source.request.axes)
                  if sum(member in kept for member in g) > 1]
        assert groups, communicator
        for group in groups:
            assert decided[group] in (communicator.action, KEEP if communicator.action == SHRINK else None), (
                f"{before!r} losing {lost}: the plan says {communicator.action} for {communicator.names}, the Context "
                f"decides {decided[group]} for its group {group}")
        reached.append(f"plan {communicator.action}")
    for old in job.plan.dropped:
        for group in old.request.mesh.groups(old.request.axes):
            if len(group) > 1 and not kept.issuperset(group) and not kept.isdisjoint(group):
                # Never kept; but the Context, which does not know the new job's meshes, may shrink a group that no
                # communicator of the new job comes from (the plan drops it): memory, never a wrong group.
                assert decided[group] != KEEP, (old, group, decided[group])
                reached.append(f"dropped: the Context would {decided[group]}")
    return reached


def test_the_printed_plan_and_the_context_decide_alike() -> None:
    reached = Reached()

    @COUNTED
    @given(st.data())
    def law(data: st.DataObject) -> None:
        dims = data.draw(jobs())
        lost = data.draw(lost_ranks(dims.world_size))
        try:
            fmesh.plan.rescale.scale_down(dims, lost)
        except ValueError:
            assume(False)
            raise
        branches = []
        for shrinkable in (True, False):  # NCCL's shrink rule and gloo's
            branches += [b + ("" if shrinkable else " (no shrink)") for b in check_agreement(dims, lost, shrinkable)]
        reached.example(*branches)

    law()
    reached.floor({"plan shrink": 0.3, "plan keep": 0.3, "plan create (no shrink)": 0.3})


def test_the_issue_case_shrinks_the_dp_shard_group_on_both_sides() -> None:
    """``ParallelDims(8, dp_shard=4, tp=2)`` losing rank 2 goes on without ranks 2 and 3: the printed plan shrinks
    the dp_shard communicator, and the Context shrinks rank 1's dp_shard group (1, 3, 5, 7) to (1, 5, 7), rank 3
    (alive, dropped) excluded; on gloo both create it anew."""
    dims = fmesh.ParallelDims(8, dp_shard=4, tp=2)
    for shrinkable, action in ((True, SHRINK), (False, CREATE)):
        job = recovery.recover_job(dims, [2], shrink_groups=shrinkable)
        (dp_shard,) = [c for c in job.plan.communicators if "dp_shard" in c.names]
        assert dp_shard.action == action
        assert context_actions(dims, job.after, [2], shrinkable)[(1, 3, 5, 7)] == action
        assert check_agreement(dims, [2], shrinkable)
