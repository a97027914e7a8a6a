"""A caller's mistake never breaks a group: what is refused before any byte is sent is the caller's error, raised
as such on the rank that made it, and the group stays healthy for the next collective, on every rank, and for
DTensor on the exported ``DeviceMesh``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import launch
from torch.distributed.tensor import Replicate, distribute_tensor

import fmesh
from fmesh import Context

MESH = fmesh.make_mesh((2,), ("dp",))


def mistakes_then_a_healthy_group(ctx: Context) -> Any:
    ctx.all_reduce(torch.ones(1), MESH, "dp")  # the group exists and works
    seen = []
    dtensor = distribute_tensor(torch.ones(2), ctx.device_mesh(MESH), [Replicate()])
    for name, call in [
        ("a DTensor", lambda: ctx.all_reduce(dtensor, MESH, "dp")),  # type: ignore[arg-type]
        ("a DTensor to all_gather", lambda: ctx.all_gather(dtensor, MESH, "dp")),  # type: ignore[arg-type]
        ("a list", lambda: ctx.all_reduce([1.0], MESH, "dp")),  # type: ignore[arg-type]
        ("a dim outside", lambda: ctx.all_gather(torch.ones(2), MESH, "dp", dim=3)),
    ]:
        with pytest.raises((TypeError, IndexError)) as caught:
            call()
        seen.append((name, type(caught.value).__name__, str(caught.value)))
    # torch's own refusal of the call on every rank (NotImplementedError, before any byte is sent): the
    # caller's, re-raised, and no roll call, no abort.
    original = dist.all_reduce

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("this backend cannot reduce this tensor")

    dist.all_reduce = refuse
    try:
        with pytest.raises(NotImplementedError, match="cannot reduce"):
            ctx.all_reduce(torch.ones(1), MESH, "dp")
    finally:
        dist.all_reduce = original
    total = ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), MESH, "dp").item()
    whole = dtensor.full_tensor().tolist()  # DTensor on the exported mesh still resolves its group
    summed = (dtensor * 2).redistribute(placements=[Replicate()]).to_local().tolist()
    return seen, total, whole, summed


@pytest.mark.slow
def test_a_callers_mistake_leaves_the_group_healthy() -> None:
    for seen, total, whole, summed in launch(mistakes_then_a_healthy_group, 2, timeout=60):
        assert [name for name, _, _ in seen] == ["a DTensor", "a DTensor to all_gather", "a list", "a dim outside"]
        assert seen[0][1] == "TypeError" and "dtensor.to_local()" in seen[0][2]  # the message names the way out
        assert seen[2][1] == "TypeError" and seen[3][1] == "IndexError"
        # fmesh's refusal at the door, not torch's IndexError from inside the collective
        assert "all_gather: expected dim in -1..0 for a tensor of shape (2,), but got 3" in seen[3][2], seen[3]
        assert (total, whole, summed) == (3.0, [1.0, 1.0], [2.0, 2.0])


def test_a_dtensor_is_refused_at_the_door_with_the_way_out() -> None:
    with Context.fake(2) as ctx, pytest.raises(TypeError, match=r"got a DTensor .*to_local\(\).*full_tensor\(\)"):
        ctx.all_reduce(distribute_tensor(torch.ones(2), ctx.device_mesh(MESH), [Replicate()]), MESH, "dp")


@pytest.mark.parametrize("name", ["all_gather", "reduce_scatter", "all_to_all"])
def test_a_dim_outside_the_tensor_is_refused_at_the_door_naming_the_valid_dims(name: str) -> None:
    calls = {
        "all_gather": lambda ctx, x: ctx.all_gather(x, MESH, "dp", dim=2),
        "reduce_scatter": lambda ctx, x: ctx.reduce_scatter(x, MESH, "dp", dim=-3),
        "all_to_all": lambda ctx, x: ctx.all_to_all(x, MESH, "dp", 0, 2),
    }
    with Context.fake(2) as ctx, pytest.raises(
            IndexError, match=rf"^{name}: expected \w+ in -2\.\.1 for a tensor of shape \(2, 2\), but got -?\d"):
        calls[name](ctx, torch.ones(2, 2))
