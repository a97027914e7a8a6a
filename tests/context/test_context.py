"""The Context on real gloo processes: collectives along mesh axes, group sharing, and its errors."""

from __future__ import annotations

import functools
import multiprocessing
from datetime import timedelta
from typing import Any

import pytest
import torch
from support import MESHES, axis_sets, collective_answers, collective_inputs, launch, patience, succeeded

import fmesh
from fmesh import Context


def check_collectives(ctx: Context) -> list[str]:
    """Every collective along every axis and pair of axes, against values computed from mesh.group."""
    rank, world = ctx.rank, ctx.world_size
    problems: list[str] = []
    checked = 0
    for sizes, names, rank_map in MESHES[world]:
        mesh = fmesh.make_mesh(sizes, names, rank_map=rank_map)
        for axes in axis_sets(mesh):
            group = mesh.group(rank, axes)
            n = len(group)

            where = f"{axes} {sizes} {rank_map}"

            def expect(label: str, got: torch.Tensor, want: torch.Tensor, where: str = where) -> None:
                if not torch.equal(got, want):
                    problems.append(f"{label} {where}: got {got.tolist()} want {want.tolist()}")

            sent, want = collective_inputs(rank, n), collective_answers(rank, group)  # the shared oracle
            x = sent["all_reduce"]
            expect("all_reduce", ctx.all_reduce(x, mesh, axes), torch.tensor(want["all_reduce"]))
            expect("all_reduce max", ctx.all_reduce(x, mesh, axes, op="max"),
                   torch.tensor([float(max(group)), 1.0]))
            expect("all_reduce avg", ctx.all_reduce(x, mesh, axes, op="avg"),
                   torch.tensor([sum(group) / n, 1.0]))
            expect("all_gather", ctx.all_gather(sent["all_gather"], mesh, axes), torch.tensor(want["all_gather"]))
            gathered = ctx.all_gather(torch.full((2, 1), rank), mesh, axes, dim=1)
            expect("all_gather dim1", gathered, torch.tensor([group, group]))
            expect("reduce_scatter", ctx.reduce_scatter(sent["reduce_scatter"], mesh, axes),
                   torch.tensor(want["reduce_scatter"]))
            for src in range(n):
                expect("broadcast", ctx.broadcast(torch.tensor([rank]), mesh, axes, src=src),
                       torch.tensor([group[src]]))
            expect("all_to_all", ctx.all_to_all(sent["all_to_all"], mesh, axes), torch.tensor(want["all_to_all"]))
            ctx.barrier(mesh, axes)
            checked += 1
    ctx.barrier()
    if checked == 0:
        problems.append("nothing was checked")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_collectives_along_every_axis_and_pair(world: int) -> None:
    results = succeeded(launch(check_collectives, world, timeout=240))
    assert results == [[] for _ in range(world)]


def count_groups(ctx: Context) -> dict[str, object]:
    from torch.distributed.device_mesh import DeviceMesh

    from fmesh.context import _torch

    rank = ctx.rank
    mesh = fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"))
    one = torch.ones(1)
    ctx.all_reduce(one, mesh, "tp")
    ctx.all_reduce(one, mesh, "tp")  # cached
    ctx.all_reduce(one, mesh["dp", "tp"], "tp")  # a slice: same ranks, shared
    flat = fmesh.flatten(mesh, ("dp", "tp"), "dp_tp")
    ctx.all_reduce(one, flat, "dp_tp")
    ctx.all_reduce(one, mesh, ("dp", "tp"))  # the same ranks in the same order as dp_tp
    ctx.all_reduce(one, mesh, ("tp", "dp"))  # same ranks, another order: another group
    # Unflattening one axis twice into the same layout: one group each, made once.
    world_1d = fmesh.make_mesh((8,), ("world",))
    for _ in range(2):
        split = fmesh.unflatten(world_1d, "world", {"a": 2, "b": 2, "c": 2})
        ctx.all_reduce(one, split, "c")
        ctx.all_reduce(one, split, ("b", "c"))
    stats = ctx.stats()
    distinct = {
        mesh.group(rank, "tp"), mesh.group(rank, ("dp", "tp")), mesh.group(rank, ("tp", "dp")),
    }
    # torch 2.13: the same two unflattens make new groups each time.
    before = _torch.group_count()
    root = DeviceMesh("cpu", torch.arange(8), mesh_dim_names=("world",))
    after_root = _torch.group_count()
    root._unflatten(0, (2, 2, 2), ("a", "b", "c"))
    after_first = _torch.group_count()
    root._unflatten(0, (2, 2, 2), ("a", "b", "c"))
    after_second = _torch.group_count()
    return {
        "created": stats["groups_created"], "hits": stats["cache_hits"], "distinct": len(distinct),
        "torch_first": after_first - after_root, "torch_second": after_second - after_first,
        "torch_root": after_root - before,
    }


