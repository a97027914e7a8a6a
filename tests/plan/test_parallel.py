"""ParallelDims against a brute-force numpy rank grid and against torchtitan / OLMo-core cases.

The reference never calls fmesh: it lays ranks out as ``arange(world).reshape(pp,
dp_replicate, dp_shard, cp, tp)`` (what ``init_device_mesh`` does), and reads groups
off by transposing the grouped axes last and reshaping.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fmesh
from fmesh.plan.parallel import MESH_NAMES, ParallelDims

WORLD = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
EXPERT = ("pp", "dp_replicate", "efsdp", "ep", "etp")


# ---------------------------------------------------------------- reference


def ref_grid(degrees: dict[str, int], rank_map: list[int] | None = None) -> np.ndarray:
    world = math.prod(degrees[n] for n in WORLD)
    ranks = np.arange(world) if rank_map is None else np.asarray(rank_map)
    return ranks.reshape([degrees[n] for n in WORLD])


def ref_groups(grid: np.ndarray, names: tuple[str, ...], axes: tuple[str, ...]) -> set[tuple[int, ...]]:
    idx = [names.index(a) for a in axes]
    others = [i for i in range(grid.ndim) if i not in idx]
    size = math.prod(grid.shape[i] for i in idx)
    rows = grid.transpose(others + idx).reshape(-1, size)
    return {tuple(int(x) for x in row) for row in rows}


def ref_expert_grid(grid: np.ndarray, ep: int, etp: int) -> np.ndarray:
    pp, dpr, dps, cp, tp = grid.shape
    efsdp = dps * cp * tp // (ep * etp)
    return grid.reshape(pp, dpr, efsdp, ep, etp)


def ref_mesh_groups(degrees: dict[str, int], name: str, rank_map: list[int] | None = None) -> set[tuple[int, ...]]:
    grid = ref_grid(degrees, rank_map)
    world_axes = {
        "dp": ("dp_replicate", "dp_shard"),
        "dp_shard_cp": ("dp_shard", "cp"),
        "dp_cp": ("dp_replicate", "dp_shard", "cp"),
        **{n: (n,) for n in WORLD},
    }
    if name in world_axes:
        return ref_groups(grid, WORLD, world_axes[name])
    return ref_groups(ref_expert_grid(grid, degrees["ep"], degrees["etp"]), EXPERT, (name,))


def as_set(groups: tuple[tuple[int, ...], ...]) -> set[tuple[int, ...]]:
    result = set(groups)
    assert len(result) == len(groups)
    return result


# ------------------------------------------------------------- strategies


@st.composite
def degree_sets(draw: st.DrawFn) -> tuple[dict[str, int], list[int] | None]:
    degrees = {n: draw(st.sampled_from([1, 1, 2, 3, 4])) for n in WORLD}
    while math.prod(degrees.values()) > 96:
        biggest = max(degrees, key=lambda n: degrees[n])
        degrees[biggest] = 1
    etp = draw(st.sampled_from([1, degrees["tp"]]))
    region = degrees["dp_shard"] * degrees["cp"] * (degrees["tp"] if etp == 1 else 1)
    ep = draw(st.sampled_from([d for d in range(1, region + 1) if region % d == 0]))
    degrees.update(ep=ep, etp=etp)
    world = math.prod(degrees[n] for n in WORLD)
    rank_map = draw(st.none() | st.permutations(list(range(world))))
    return degrees, rank_map


# ------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(degree_sets())
def test_every_mesh_matches_the_numpy_grid(case: tuple[dict[str, int], list[int] | None]) -> None:
    degrees, rank_map = case
    world = math.prod(degrees[n] for n in WORLD)
    dims = ParallelDims(world, rank_map=rank_map, **degrees)
    for name in MESH_NAMES:
        mesh = dims.mesh(name)
        assert mesh.axis_names == (name,)
        expected = ref_mesh_groups(degrees, name, rank_map)
        assert as_set(mesh.groups()) == expected, name
        for group in expected:
            assert mesh.group(group[-1]) == group
    assert dims.world_mesh.axis_names == WORLD
    assert dims.world_mesh.axis_sizes == tuple(degrees[n] for n in WORLD)
    assert dims.degrees == {name: len(next(iter(ref_mesh_groups(degrees, name, rank_map)))) for name in MESH_NAMES}


@settings(max_examples=40, deadline=None)
@given(degree_sets(), st.sampled_from(WORLD))
def test_minus_one_infers_the_missing_degree(case: tuple[dict[str, int], list[int] | None], inferred: str) -> None:
    degrees, _ = case
    world = math.prod(degrees[n] for n in WORLD)
    given_degrees = {**degrees, inferred: -1}  # dp_shard is given explicitly, so this is the only -1
    dims = ParallelDims(world, **given_degrees)
    assert getattr(dims, inferred) == degrees[inferred]
    assert dims == ParallelDims(world, **degrees)


@settings(max_examples=40, deadline=None)
@given(degree_sets())
def test_fsdp_meshes_are_shard_or_replicate_by_shard(case: tuple[dict[str, int], list[int] | None]) -> None:
    degrees, rank_map = case
    world = math.prod(degrees[n] for n in WORLD)
    dims = ParallelDims(world, rank_map=rank_map, **degrees)
    grid = ref_grid(degrees, rank_map)
    fsdp = dims.fsdp_mesh()
    shard = ref_groups(grid, WORLD, ("dp_shard", "cp"))
    if degrees["dp_replicate"] == 1:
        assert fsdp.axis_names == ("dp_shard_cp",)
        assert as_set(fsdp.groups()) == shard
    else:
        assert fsdp.axis_names == ("dp_replicate", "dp_shard_cp")
        assert as_set(fsdp.groups("dp_shard_cp")) == shard
        assert as_set(fsdp.groups("dp_replicate")) == ref_groups(grid, WORLD, ("dp_replicate",))
        assert as_set(fsdp.groups()) == ref_groups(grid, WORLD, ("dp_replicate", "dp_shard", "cp"))
    expert = dims.expert_fsdp_mesh()
    egrid = ref_expert_grid(grid, degrees["ep"], degrees["etp"])
    assert as_set(expert.groups("efsdp")) == ref_groups(egrid, EXPERT, ("efsdp",))
    assert expert.axis_names == (("dp_replicate", "efsdp") if degrees["dp_replicate"] > 1 else ("efsdp",))


# --------------------------------------------- hand-checked (research notes)


def groups(dims: ParallelDims, name: str) -> set[tuple[int, ...]]:
    return as_set(dims.mesh(name).groups())


def test_torchtitan_hsdp_tp_ws8() -> None:
    # torchtitan V2/V3, ws8 dp_replicate=2 dp_shard=2 tp=2 (computed with real DeviceMesh).
    dims = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
    assert groups(dims, "tp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert groups(dims, "fsdp") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert groups(dims, "dp_replicate") == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert groups(dims, "batch") == groups(dims, "loss") == {(0, 2, 4, 6), (1, 3, 5, 7)}
    assert groups(dims, "efsdp") == {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert dims.fsdp_mesh().ranks(0).tolist() == [[0, 2], [4, 6]]
    assert dims.fsdp_mesh().axis_sizes == (2, 2)
    assert dims.data_parallel == "hsdp"


def test_torchtitan_cp_ws8() -> None:
    dims = ParallelDims(8, dp_shard=2, cp=2, tp=2)
    assert groups(dims, "cp") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert groups(dims, "batch") == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert groups(dims, "loss") == groups(dims, "fsdp") == {(0, 2, 4, 6), (1, 3, 5, 7)}


def test_torchtitan_pp_ws16() -> None:
    dims = ParallelDims(16, pp=2, dp_replicate=2, dp_shard=2, tp=2)
    assert groups(dims, "pp") == {(r, r + 8) for r in range(8)}
    assert groups(dims, "dp_replicate") == {(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)}
    assert groups(dims, "dp") == {(0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)}


def test_hyper_parallel_ws16_dataloading_views() -> None:
    # ws16, dataloading mesh (pp1, batch4, cp2, tp2): rank 0's views.
    dims = ParallelDims(16, dp_shard=4, cp=2, tp=2)
    assert dims.mesh("batch").group(0) == (0, 4, 8, 12)
    assert dims.mesh("loss").group(0) == (0, 2, 4, 6, 8, 10, 12, 14)
    assert dims.mesh("tp").group(0) == (0, 1)


@pytest.mark.parametrize(
    ("kwargs", "ep_groups", "efsdp_groups"),
    [
        # ws8 dps4 tp2 ep4 (etp=1): ep takes tp and half of dp_shard.
        ({"dp_shard": 4, "tp": 2, "ep": 4}, {(0, 1, 2, 3), (4, 5, 6, 7)}, {(0, 4), (1, 5), (2, 6), (3, 7)}),
        # ws8 dps4 tp2 ep2 (etp=1): ep groups are the tp groups.
        ({"dp_shard": 4, "tp": 2, "ep": 2}, {(0, 1), (2, 3), (4, 5), (6, 7)}, {(0, 2, 4, 6), (1, 3, 5, 7)}),
        # ws8 dps4 tp2 ep2 etp=tp: ep is carved from dp_shard, tp stays as etp.
        (
            {"dp_shard": 4, "tp": 2, "ep": 2, "etp": 2},
            {(0, 2), (1, 3), (4, 6), (5, 7)},
            {(0, 4), (1, 5), (2, 6), (3, 7)},
        ),
        # ws8 dpr2 dps2 cp2 ep2: ep = cp groups.
        (
            {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "ep": 2},
            {(0, 1), (2, 3), (4, 5), (6, 7)},
            {(0, 2), (1, 3), (4, 6), (5, 7)},
        ),
    ],
)
def test_torchtitan_expert_parallel(
    kwargs: dict[str, int], ep_groups: set[tuple[int, ...]], efsdp_groups: set[tuple[int, ...]]
) -> None:
    dims = ParallelDims(8, **kwargs)
    assert groups(dims, "ep") == ep_groups
    assert groups(dims, "efsdp") == efsdp_groups
    if kwargs.get("etp", 1) > 1:
        assert groups(dims, "etp") == groups(dims, "tp")


def test_torchtitan_npu_sparse_ws4() -> None:
    # _unflatten((2,1,1,2,1), ("pp","dp_replicate","efsdp","ep","etp")) -> ep [0,1] [2,3]
    dims = ParallelDims(4, pp=2, dp_shard=2, ep=2)
    assert dims.expert_mesh.axis_sizes == (2, 1, 1, 2, 1)
    assert groups(dims, "ep") == {(0, 1), (2, 3)}


def test_torchtitan_sizes() -> None:
    assert ParallelDims(8, dp_replicate=2, dp_shard=-1, tp=2).dp_shard == 2
    dims = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
    assert dims.degrees == {
        "pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2,
        "dp": 4, "dp_shard_cp": 2, "dp_cp": 4, "ep": 1, "efsdp": 4, "etp": 1,
    }  # fmt: skip


def test_olmo_core_fsdp_cp_tp() -> None:
    # OLMo-core FSDP ws8 cp2 tp2 -> (dp2, cp2, tp2); model mesh dp_cp.
    dims = ParallelDims(8, cp=2, tp=2)
    assert groups(dims, "dp") == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert groups(dims, "cp") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert dims.fsdp_mesh().axis_names == ("dp_shard_cp",)
    assert as_set(dims.fsdp_mesh().groups()) == {(0, 2, 4, 6), (1, 3, 5, 7)}


def test_olmo_core_hsdp_cp_model_mesh() -> None:
    # OLMo-core HSDP ws8 rep2 cp2: get_dp_model_mesh is (dp_replicate, dp_cp), rank 0 [[0,1,2,3],[4,5,6,7]].
    dims = ParallelDims(8, dp_replicate=2, cp=2)
    assert groups(dims, "cp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert groups(dims, "dp_shard") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert dims.fsdp_mesh().ranks(0).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ddp_only_gives_replicate_by_one() -> None:
    dims = ParallelDims(4, dp_replicate=4, dp_shard=1)
    assert dims.data_parallel == "ddp"
    assert dims.fsdp_mesh().axis_sizes == (4, 1)
    assert dims.fsdp_mesh().axis_names == ("dp_replicate", "dp_shard_cp")


def test_degree_one_axes_are_kept() -> None:
    dims = ParallelDims(4, tp=4)
    assert dims.world_mesh.axis_sizes == (1, 1, 1, 1, 4)
    assert dims.mesh("pp").groups() == ((0,), (1,), (2,), (3,))
    assert not dims.pp_enabled and not dims.fsdp_enabled and dims.data_parallel == "none"


def test_values_are_frozen_and_compare_by_resolved_degrees() -> None:
    a = ParallelDims(8, tp=2)
    b = ParallelDims(8, dp_shard=4, tp=2)
    assert a == b and hash(a) == hash(b)
    assert a != ParallelDims(8, dp_shard=2, cp=2, tp=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.tp = 4  # type: ignore[misc]
    assert fmesh.ParallelDims is ParallelDims and fmesh.plan.parallel.ParallelDims is ParallelDims


def test_aliases_and_unknown_names() -> None:
    dims = ParallelDims(8, dp_replicate=2, cp=2)
    assert dims.mesh("fsdp").axis_names == ("fsdp",)
    assert dims.mesh("fsdp").groups() == dims.mesh("dp_shard_cp").groups()
    with pytest.raises(KeyError, match=r"unknown mesh 'dpp'.*dp_shard_cp"):
        dims.mesh("dpp")


def test_million_ranks() -> None:  # how fast: bench/mesh_ops.py
    dims = ParallelDims(2**20, pp=8, dp_replicate=4, cp=2, tp=8, ep=64)
    sizes = {name: mesh.size for name, mesh in dims.meshes().items()}
    first_tp = dims.mesh("tp").group(0)
    assert sizes["dp_shard"] == 2**20 // (8 * 4 * 2 * 8)
    assert sizes["efsdp"] == sizes["dp_shard"] * 2 * 8 // 64
    assert first_tp == tuple(range(8))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("world", "kwargs", "error", "message"),
    [
        (8, {"dp_shard": 3, "tp": 2}, ValueError, r"do not multiply to world_size 8: .*dp_shard\(3\).*= 6"),
        (10, {"dp_replicate": 2, "dp_shard": 2, "tp": 2}, ValueError, r"world_size 10.*= 8"),
        (10, {"tp": 4}, ValueError, r"cannot infer dp_shard=-1: world_size 10 is not divisible by .* = 4"),
        (8, {"tp": -1}, ValueError, r"only one degree may be -1, got -1 for dp_shard and tp.*set it explicitly"),
        (8, {"dp_shard": 2, "tp": -1, "cp": -1}, ValueError, r"-1 for cp and tp"),
        (8, {"dp_replicate": 0}, ValueError, r"dp_replicate=0 is invalid"),
        (8, {"dp_shard": 0}, ValueError, r"dp_shard=0 is invalid"),
        (8, {"cp": -2}, ValueError, r"cp=-2 is invalid"),
        (8, {"tp": 2.0}, TypeError, r"tp must be an int, got 2.0"),
        (8, {"pp": True}, TypeError, r"pp must be an int"),
        (0, {}, ValueError, r"world_size must be a positive int"),
        ("8", {}, TypeError, r"world_size must be an int"),
        (8, {"tp": 4, "ep": 2, "etp": 2}, ValueError, r"etp=2 is not supported.*1.*tp=4"),
        (8, {"tp": 4, "etp": 3}, ValueError, r"etp=3 is not supported"),
        (8, {"dp_shard": 2, "tp": 4, "ep": 3}, ValueError, r"ep=3 does not divide dp_shard\(2\) .* tp\(4\) = 8"),
        (8, {"dp_shard": 2, "tp": 4, "ep": 4, "etp": 4}, ValueError, r"ep=4 does not divide .*cp\(1\) = 2: .*: 1, 2$"),
        (8, {"dp_replicate": 2, "dp_shard": 2, "tp": 2, "ep": 8}, ValueError, r"= 4: .*valid ep: 1, 2, 4$"),
        (8, {"ep": -1}, ValueError, r"ep=-1 is not supported"),
        (8, {"etp": -1}, ValueError, r"etp=-1 is not supported"),
        (8, {"rank_map": [0, 1, 2]}, ValueError, r"rank_map has 3 entries"),
        (2, {"rank_map": [1, 1]}, ValueError, r"twice"),
    ],
)
def test_invalid_combinations(world: int, kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ParallelDims(world, **kwargs)  # type: ignore[arg-type]
