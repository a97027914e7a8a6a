"""NCCL's rules on CPU (``tests/strict_nccl.py``): what NCCL refuses is refused here too, and fmesh gives NCCL
only what it takes: a transposed input, or the transposed upstream gradient of ``y.t() @ A``, through every
collective and its backward; and a gradient of a gradient through the collectives is right."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import strict_nccl
import torch
from support import in_a_child, launch, succeeded

import fmesh
from fmesh import Context

Call = Callable[[Context, torch.Tensor], torch.Tensor]
MESH = fmesh.make_mesh((2,), ("dp",))
CALLS: dict[str, Call] = {
    "all_reduce": lambda ctx, x: ctx.all_reduce(x, MESH, "dp"),
    "broadcast": lambda ctx, x: ctx.broadcast(x, MESH, "dp", src=1),
    "all_gather": lambda ctx, x: ctx.all_gather(x, MESH, "dp", dim=1),
    "reduce_scatter": lambda ctx, x: ctx.reduce_scatter(x, MESH, "dp", dim=0),
    "all_to_all": lambda ctx, x: ctx.all_to_all(x, MESH, "dp", 0, 1),
    "shift": lambda ctx, x: ctx.shift(x, MESH, "dp", 1, wrap=True),
}


@pytest.fixture
def nccl_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NCCL's rules for this test (and the processes it forks), undone after it."""
    monkeypatch.setenv(strict_nccl.ENV, "1")
    for owner, name, replacement in strict_nccl.patches():
        monkeypatch.setattr(owner, name, replacement)
    yield


def test_strict_mode_refuses_what_nccl_refuses() -> None:
    with pytest.raises(ValueError, match="Tensors must be contiguous"):
        strict_nccl.check(torch.ones(2, 3).t())
    with pytest.raises(ValueError, match="Tensors must be CUDA and dense"):
        strict_nccl.check(torch.ones(2, 2).to_sparse())
    with pytest.raises(TypeError, match="Unsupported data type for NCCL"):
        strict_nccl.check(torch.ones(2, dtype=torch.int16))
    strict_nccl.check(torch.ones(2, 3))  # a dense, contiguous float tensor passes


def transposed(ctx: Context) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each collective: its output for a transposed input and for the same values laid out contiguously, and
    the input's gradient through ``y.t() @ A`` (a transposed upstream gradient) and through the same loss
    written with a contiguous upstream gradient."""
    found = {}
    for name, call in CALLS.items():
        base = (torch.arange(24.0).reshape(6, 4) + 100 * ctx.rank).t()  # (4, 6), not contiguous
        x = base.detach().requires_grad_(True)
        y = call(ctx, x)
        a = torch.arange(float(y.shape[0] * 3)).reshape(y.shape[0], 3)
        (y.t() @ a).sum().backward()
        reference_x = base.contiguous().requires_grad_(True)
        reference_y = call(ctx, reference_x)
        (reference_y * a.sum(1, keepdim=True).expand_as(reference_y).contiguous()).sum().backward()
        assert x.grad is not None and reference_x.grad is not None
        found[name] = (y.detach(), reference_y.detach(), x.grad, reference_x.grad)
    return found


@pytest.mark.usefixtures("nccl_rules")
def test_a_transposed_input_and_a_transposed_gradient_pass_every_collective_under_nccl_rules() -> None:
    for rank, outputs in enumerate(succeeded(launch(transposed, 2, timeout=120))):
        for name, (y, reference_y, grad, reference_grad) in outputs.items():
            torch.testing.assert_close(y, reference_y, msg=f"{name} on rank {rank}")
            torch.testing.assert_close(grad, reference_grad, msg=f"{name}'s backward on rank {rank}")


def second_order(ctx: Context) -> dict[str, torch.Tensor]:
    """The gradient of ``(g * w).sum()`` where ``g`` is the gradient of ``(y ** 3).sum()``, for ``y`` each
    collective of this rank's ``x`` (a gradient of a gradient through the collective and its backward)."""
    found = {}
    for name, call in CALLS.items():
        x = (torch.arange(8.0, dtype=torch.float64).reshape(4, 2) / 7 + ctx.rank).requires_grad_(True)
        y = call(ctx, x)
        (g,) = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
        w = torch.linspace(-1, 1, g.numel(), dtype=torch.float64).reshape(g.shape) * (ctx.rank + 1)
        (gg,) = torch.autograd.grad((g * w).sum(), x)
        found[name] = gg
    return found


def one_process_second_order() -> dict[str, list[torch.Tensor]]:
    """:func:`second_order` for both ranks at once, in one process with plain autograd (each collective written
    out): the sum of both ranks' losses, as fmesh's backward means."""
    xs = [(torch.arange(8.0, dtype=torch.float64).reshape(4, 2) / 7 + r).requires_grad_(True) for r in range(2)]
    define: dict[str, Callable[[list[torch.Tensor], int], torch.Tensor]] = {
        "all_reduce": lambda v, r: v[0] + v[1],
        "broadcast": lambda v, r: v[1] * 1,
        "all_gather": lambda v, r: torch.cat(v, 1),
        "reduce_scatter": lambda v, r: (v[0] + v[1]).chunk(2, 0)[r],
        "all_to_all": lambda v, r: torch.cat([v[0].chunk(2, 0)[r], v[1].chunk(2, 0)[r]], 1),
        "shift": lambda v, r: v[(r - 1) % 2] * 1,
    }
    found = {}
    for name, fn in define.items():
        g = [torch.zeros_like(x) if d is None else d for x, d in zip(xs, torch.autograd.grad(
            sum((fn(xs, r) ** 3).sum() for r in range(2)), xs, create_graph=True, allow_unused=True), strict=True)]
        ws = [torch.linspace(-1, 1, g[r].numel(), dtype=torch.float64).reshape(g[r].shape) * (r + 1)
              for r in range(2)]
        second = torch.autograd.grad(sum((g[r] * ws[r]).sum() for r in range(2)), xs, allow_unused=True)
        found[name] = [torch.zeros_like(x) if d is None else d for x, d in zip(xs, second, strict=True)]
    return found


def test_a_gradient_of_a_gradient_through_each_collective_equals_one_process() -> None:
    results = succeeded(launch(second_order, 2, timeout=120))
    expected = in_a_child(one_process_second_order)  # a gradient of a gradient here would keep this worker from forking
    for rank, found in enumerate(results):
        for name, gg in found.items():
            torch.testing.assert_close(gg, expected[name][rank], msg=f"{name} on rank {rank}")
