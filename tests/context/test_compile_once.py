"""A compiled function that calls a collective compiles once: ten calls with ``dynamic=False`` and
``fullgraph=True``, one frame compiled, no recompile (torch's funcol does the same on the same code).

The Context's bookkeeping (its cache-hit counter, the thread that drives a group) is eager's: a counter written
while Dynamo traces becomes a guard on its value, which fails on the next call, so every call recompiled (and the
ninth hit ``FailOnRecompileLimitHit``). A fake Context runs each collective on shapes alone, so this needs no process.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from support import in_a_child
from torch._dynamo.testing import CompileCounter

import fmesh

MESH = fmesh.make_mesh((2, 2), ("dp", "tp"))
CALLS: dict[str, Callable[[fmesh.Context, torch.Tensor], torch.Tensor]] = {
    "all_reduce": lambda ctx, x: ctx.all_reduce(x, MESH, "tp"),
    "all_reduce pair": lambda ctx, x: ctx.all_reduce(x, MESH, ("tp", "dp"), op="avg"),
    "all_gather": lambda ctx, x: ctx.all_gather(x, MESH, "tp", dim=1),
    "reduce_scatter": lambda ctx, x: ctx.reduce_scatter(x, MESH, "tp"),
    "broadcast": lambda ctx, x: ctx.broadcast(x, MESH, "tp", src=1),
    "all_to_all": lambda ctx, x: ctx.all_to_all(x, MESH, "tp", 0, 1),
    "ppermute": lambda ctx, x: ctx.ppermute(x, MESH, "tp", [(0, 1)]),
    "shift": lambda ctx, x: ctx.shift(x, MESH, "tp", offset=1, wrap=True),
    "sum_gradients": lambda ctx, x: ctx.sum_gradients(x, MESH, "tp"),
    "sum_partials": lambda ctx, x: ctx.sum_partials(x, MESH, "tp"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_ten_calls_compile_once(name: str) -> None:
    in_a_child(lambda: ten_calls(name))  # Dynamo in this worker would keep it from forking later tests' ranks


def ten_calls(name: str) -> None:
    torch._dynamo.reset()
    with fmesh.Context.fake(4) as ctx:
        ctx.materialize(MESH, (MESH, ("tp", "dp")))
        counter = CompileCounter()
        call = CALLS[name]
        compiled = torch.compile(lambda x: call(ctx, x) * 2, backend=counter, fullgraph=True, dynamic=False)
        x = torch.ones(4, 2)
        for _ in range(10):
            compiled(x)
        assert counter.frame_count == 1, f"{name}: {counter.frame_count} compilations in 10 calls"
        assert ctx.stats()["cache_hits"] >= 1  # eager bookkeeping still counted (materialize, sharing)