@pytest.mark.slow
def test_groups_are_shared_and_created_once() -> None:
    for result in succeeded(launch(count_groups, 8, timeout=240)):
        # tp, dp*tp, tp*dp from the 3-D mesh; the unflattened c and (b, c) are the tp and dp*tp groups again.
        assert result["created"] == result["distinct"] == 3
        assert result["hits"] >= 6
        assert result["torch_first"] == result["torch_second"] == 3  # torch makes new groups every time


def mismatched(ctx: Context) -> str:
    rank_map = [0, 1] if ctx.rank == 0 else [1, 0]
    mesh = fmesh.make_mesh((2,), ("dp",), rank_map=rank_map)
    ctx.all_reduce(torch.ones(1), mesh, "dp")
    return "no error"


@pytest.mark.slow
def test_inconsistent_meshes_raise_on_every_rank_quickly() -> None:
    # The launch's own timeout (30 s) is the bound: a hang would raise TimeoutError instead.
    errors = launch(mismatched, 2, timeout=30, context_timeout=20)
    for error in errors:
        assert isinstance(error, fmesh.MeshMismatchError), error
        assert "disagree" in str(error) and "permuted" in str(error)


def missing_rank(ctx: Context, timed_out: Any) -> str:
    mesh = fmesh.make_mesh((2,), ("dp",))
    if ctx.rank == 0:
        try:
            ctx.all_reduce(torch.ones(1), mesh, "dp")
        finally:
            timed_out.set()
    else:
        timed_out.wait(patience(60, 2))  # never joins: busy until rank 0 has its error
    return "no error"


@pytest.mark.slow
def test_missing_rank_times_out_naming_axes_and_ranks() -> None:
    # Group creation has its own, shorter timeout; the collectives' stays long.
    timed_out = multiprocessing.get_context("fork").Event()  # the ranks are forked: they share it
    first, second = launch(functools.partial(missing_rank, timed_out=timed_out), 2, timeout=60, context_timeout=600,
                           creation_timeout=3)
    assert isinstance(first, fmesh.GroupTimeoutError), first
    assert "('dp',)" in str(first) and "ranks [1] never came" in str(first)
    assert "rank 1 is not creating a group" in str(first)  # what the missing rank was doing
    assert second == "no error"


