"""PyTorch as a real client of fmesh meshes: DTensor, FSDP2, HSDP and tensor parallelism on
``ctx.device_mesh(...)``, on 4 gloo processes, without torch creating a single process group.

Each multi-process worker returns, per check, a list of problems (empty when fine) and the
process-group counts it saw, so a failure names the check, the rank and the values.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fake_torch import fake_world, torch_groups
from support import launch, succeeded

import fmesh
from fmesh import Context, Mesh

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

WORLD = 4
# A permuted rank map on purpose: group rank order must follow mesh coordinates, not sorted ranks.
RANK_MAPS: list[list[int] | None] = [None, [3, 0, 2, 1]]


def _launch(fn: Callable[[Context], Any], timeout: float) -> list[Any]:
    """Every rank's result of ``fn``, on WORLD gloo processes (explicit: a GPU machine runs them too)."""
    return succeeded(launch(fn, WORLD, timeout=timeout))


def _section(results: dict[str, list[str]], name: str, check: Callable[[list[str]], None]) -> None:
    problems: list[str] = []
    try:
        check(problems)
    except Exception:
        problems.append(traceback.format_exc())
    results[name] = problems


# ---------------------------------------------------------------------------------------------------- DTensor


def _expected_slice(full: torch.Tensor, mesh: Mesh, rank: int, shard_dims: dict[str, int]) -> torch.Tensor:
    """The local shard DTensor must hold: for each mesh axis sharding a tensor dim, this rank's chunk
    (by its coordinate along that axis), applied in mesh-axis order as DTensor does."""
    coordinate = mesh.coordinate(rank)
    if coordinate is None:
        raise ValueError(f"rank {rank} not in {mesh!r}")
    local = full
    for axis, index in zip(mesh.axis_names, coordinate, strict=True):
        if axis in shard_dims:
            local = local.chunk(mesh.shape[axis], dim=shard_dims[axis])[index]
    return local


