"""Gradient accumulation by the types (JAX's ``reduced``/``unreduced``): an input declared ``P(reduced="dp")`` is
the same on every dp member, and its gradient is left a pending sum along dp (no collective in the backward), so
k micro-batches cost one reduction, where the gradient is used. On DTensors the gradient says so: its placement
along dp is ``Partial()``, which accumulation keeps and one ``redistribute`` completes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spmd_harness import MESH, block
from spmd_world import World
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import fmesh
from fmesh.spmd import P, shard_map

K = 3  # micro-batches per step
g = torch.Generator().manual_seed(5)
BATCHES = [torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(K)]
WEIGHT = torch.randn(4, 3, generator=g, dtype=torch.float64)


def loss(ax: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ax.psum(((x @ w) ** 2).sum(), "dp")


def loss_pvary(ax: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ax.psum(((x @ ax.pvary(w, "dp")) ** 2).sum(), "dp")


def test_k_micro_batches_cost_one_reduction_and_the_gradient_is_typed_partial_until_then() -> None:
    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("dp",))
        device_mesh = ctx.device_mesh(mesh)
        counts = {}
        for how, body, spec in (("reduced", loss, P(reduced="dp")), ("pvary", loss_pvary, P())):
            w = distribute_tensor(WEIGHT, device_mesh, [Replicate()]).requires_grad_()
            step = shard_map(body, mesh=mesh, in_specs=(P("dp"), spec), out_specs=P(), ctx=ctx)
            backward = 0
            for x in BATCHES:
                out = step(distribute_tensor(x, device_mesh, [Shard(0)]), w)
                with CommDebugMode() as comm:
                    out.backward()
                backward += comm.get_total_counts()
            assert w.grad is not None
            with CommDebugMode() as comm:
                whole = w.grad.redistribute(device_mesh, [Replicate()])
            counts[how] = (backward, comm.get_total_counts(), tuple(w.grad.placements))
            assert tuple(whole.placements) == (Replicate(),)
    assert counts["reduced"] == (0, 1, (Partial(),))  # no reduction per micro-batch; one where it is used
    assert counts["pvary"] == (K, 0, (Replicate(),))  # one per micro-batch


def test_the_accumulated_gradient_reduced_once_equals_one_process() -> None:
    reference = WEIGHT.clone().requires_grad_()
    for x in BATCHES:
        ((x @ reference) ** 2).sum().backward()

    def member(m: Any) -> Any:
        region = shard_map(loss, mesh=MESH, in_specs=(P("dp"), P(reduced="dp")), out_specs=P(), ctx=m)
        w = WEIGHT.clone().requires_grad_()
        backward = 0
        for x in BATCHES:
            out = region.local(block(x, P("dp"), m.rank), w)
            before = m.calls
            out.backward()
            backward += m.calls - before
        return backward, m.sum_partials(w.grad, MESH, "dp")  # the one reduction of the step

    for result in World(MESH).run(member):
        assert not isinstance(result, BaseException), result
        backward, grad = result
        assert backward == 0
        assert torch.allclose(grad, reference.grad)


def test_reduced_is_for_inputs() -> None:
    with fmesh.Context.fake(2) as ctx, pytest.raises(ValueError, match="reduced= is for inputs"):
        shard_map(loss, mesh=fmesh.make_mesh((2,), ("dp",)), in_specs=(P("dp"), P()), out_specs=P(reduced="dp"),
                  ctx=ctx)


def test_a_reduced_input_needs_no_pvary_and_refuses_one() -> None:
    with fmesh.Context.fake(2) as ctx, pytest.raises(fmesh.SpmdTypeError, match="drop this pvary"):
        shard_map(loss_pvary, mesh=fmesh.make_mesh((2,), ("dp",)), in_specs=(P("dp"), P(reduced="dp")),
                  out_specs=P(), ctx=ctx).local(torch.ones(4, 4), torch.ones(4, 3, requires_grad=True))