def test_bad_use_fails_before_anything_is_sent() -> None:
    with Context.fake(4, rank=1) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        with pytest.raises(KeyError, match="'ep'"):
            ctx.all_reduce(torch.ones(1), mesh, "ep")
        with pytest.raises(ValueError, match="built for 8 ranks, but this context has 4"):
            ctx.all_reduce(torch.ones(1), fmesh.make_mesh((8,), ("dp",)), "dp")
        with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
            ctx.all_reduce(torch.ones(1), mesh, "dp", op="mean")
        with pytest.raises(ValueError, match=r"src=2 is an index within the group: valid 0\.\.1"):
            ctx.broadcast(torch.ones(1), mesh, "dp", src=2)
        with pytest.raises(ValueError, match="not divisible by group size 2"):
            ctx.reduce_scatter(torch.ones(3), mesh, "dp")
        with pytest.raises(ValueError, match="not divisible by group size 4"):
            ctx.all_to_all(torch.ones(6), mesh, ("dp", "tp"))
        assert ctx.stats()["groups_created"] == 0
    with pytest.raises(fmesh.ContextClosedError, match="closed"):
        ctx.all_reduce(torch.ones(1), mesh, "tp")
    with Context.fake(12) as ctx:
        flat = fmesh.slice(fmesh.flatten(fmesh.make_mesh((3, 2, 2), ("a", "b", "c")), ("a", "c"), "ac"), "ac")
        uneven = fmesh.unflatten(flat, "ac", {"p": 2, "q": 3})
        with pytest.raises(ValueError, match="splits a strided axis unevenly"):
            ctx.device_mesh(uneven)
        assert ctx.all_reduce(torch.ones(1), uneven, "q").shape == (1,)  # collectives still work
    with pytest.raises(ValueError, match="unknown backend 'glue'"):
        Context(backend="glue")
    with pytest.raises(ValueError, match="timeout must be between"):
        Context(timeout=timedelta(0))


def test_plan_and_materialize_on_fake_backend() -> None:
    with Context.fake(16, rank=5, gpus_per_node=4) as ctx:
        mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
        flat = fmesh.flatten(mesh, ("dp", "cp"), "dp_cp")
        plan = ctx.plan(mesh, (flat, "dp_cp"), (mesh, ("dp", "cp")))
        assert [p.axes for p in plan.groups] == [("dp",), ("cp",), ("tp",), ("dp_cp",)]
        by_axes = {p.axes: p for p in plan.groups}
        assert by_axes[("tp",)].hosts_per_group == 1 and by_axes[("dp",)].hosts_per_group == 2
        assert by_axes[("dp_cp",)].ranks == mesh.group(5, ("dp", "cp"))
        assert plan.to_create == 4 and ctx.stats()["groups_created"] == 0
        done = ctx.materialize(mesh, (flat, "dp_cp"), (mesh, ("dp", "cp")))
        assert done.to_create == 0 and ctx.stats()["groups_created"] == 4
        assert "dp_cp" in str(done)


AXIS_OVERRIDES = {"dp": fmesh.context.AxisOptions(timeout=17), "other": fmesh.context.AxisOptions(timeout=17),
                  "y": fmesh.context.AxisOptions(timeout=5)}


def axis_overrides(ctx: Context) -> dict[str, object]:
    mesh = fmesh.make_mesh((2,), ("dp",))
    same_ranks = fmesh.rename(mesh, {"dp": "x"})  # no override: another group
    also_17 = fmesh.rename(mesh, {"dp": "other"})  # the same override: shares dp's group
    for m, axis in ((mesh, "dp"), (same_ranks, "x"), (also_17, "other")):
        assert ctx.all_reduce(torch.ones(1), m, axis).item() == 2.0
    timeouts = {
        axis: ctx.group(m, axis)._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        for m, axis in ((mesh, "dp"), (same_ranks, "x"), (also_17, "other"))
    }
    with pytest.raises(ValueError, match="different axis_options"):
        ctx.all_reduce(torch.ones(1), fmesh.make_mesh((1, 2), ("dp", "y")), ("dp", "y"))
    return {"created": ctx.stats()["groups_created"], "timeouts": timeouts}


@pytest.mark.slow
def test_axis_options_are_part_of_the_group_key() -> None:
    for result in succeeded(launch(axis_overrides, 2, timeout=120, context_timeout=60, axis_options=AXIS_OVERRIDES)):
        assert result["created"] == 2
        assert result["timeouts"] == {"dp": 17.0, "x": 60.0, "other": 17.0}
    with pytest.raises(ValueError, match="unknown backend 'ncl'"):
        fmesh.context.AxisOptions(backend="ncl")