def dtensor_worker(ctx: Context) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from fmesh.context import _torch

    rank = ctx.rank
    results: dict[str, Any] = {}
    for rank_map in RANK_MAPS:
        tag = f"rank_map={rank_map}"
        mesh2 = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=rank_map)
        mesh1 = fmesh.make_mesh((4,), ("world",), rank_map=rank_map)
        flat = fmesh.flatten(mesh2, ("dp", "tp"), "dp_tp")
        meshes = {"1d": mesh1, "2d": mesh2, "flat": flat, "tp": mesh2["tp"], "dp": mesh2["dp"]}
        exported = {name: ctx.device_mesh(m) for name, m in meshes.items()}
        before = _torch.group_count()
        full = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12) + 1000 * (0 if rank_map is None else 1)

        def check_1d(problems: list[str], exported: Any = exported, full: torch.Tensor = full,
                     meshes: dict[str, Mesh] = meshes, tag: str = tag) -> None:
            for name in ("1d", "flat", "tp", "dp"):
                dm, mesh = exported[name], meshes[name]
                axis = mesh.axis_names[0]
                for dim in (0, 1):
                    d = distribute_tensor(full, dm, [Shard(dim)])
                    want = _expected_slice(full, mesh, rank, {axis: dim})
                    if not torch.equal(d.to_local(), want):
                        problems.append(f"{tag} {name} Shard({dim}) local {d.to_local().shape} != expected")
                    if not torch.equal(d.full_tensor(), full):
                        problems.append(f"{tag} {name} Shard({dim}).full_tensor() != full")
                    moved = d.redistribute(dm, [Shard(1 - dim)])
                    if not torch.equal(moved.to_local(), _expected_slice(full, mesh, rank, {axis: 1 - dim})):
                        problems.append(f"{tag} {name} Shard({dim})->Shard({1 - dim}) wrong local shard")
                    if not torch.equal(moved.redistribute(dm, [Replicate()]).to_local(), full):
                        problems.append(f"{tag} {name} ->Replicate wrong")
                    summed = (d * 2).sum().full_tensor()
                    if summed.item() != float(full.sum() * 2):
                        problems.append(f"{tag} {name} sum {summed.item()} != {float(full.sum() * 2)}")

        def check_2d(problems: list[str], exported: Any = exported, full: torch.Tensor = full,
                     meshes: dict[str, Mesh] = meshes, tag: str = tag) -> None:
            dm, mesh = exported["2d"], meshes["2d"]
            cases: list[tuple[list[Any], dict[str, int]]] = [
                ([Shard(0), Shard(1)], {"dp": 0, "tp": 1}),
                ([Shard(1), Shard(0)], {"dp": 1, "tp": 0}),
                ([Replicate(), Shard(0)], {"tp": 0}),
                ([Shard(0), Replicate()], {"dp": 0}),
                ([Replicate(), Replicate()], {}),
            ]
            for placements, dims in cases:
                d = distribute_tensor(full, dm, placements)
                if not torch.equal(d.to_local(), _expected_slice(full, mesh, rank, dims)):
                    problems.append(f"{tag} 2d {placements} wrong local shard")
                for target, target_dims in cases:
                    moved = d.redistribute(dm, target)
                    if not torch.equal(moved.to_local(), _expected_slice(full, mesh, rank, target_dims)):
                        problems.append(f"{tag} 2d {placements}->{target} wrong local shard")
                if not torch.equal(d.full_tensor(), full):
                    problems.append(f"{tag} 2d {placements}.full_tensor() != full")
            # Both mesh dims shard dim 0: full_tensor() gathers over the flattened dp_tp group
            # (found in the root's _flatten_mapping, because flat was exported).
            both = distribute_tensor(full, dm, [Shard(0), Shard(0)])
            coordinate = mesh.coordinate(rank)
            if coordinate is None:
                raise ValueError("not covered")
            want = full.chunk(4, dim=0)[coordinate[0] * 2 + coordinate[1]]
            if not torch.equal(both.to_local(), want):
                problems.append(f"{tag} 2d [Shard(0), Shard(0)] wrong local shard")
            if not torch.equal(both.full_tensor(), full):
                problems.append(f"{tag} 2d [Shard(0), Shard(0)].full_tensor() != full")

        _section(results, f"dtensor 1-D {tag}", check_1d)
        _section(results, f"dtensor 2-D {tag}", check_2d)
        after = _torch.group_count()
        results[f"dtensor groups {tag}"] = [] if after == before else [f"group count {before} -> {after}"]
        created = ctx.stats()["groups_created"]
        if created > 3 * len(RANK_MAPS) + 1:  # world, dp, tp and dp_tp per rank map at most
            results[f"dtensor groups {tag}"].append(f"fmesh created {created} groups")

    # (c) from_device_mesh(ctx.device_mesh(mesh)) has the same groups along every axis.
    def check_round_trip(problems: list[str]) -> None:
        for rank_map in RANK_MAPS:
            mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=rank_map)
            for m in (mesh, mesh["tp"], mesh["tp", "dp"], fmesh.flatten(mesh, ("dp", "tp"), "dp_tp")):
                back = fmesh.from_device_mesh(ctx.device_mesh(m))
                if back.axis_names != m.axis_names:
                    problems.append(f"{m!r}: names {back.axis_names}")
                for name in m.axis_names:
                    if back.groups(name) != m.groups(name) or back.group(rank, name) != m.group(rank, name):
                        problems.append(f"{m!r} {rank_map}: axis {name} {back.groups(name)} != {m.groups(name)}")
                if back.coordinate(rank) != m.coordinate(rank):
                    problems.append(f"{m!r}: coordinate {back.coordinate(rank)} != {m.coordinate(rank)}")

    # (d) one object per mesh value; dp and tp exports concatenate (one root).
    def check_identity_and_concatenate(problems: list[str]) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        for rank_map in RANK_MAPS:
            mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=rank_map)
            again = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=rank_map)
            if ctx.device_mesh(mesh) is not ctx.device_mesh(again):
                problems.append("equal meshes gave different DeviceMesh objects")
            if ctx.device_mesh(mesh["tp"]) is not ctx.device_mesh(fmesh.slice(again, "tp")):
                problems.append("equal slices gave different DeviceMesh objects")
            dp, tp = ctx.device_mesh(mesh["dp"]), ctx.device_mesh(mesh["tp"])
            if dp._get_root_mesh() is not tp._get_root_mesh():
                problems.append("dp and tp exports have different roots")
            joined = DeviceMesh._concatenate([dp, tp])
            if joined != ctx.device_mesh(mesh):
                problems.append(f"concatenate(dp, tp) {joined} != export of the 2-D mesh")
            for name in ("dp", "tp"):
                if joined.get_group(name) is not ctx.group(mesh, name):
                    problems.append(f"concatenated mesh's {name} group is not the context's")
                if dist.get_process_group_ranks(joined.get_group(name)) != list(mesh.group(rank, name)):
                    problems.append(f"concatenated {name} group ranks differ from mesh.group")
        # One axis name, two layouts, in both export orders: get_group(name) must give each mesh's
        # own group, although torch's get_group consults the shared root's _flatten_mapping first.
        for first, second in (("1d", "2d"), ("2d", "1d")):
            by_kind = {"1d": fmesh.make_mesh((4,), (f"x_{first}",), rank_map=[3, 0, 2, 1]),
                       "2d": fmesh.make_mesh((2, 2), ("y", f"x_{first}"), rank_map=[3, 0, 2, 1])}
            for kind in (first, second):
                m = by_kind[kind]
                dm = ctx.device_mesh(m)
                for name in m.axis_names:
                    got = dist.get_process_group_ranks(dm.get_group(name))
                    if got != list(m.group(rank, name)):
                        problems.append(f"{m!r} (exported {kind}, order {first},{second}) get_group({name!r}) "
                                        f"gave {got}, want {list(m.group(rank, name))}")
            for kind in (first, second):  # and still right after both exist
                m = by_kind[kind]
                got = dist.get_process_group_ranks(ctx.device_mesh(m).get_group(f"x_{first}"))
                if got != list(m.group(rank, f"x_{first}")):
                    problems.append(f"{m!r} after both exports: get_group gave {got}")
        try:
            other = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
            DeviceMesh._concatenate([ctx.device_mesh(fmesh.make_mesh((4,), ("w",))),
                                     ctx.device_mesh(other["tp"])])
            problems.append("concatenating exports of two universes did not raise")
        except RuntimeError:
            pass

    before = _torch.group_count()
    _section(results, "from_device_mesh round trip", check_round_trip)
    _section(results, "device_mesh identity and concatenate", check_identity_and_concatenate)
    after = _torch.group_count()
    results["round trip groups"] = [] if after - before <= 1 else [f"group count {before} -> {after}"]
    ctx.barrier()
    return results


