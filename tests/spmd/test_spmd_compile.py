"""The manual region inside ``torch.compile(fullgraph=True)``: no graph break, and the same values and gradients
as eager (unchecked; checks run eagerly), on every supported torch (2.10-2.12 included: the region reads the
exported DeviceMesh looked up in eager code, never hashing a mesh inside the trace). Two gloo processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support import patience
from torch.distributed.tensor import DTensor

import fmesh
from fmesh.spmd import P, Sharding, to_placements
from fmesh.spmd.region import Axes, shard_map


def body(ax: Axes, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Sequence-parallel MLP: gather the sequence, column- then row-parallel, reduce-scatter it back."""
    h = ax.all_gather(x, "tp", dim=0)
    y = ax.psum_scatter(F.linear(F.gelu(F.linear(h, w1)), w2), "tp", dim=0)
    index = ax.psum(x.new_zeros(()) + ax.axis_index("tp"), "tp")  # a number that differs per member, summed
    return ax.psum((y ** 2).sum(), "tp") + index * 0


def compiled(ctx: fmesh.Context) -> dict[str, Any]:
    mesh = fmesh.make_mesh((2,), ("tp",))
    ctx.materialize(mesh)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(2, 4, generator=g)
    w1, w2 = torch.randn(3, 4, generator=g), torch.randn(4, 3, generator=g)
    found: dict[str, Any] = {}
    region = shard_map(body, mesh=mesh, in_specs=(P("tp"), P("tp"), P(None, "tp")), out_specs=P(), ctx=ctx,
                       check=False)

    def step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return region.local(x, w1, w2)

    for how in ("eager", "compiled"):
        leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
        torch._dynamo.reset()
        run = step if how == "eager" else torch.compile(step, backend="aot_eager", fullgraph=True)
        loss = run(*leaves)
        loss.backward()
        found[how] = [loss.detach()] + [t.grad for t in leaves]
    torch._dynamo.reset()
    found["breaks"] = torch._dynamo.explain(step)(x, w1, w2).graph_break_count
    checked = shard_map(body, mesh=mesh, in_specs=(P("tp"), P("tp"), P(None, "tp")), out_specs=P(), ctx=ctx)
    found["checked"] = checked.local(x, w1, w2)

    # A region compiled before any eager call, given DTensors, called again with eager calls between: no recompile.
    torch._dynamo.reset()
    specs = (P("tp"), P("tp"), P(None, "tp"))
    fresh = shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), ctx=ctx, check=False)
    device_mesh = ctx.device_mesh(mesh)
    placed = [DTensor.from_local(t, device_mesh, to_placements(Sharding(mesh, s)), run_check=False)
              for t, s in zip((x, w1, w2), specs, strict=True)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        run = torch.compile(lambda *a: fresh(*a).to_local(), backend="aot_eager", fullgraph=True)
        found["dtensors"] = [(run(*placed), fresh(*placed).to_local()) for _ in range(3)]
    torch._dynamo.reset()
    return found


@pytest.mark.slow
def test_the_region_compiles_with_no_graph_break_and_equals_eager() -> None:
    results = fmesh.launch(compiled, 2, timeout=patience(400), context_options={"timeout": 300}, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
        assert result["breaks"] == 0
        for eager, got in zip(result["eager"], result["compiled"], strict=True):
            torch.testing.assert_close(got, eager)
        torch.testing.assert_close(result["checked"], result["eager"][0])
        for compiled_loss, eager_loss in result["dtensors"]:
            torch.testing.assert_close(compiled_loss, result["eager"][0])
            torch.testing.assert_close(eager_loss, result["eager"][0])
