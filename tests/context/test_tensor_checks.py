"""Tensors checked at the door of every tensor collective, before any group is touched; and the members' check of
their tensors (``Context(check_tensors=True)``, the default) that names the rank whose tensor differs before any of
it is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from support import launch, succeeded

import fmesh
from fmesh import Context

MESH = fmesh.make_mesh((2, 2), ("dp", "tp"))


def calls(tensor: Any) -> dict[str, Callable[[Context], Any]]:
    """Every tensor collective of the Context on ``tensor``."""
    return {
        "all_reduce": lambda ctx: ctx.all_reduce(tensor, MESH, "tp"),
        "all_gather": lambda ctx: ctx.all_gather(tensor, MESH, "tp"),
        "reduce_scatter": lambda ctx: ctx.reduce_scatter(tensor, MESH, "tp"),
        "broadcast": lambda ctx: ctx.broadcast(tensor, MESH, "tp"),
        "all_to_all": lambda ctx: ctx.all_to_all(tensor, MESH, "tp"),
        "ppermute": lambda ctx: ctx.ppermute(tensor, MESH, "tp", [(0, 1)]),
        "shift": lambda ctx: ctx.shift(tensor, MESH, "tp"),
        "sum_gradients": lambda ctx: ctx.sum_gradients(tensor, MESH, "tp"),
        "sum_partials": lambda ctx: ctx.sum_partials(tensor, MESH, "tp"),
    }


@pytest.mark.parametrize("what", sorted(calls(None)))
@pytest.mark.parametrize("sparse", [torch.ones(2, 2).to_sparse(), torch.eye(2).to_sparse_csr()], ids=["coo", "csr"])
def test_a_sparse_tensor_is_refused_at_the_door_naming_it_and_what_to_do(what: str, sparse: torch.Tensor) -> None:
    # Before: it went on to the collective, which raised "unsupported memory format option Contiguous" (or NCCL's
    # "Tensors must be CUDA and dense") from deep inside.
    with Context.fake(4) as ctx:
        with pytest.raises(TypeError, match=rf"^{what}: expected a dense tensor, but got a sparse_c.. one of shape "
                                            r"\(2, 2\); .*tensor\.to_dense\(\)"):
            calls(sparse)[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", sorted(calls(None)))
def test_not_a_tensor_is_a_type_error_naming_its_type_and_touches_no_group(what: str) -> None:
    with Context.fake(4) as ctx:
        with pytest.raises(TypeError, match=rf"^{what}: expected a torch.Tensor, but got list: \[1.0, 2.0\]; "
                                            r"make one with torch.tensor\(\.\.\.\)$"):
            calls([1.0, 2.0])[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", sorted(calls(None)))
def test_a_tensor_on_another_device_is_a_value_error_naming_both(what: str) -> None:
    with Context.fake(4) as ctx:
        with pytest.raises(ValueError, match=rf"^{what}: expected a tensor on the context's device cpu, but got "
                                             r"one on meta; move it first \(tensor.to\('cpu'\)\)$"):
            calls(torch.ones(4, device="meta"))[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", ["all_reduce", "reduce_scatter"])
def test_avg_of_an_integer_tensor_is_a_clear_error(what: str) -> None:
    with Context.fake(4) as ctx:
        call = getattr(ctx, what)
        with pytest.raises(TypeError, match=rf"^{what}: op='avg' divides, so it needs a floating-point tensor, but "
                                            r"got torch.int64; convert it \(tensor.float\(\)\) or use op='sum'$"):
            call(torch.arange(4), MESH, "tp", op="avg")
        assert ctx.stats()["groups_created"] == 0
        assert call(torch.arange(4), MESH, "tp", op="sum").dtype == torch.int64  # sum of integers is fine


def test_check_tensors_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^check_tensors: expected True or False, but got 'yes'$"):
        Context.fake(2, check_tensors="yes")


def odd_tensors(ctx: Context) -> dict[str, Any]:
    """Rank 3 passes a float64 tensor where the others pass float32; then one of another shape."""
    mesh = fmesh.make_mesh((4,), ("dp",), rank_map=[2, 3, 0, 1])
    seen: dict[str, Any] = {}
    for label, tensor in (("dtype", torch.ones(3, dtype=torch.float64 if ctx.rank == 3 else torch.float32)),
                          ("shape", torch.ones(3 if ctx.rank != 3 else 5))):
        try:
            ctx.all_reduce(tensor, mesh, "dp")
            seen[label] = ("no error", "")
        except Exception as error:
            seen[label] = (type(error).__name__, str(error))
    seen["after"] = ctx.all_reduce(torch.ones(2), mesh, "dp").tolist()  # the group is still in step
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"check_tensors": True}], ids=["default", "asked"])
def test_check_tensors_names_the_odd_rank_and_its_tensor(options: dict[str, Any]) -> None:
    results = succeeded(launch(odd_tensors, 4, timeout=120, **options))
    for rank, seen in enumerate(results):
        kind, message = seen["dtype"]
        assert kind == "TensorMismatchError", seen
        assert message.startswith(f"on rank {rank}: all_reduce along the group [2, 3, 0, 1] along axes ('dp',)")
        assert ("members hold different tensors: rank 3 holds a tensor of shape (3,) dtype torch.float64 in "
                "all_reduce('sum'), while ranks [0, 1, 2] hold shape (3,) dtype torch.float32 in all_reduce('sum')"
                ) in message
        kind, message = seen["shape"]
        assert kind == "TensorMismatchError", seen
        assert ("rank 3 holds a tensor of shape (5,) dtype torch.float32 in all_reduce('sum'), while ranks [0, 1, 2] "
                "hold shape (3,) dtype torch.float32") in message
        assert seen["after"] == [4.0, 4.0]


def unequal_gathers(ctx: Context) -> dict[str, Any]:
    """Rank 0 gathers 6 elements where rank 1 gathers 4 (gloo returned rank 1's bytes and garbage, unchecked), then a
    reduce_scatter along another dim, then an all_reduce on one rank against an all_gather on the other."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    seen: dict[str, Any] = {}
    calls: dict[str, Callable[[], Any]] = {
        "gather": lambda: ctx.all_gather(torch.arange(6.0) if ctx.rank == 0 else torch.arange(4.0) + 100, mesh),
        "dim": lambda: ctx.reduce_scatter(torch.ones(2, 2), mesh, dim=ctx.rank),
        "kind": lambda: (ctx.all_reduce if ctx.rank == 0 else ctx.all_gather)(torch.ones(2), mesh),
    }
    for label, call in calls.items():
        try:
            seen[label] = ("no error", call().tolist())
        except Exception as error:
            seen[label] = (type(error).__name__, str(error))
    seen["after"] = ctx.all_gather(torch.full((1,), float(ctx.rank)), mesh).tolist()  # the group is still in step
    return seen


@pytest.mark.slow
def test_by_default_unequal_calls_are_refused_on_every_member_before_any_byte_is_sent() -> None:
    for seen in succeeded(launch(unequal_gathers, 2, timeout=120)):
        assert seen["gather"][0] == "TensorMismatchError", seen
        assert ("rank 0 holds a tensor of shape (6,) dtype torch.float32 in all_gather(0); rank 1 holds a tensor of "
                "shape (4,) dtype torch.float32 in all_gather(0)") in seen["gather"][1], seen
        assert seen["dim"][0] == "TensorMismatchError" and "in reduce_scatter(0, 'sum'); rank 1" in seen["dim"][1]
        assert seen["kind"][0] == "TensorMismatchError", seen
        assert "in all_reduce('sum'); rank 1 holds a tensor of shape (2,) dtype torch.float32 in all_gather(0)" in (
            seen["kind"][1])
        assert seen["after"] == [0.0, 1.0], seen


def counted_all_reduces(ctx: Context) -> int:
    """How many all_reduce calls reach torch.distributed for one ``ctx.all_reduce`` on a group of two."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    ctx.materialize(mesh)
    real, count = torch.distributed.all_reduce, [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    torch.distributed.all_reduce = counting  # type: ignore[assignment]
    try:
        ctx.all_reduce(torch.ones(2), mesh)
    finally:
        torch.distributed.all_reduce = real
    return count[0]


@pytest.mark.slow
def test_the_check_is_one_small_all_reduce_and_off_costs_nothing() -> None:
    assert succeeded(launch(counted_all_reduces, 2)) == [2, 2]
    assert succeeded(launch(counted_all_reduces, 2, check_tensors=False)) == [1, 1]
