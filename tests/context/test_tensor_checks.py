"""Tensors checked at the door of every tensor collective, before any group is touched; and the opt-in
cross-rank check (``Context(check_tensors=True)``) that names the rank whose tensor differs."""

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
def test_check_tensors_names_the_odd_rank_and_its_tensor() -> None:
    results = succeeded(launch(odd_tensors, 4, timeout=120, check_tensors=True))
    for rank, seen in enumerate(results):
        kind, message = seen["dtype"]
        assert kind == "TensorMismatchError", seen
        assert message.startswith(f"on rank {rank}: all_reduce along the group [2, 3, 0, 1] along axes ('dp',)")
        assert ("members hold different tensors: rank 3 holds a tensor of shape (3,) dtype torch.float64, while "
                "ranks [0, 1, 2] hold shape (3,) dtype torch.float32") in message
        kind, message = seen["shape"]
        assert kind == "TensorMismatchError", seen
        assert ("rank 3 holds a tensor of shape (5,) dtype torch.float32, while ranks [0, 1, 2] hold shape (3,) "
                "dtype torch.float32") in message
        assert seen["after"] == [4.0, 4.0]
