"""The one planner of distinct communicators against brute force: two requests share a communicator exactly when
every rank's group has the same ranks in the same order; the manifest and the Context's plan list its order."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import steps

import fmesh
from fmesh.plan.communicators import Request, plan_communicators, requests_of
from fmesh.plan.jobs import job, job_meshes
from fmesh.plan.manifest import build_manifest


@st.composite
def requests(draw: st.DrawFn) -> list[Request]:
    """Requests on meshes derived from one root: every axis and pair of axes, in a random order."""
    mesh, _ = draw(steps())
    derived = [mesh, fmesh.flatten(mesh, mesh.axis_names, "all")]
    found = [Request(m, axes, "*".join(axes)) for m in derived
             for axes in [(n,) for n in m.axis_names] + list(itertools.permutations(m.axis_names, 2))]
    return draw(st.permutations(found))


def groups_by_rank(request: Request) -> dict[int, tuple[int, ...]]:
    return {rank: request.mesh.group(rank, request.axes) for group in request.mesh.groups(request.axes)
            for rank in group}


@settings(max_examples=60)  # each example compares every pair of ~30 requests rank by rank
@given(requests())
def test_requests_share_a_communicator_exactly_when_every_rank_has_the_same_ordered_group(
        asked: list[Request]) -> None:
    plan = plan_communicators(asked)
    assert [c.order for c in plan.communicators] == list(range(len(plan.communicators)))
    assert sorted(set(plan.of_request)) == list(range(len(plan.communicators)))
    first_use = [plan.of_request.index(c.order) for c in plan.communicators]
    assert first_use == sorted(first_use)  # creation order: the order first asked for
    groups = [groups_by_rank(request) for request in asked]
    for (i, a), (j, b) in itertools.combinations(enumerate(asked), 2):
        if a.mesh.num_covered != b.mesh.num_covered:
            continue
        same = groups[i] == groups[j]
        shared = plan.of_request[i] == plan.of_request[j]
        assert same or not shared, (a, b)  # never one communicator for two different sets of groups
        if a.mesh.frame == b.mesh.frame:  # frames are not canonical yet (test_mesh's strict xfail): across
            assert shared == same, (a, b)  # two frames the same groups may still get two communicators


def test_the_manifest_lists_the_planners_communicators_in_its_order() -> None:
    dims, _ = job(64, 8, tp=4, cp=2, pp=2)
    asked = [Request(mesh, (axis,), f"{name}.{axis}" if mesh.ndim > 1 else name)
             for name, mesh in job_meshes(dims) for axis in mesh.axis_names]
    plan = plan_communicators(asked)
    manifest = build_manifest(64, 8, tp=4, cp=2, pp=2)
    listed = [[r.label for r in c.requests] for c in plan.communicators if c.size > 1]
    assert [c["names"] for c in manifest["communicators"]] == listed and len(listed) >= 4
    with fmesh.Context.fake(64) as ctx:
        planned = ctx.plan(*(mesh for _, mesh in job_meshes(dims))).groups
    assert [(g.size, g.num_groups) for g in planned] == [(c.size, c.num_groups) for c in plan.communicators]


def test_bad_items_name_the_item() -> None:
    try:
        requests_of([fmesh.make_mesh((2,), ("dp",)), "dp"])
    except TypeError as error:
        assert str(error) == "plans take meshes or (mesh, axes) pairs, but got 'dp'"
    else:
        raise AssertionError("a string is not a plan item")