@pytest.fixture(scope="module")
def dtensor_results() -> list[dict[str, Any]]:
    return _launch(dtensor_worker, timeout=180)


def _problems(results: list[dict[str, Any]], prefix: str) -> Iterator[str]:
    seen = 0
    for rank, result in enumerate(results):
        for name, problems in result.items():
            if name.startswith(prefix):
                seen += 1
                yield from (f"rank {rank} {name}: {p}" for p in problems)
    if not seen:
        yield f"no check named {prefix!r} ran"


def test_dtensor_values_on_exported_meshes(dtensor_results: list[dict[str, Any]]) -> None:
    assert list(_problems(dtensor_results, "dtensor 1-D")) == []
    assert list(_problems(dtensor_results, "dtensor 2-D")) == []


def test_dtensor_creates_no_process_group(dtensor_results: list[dict[str, Any]]) -> None:
    assert list(_problems(dtensor_results, "dtensor groups")) == []


def test_from_device_mesh_round_trip(dtensor_results: list[dict[str, Any]]) -> None:
    assert list(_problems(dtensor_results, "from_device_mesh round trip")) == []
    assert list(_problems(dtensor_results, "round trip groups")) == []


def test_device_mesh_identity_and_concatenate(dtensor_results: list[dict[str, Any]]) -> None:
    assert list(_problems(dtensor_results, "device_mesh identity and concatenate")) == []


# ------------------------------------------------------------------------------------------------ FSDP / TP

STEPS = 4
BATCH = 8
LR = 0.05


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same global batch every step (so the loss must fall), a learnable target."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator))
    return [(x, y)] * STEPS


def reference_losses() -> list[float]:
    """One process, the full global batch, no parallelism."""
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches():
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _train(ctx: Context, model: torch.nn.Module, mesh: Mesh, dp_axes: tuple[str, ...]) -> list[float]:
    """Each data-parallel rank takes its slice of the global batch (by its coordinate along dp_axes);
    the loss reported is the global-batch mean (an average over the dp axes)."""
    group = mesh.group(ctx.rank, dp_axes)
    index, size = group.index(ctx.rank), len(group)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches():
        xs, ys = x.chunk(size)[index], y.chunk(size)[index]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(ctx.all_reduce(loss.detach(), mesh, dp_axes, op="avg")))
    return losses


SETUPS = ("fsdp", "hsdp", "fsdp+tp")


def fsdp_worker(ctx: Context) -> dict[str, dict[str, Any]]:
    results = {setup: _train_setup(ctx, setup) for setup in SETUPS}
    ctx.barrier()
    return results


