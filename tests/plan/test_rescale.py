"""Rescaling a job (fmesh.plan.rescale: scale_down after a loss, scale_up after a join): every named mesh of the
smaller or larger job against a restarted job's, read through the new universe, and the errors.

The references here enumerate ranks and read coordinates; the code under test never does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import COUNTED, Reached
from reference import dropped_coordinates, renumbered, survivors, through_rank_map
from strategies import jobs, lost_ranks

import fmesh
from fmesh.plan.parallel import MESH_NAMES
from fmesh.plan.rescale import ELASTIC_AXES, scale_down, scale_up

EXPERT_MESHES = ("ep", "efsdp", "etp")


def restarted(dims: fmesh.ParallelDims, axis: str, size: int) -> fmesh.ParallelDims:
    """The job a restart with ``axis`` of ``size`` would launch (identity rank map)."""
    degrees = {name: getattr(dims, name) for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
    degrees[axis] = size
    return fmesh.ParallelDims(math.prod(degrees.values()), **degrees, ep=dims.ep, etp=dims.etp)


def test_scale_down_equals_a_restarted_job_for_every_named_mesh() -> None:
    reached = Reached()

    @COUNTED
    @given(st.data())
    def law(data: st.DataObject) -> None:
        dims = data.draw(jobs())
        axis = data.draw(st.sampled_from(("pp", "dp_replicate", "dp_shard")))
        lost = data.draw(lost_ranks(dims.world_size))
        world = dims.world_mesh
        dropped = dropped_coordinates(world, lost, axis)
        assume(len(dropped) < world.shape[axis])
        try:
            restart = restarted(dims, axis, world.shape[axis] - len(dropped))
        except ValueError as error:  # the smaller degree leaves no valid expert layout: shrink says so
            assert "ep=" in str(error)
            with pytest.raises(ValueError, match=re.escape(f"{axis} {world.shape[axis]} -> ") + ".*ep="):
                scale_down(dims, lost, axes=(axis,))
            reached.example("no expert layout")
            return
        smaller = scale_down(dims, lost, axes=(axis,))
        number = {rank: new for new, rank in enumerate(survivors(world, lost, axis))}

        assert smaller.world_mesh == fmesh.without(world, lost, axis)
        keeps_experts = axis != "dp_shard" or (dims.cp * dims.tp) % (dims.ep * dims.etp) == 0
        for name in MESH_NAMES:
            new_groups = smaller.mesh(name).groups()
            assert new_groups == through_rank_map(restart.mesh(name).groups(), smaller.world_mesh.universe), name
            if keeps_experts or name not in EXPERT_MESHES:
                assert new_groups == renumbered(dims.mesh(name).groups(), number), name
        for name in ("dp", "fsdp", "loss", "ep"):
            assert fmesh.old_rank(smaller.mesh(name), 0) == min(number)
        reached.example(axis)

    law()
    # Floors well under the expected shares (about a third each): a floor catches a strategy that drifts away from
    # a branch, and must not fail on an unlucky draw (14/150 dp_shard was seen once against a floor of 0.1).
    reached.floor({"pp": 0.05, "dp_replicate": 0.05, "dp_shard": 0.05, "no expert layout": 0.02})


@given(st.data())

def test_scale_up_equals_a_restarted_job_and_scaling_the_newcomers_down_returns_the_job(data: st.DataObject) -> None:
    dims = data.draw(jobs())
    axis = data.draw(st.sampled_from(("pp", "dp_replicate", "dp_shard")))
    world = dims.world_mesh
    added = data.draw(st.integers(1, 2))
    joining = added * world.world_size // world.shape[axis]
    try:
        restart = restarted(dims, axis, world.shape[axis] + added)
    except ValueError as error:
        assert "ep=" in str(error)
        with pytest.raises(ValueError, match=re.escape(f"{axis} {world.shape[axis]} -> ") + ".*ep="):
            scale_up(dims, joining, axes=(axis,))
        return
    larger = scale_up(dims, joining, axes=(axis,))

    assert larger.world_size == dims.world_size + joining
    for name in MESH_NAMES:
        assert larger.mesh(name).groups() == through_rank_map(restart.mesh(name).groups(),
                                                              larger.world_mesh.universe), name
    assert [fmesh.new_rank(larger.world_mesh, r) for r in range(dims.world_size)] == list(range(dims.world_size))
    back = scale_down(larger, range(dims.world_size, larger.world_size), axes=(axis,))
    assert back.degrees == dims.degrees
    for mesh, original in ((back.world_mesh, dims.world_mesh), (back.expert_mesh, dims.expert_mesh)):
        assert mesh == original and hash(mesh) == hash(original)


def test_the_axis_chosen_is_dp_replicate_before_dp_shard_and_pp_only_when_named() -> None:
    dims = fmesh.ParallelDims(32, pp=2, dp_replicate=2, dp_shard=4, tp=2)
    assert scale_down(dims, [0]).degrees["dp_replicate"] == 1
    assert scale_down(dims, [0, 8]).degrees["dp_shard"] == 3  # both replicas hit
    assert scale_down(dims, [0, 8, 2]).degrees["dp_shard"] == 2
    with pytest.raises(ValueError, match="pp is tried only when axes names it"):
        scale_down(dims, [0, 8, 2, 4, 6])
    assert scale_down(dims, [0, 8, 2, 4, 6], axes=(*ELASTIC_AXES, "pp")).pp == 1
    assert scale_up(dims, 16).dp_replicate == 3
    assert scale_up(dims, 8).dp_shard == 5


ERRORS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("tp absorbs", lambda: scale_down(fmesh.ParallelDims(4, tp=2), [0], axes=("tp",)), ValueError,
     "axes names 'tp': tp and cp cannot absorb a change"),
    ("unknown recipe axis", lambda: scale_up(fmesh.ParallelDims(4), 4, axes=("dp",)), ValueError,
     "unknown axis 'dp' in axes: expected names from ('pp', 'dp_replicate', 'dp_shard')"),
    ("nothing lost", lambda: scale_down(fmesh.ParallelDims(4), []), ValueError, "at least one lost rank"),
    ("no slice joins", lambda: scale_up(fmesh.ParallelDims(8, tp=2), 3), ValueError,
     "dp_shard: a slice along it has 2 ranks, and 3 is not a multiple of 2"),
    ("everything hit", lambda: scale_down(fmesh.ParallelDims(4, dp_shard=2, tp=2), [0, 2]), ValueError,
     "dp_replicate=1: the lost ranks lie in all 1 of its slices; dp_shard=2: the lost ranks lie in all 2 of its "
     "slices (pp is tried only when axes names it; tp and cp cannot absorb a change"),
    ("expert layout", lambda: scale_down(fmesh.ParallelDims(8, dp_shard=4, tp=2, ep=4), [3]), ValueError,
     "dp_shard 4 -> 3: ep=4 does not divide dp_shard(3) * cp(1) * tp(2) = 6: with etp=1, ep is carved from "
     "dp_shard * cp * tp inside one dp_replicate group; valid ep: 1, 2, 3, 6"),
]


@pytest.mark.parametrize(("call", "kind", "fragment"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_is_a_clear_error(call: Callable[[], object], kind: type[Exception], fragment: str) -> None:
    with pytest.raises(kind) as raised:
        call()
    assert fragment in str(raised.value)