def _train_setup(ctx: Context, setup: str) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from fmesh.context import _torch

    rank = ctx.rank
    model = _model()
    if setup in ("fsdp", "hsdp"):  # a 1-D mesh is FSDP; fully_shard reads a 2-D one as (replicate, shard)
        sizes, dp_axes = ((4,), ("dp_shard",)) if setup == "fsdp" else ((2, 2), ("dp_replicate", "dp_shard"))
        mesh = fmesh.make_mesh(sizes, dp_axes, rank_map=[3, 0, 2, 1])
        dm = ctx.device_mesh(mesh)
        before = _torch.group_count()
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=dm)
        fully_shard(model, mesh=dm)
    elif setup == "fsdp+tp":
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
        dp_axes = ("dp",)
        dp_dm, tp_dm = ctx.device_mesh(mesh["dp"]), ctx.device_mesh(mesh["tp"])
        before = _torch.group_count()
        parallelize_module(model, tp_dm, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=dp_dm)
        fully_shard(model, mesh=dp_dm)
    else:
        raise ValueError(setup)
    after_wrap = _torch.group_count()
    ctx.materialize((mesh, dp_axes))  # fmesh's own group for the loss average, made before counting
    before_steps = _torch.group_count()
    params = [p for p in model.parameters() if isinstance(p, DTensor)]
    sharded = len(params) == 4 and all(p.to_local().numel() < p.numel() for p in params)
    losses = _train(ctx, model, mesh, dp_axes)
    after_steps = _torch.group_count()
    ranks_of = {
        name: dist.get_process_group_ranks(params[0].device_mesh.get_group(name))
        for name in params[0].device_mesh.mesh_dim_names or ()
    }
    expected = {name: list(mesh.group(rank, name)) for name in ranks_of}
    return {
        "losses": losses, "reference": reference_losses(), "sharded": sharded,
        "groups": (before, after_wrap, before_steps, after_steps), "param_mesh_ranks": ranks_of,
        "expected_ranks": expected, "placements": str(params[0].placements),
    }


@pytest.fixture(scope="module")
def training_results() -> list[dict[str, dict[str, Any]]]:
    return _launch(fsdp_worker, timeout=240)


@pytest.mark.parametrize("setup", SETUPS)
def test_training_matches_single_process(setup: str, training_results: list[dict[str, dict[str, Any]]]) -> None:
    results = [by_setup[setup] for by_setup in training_results]
    reference = results[0]["reference"]
    assert len(reference) == STEPS and reference[-1] < reference[0]  # it trains
    for rank, result in enumerate(results):
        assert result["sharded"], f"rank {rank}: parameters are not sharded DTensors"
        torch.testing.assert_close(
            torch.tensor(result["losses"]), torch.tensor(reference), rtol=1e-4, atol=1e-5,
            msg=lambda m, rank=rank: f"{setup} rank {rank}: {m}",
        )
        # torch made no process group: fully_shard / parallelize_module and the steps used ours.
        before, after_wrap, before_steps, after_steps = result["groups"]
        assert before == after_wrap and before_steps == after_steps, (setup, rank, result["groups"])
        # The parameters' mesh (for fsdp+tp, torch's concatenation of dp and tp) uses the mesh's groups.
        assert result["param_mesh_ranks"] == result["expected_ranks"], (setup, rank)
    if setup == "fsdp+tp":
        assert "Shard(dim=0)" in results[0]["placements"]


# ------------------------------------------------------------------------------ init_device_mesh, fake backend


@pytest.fixture
def fake8() -> Iterator[None]:
    with fake_world(8):
        yield


@pytest.mark.usefixtures("fake8")
def test_from_device_mesh_agrees_with_torch_on_init_device_mesh() -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    permuted = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4]).reshape(2, 2, 2)
    roots = [
        init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp")),
        DeviceMesh("cpu", permuted, mesh_dim_names=("pp", "dp", "tp")),
    ]
    checked = 0
    for root in roots:
        views = [root, root["tp"], root["pp", "tp"], root["dp", "tp"]._flatten("dp_tp"),
                 root["pp", "dp"]._flatten("pp_dp")]
        for dm in views:
            mesh = fmesh.from_device_mesh(dm)
            assert mesh.axis_names == tuple(dm.mesh_dim_names)
            assert mesh.ranks(0).tolist() == dm.mesh.tolist()  # this rank's instance, same order
            for dim, name in enumerate(mesh.axis_names):
                assert set(mesh.groups(name)) == torch_groups(dm, [dim]), (dm, name)
                # The group torch actually created for rank 0. torch 2.13's DeviceMesh makes its groups with
                # new_group's default sort_ranks=True, so on a permuted mesh the group-rank order is sorted,
                # not the mesh order (fmesh's own groups follow the mesh order).
                ranks = tuple(dist.get_process_group_ranks(dm.get_group(name)))
                if root is roots[0]:
                    assert ranks == mesh.group(0, name), (dm, name)
                else:
                    assert ranks == tuple(sorted(mesh.group(0, name))), (dm, name)
                checked += 1
    assert checked == 2 * (3 + 1 + 2 + 1 + 1)
