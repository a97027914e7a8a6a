"""The region is checked once per signature (shapes, dtypes, requires_grad, grad mode), on copies of its inputs
with rehearsed collectives, then runs unchecked; under ``torch.compile(fullgraph=True)`` the same check runs while
Dynamo traces, so a mistake raises before the first compiled step. One process, the fake backend."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fmesh
from fmesh.errors import SpmdTypeError
from fmesh.spmd import P, shard_map
from fmesh.spmd.region import Region


def body(ax: Any, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, bug: bool = False) -> torch.Tensor:
    y = F.gelu(x @ w1) @ w2  # column- then row-parallel: a pending sum over tp
    return ax.psum(F.gelu(y) if bug else y, "tp").sum()


def region(ctx: fmesh.Context, bug: bool) -> Region:
    mesh = fmesh.make_mesh((2,), ("tp",))
    return shard_map(lambda ax, *a: body(ax, *a, bug=bug), mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                     out_specs=P(), ctx=ctx)


def inputs(n: int = 4) -> tuple[torch.Tensor, ...]:
    return torch.randn(n, 8), torch.randn(8, 4, requires_grad=True), torch.randn(4, 8, requires_grad=True)


def test_checked_once_per_signature_then_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    rehearsals: list[int] = []
    rehearse = Region._rehearse
    monkeypatch.setattr(Region, "_rehearse", lambda self, *a: (rehearsals.append(1), rehearse(self, *a))[1])
    with fmesh.Context.fake(2) as ctx:
        made = region(ctx, bug=False)
        for _ in range(3):
            made.local(*inputs())
        assert len(rehearsals) == 1
        made.local(*inputs(6))  # a new shape: checked again
        with torch.no_grad():
            made.local(*inputs(6))  # grad mode is part of the signature
        assert len(rehearsals) == 3 and len(made.checked) == 3


def test_a_mistake_raises_before_any_step_and_again_on_the_next_call() -> None:
    with fmesh.Context.fake(2) as ctx:
        made = region(ctx, bug=True)
        for _ in range(2):  # not remembered as checked
            with pytest.raises(SpmdTypeError, match=r"gelu on .*partial along 'tp'.*fix: ax.psum\("):
                made.local(*inputs())
        assert made.checked == set()


def _cause(error: BaseException | None) -> BaseException | None:
    while error is not None and not isinstance(error, SpmdTypeError):
        error = error.__cause__ or error.__context__
    return error


@pytest.mark.parametrize("bug", [False, True])
def test_under_torch_compile_fullgraph_the_check_runs_while_tracing(bug: bool) -> None:
    with fmesh.Context.fake(2) as ctx:  # no ctx.materialize: the region makes (and looks up) its groups
        made = region(ctx, bug)
        torch._dynamo.reset()
        step = torch.compile(lambda *a: made.local(*a), backend="aot_eager", fullgraph=True, dynamic=False)
        if not bug:
            assert step(*inputs()).shape == ()
            assert len(made.checked) == 1  # the signature Dynamo traced was checked
            return
        with pytest.raises(Exception) as raised:  # Dynamo wraps what a trace-time callee raises
            step(*inputs())
        found = _cause(raised.value)
        assert isinstance(found, SpmdTypeError), raised.value
        assert "partial along 'tp'" in str(found) and "fix: ax.psum(" in str(found)
    torch._dynamo.reset()


def test_a_plain_tensor_where_a_spec_splits_is_refused_not_taken_as_the_block() -> None:
    with fmesh.Context.fake(2) as ctx:
        made = region(ctx, bug=False)
        with pytest.raises(TypeError, match=r"input 1: expected a DTensor for in_specs\[1\] = P\(None, 'tp'\), but "
                                            r"got a plain tensor .*is it the whole, or this rank's block\?"):
            made(*inputs())


def test_pytrees_in_and_out_with_spec_prefixes() -> None:
    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("tp",))
        made = shard_map(lambda ax, p: {"y": ax.psum(p["x"] @ p["w"], "tp"), "n": p["x"] * 2},
                         mesh=mesh, in_specs=({"x": P(None, "tp"), "w": P("tp")},),
                         out_specs={"y": P(), "n": P(None, "tp")}, ctx=ctx)
        out = made.local({"x": torch.ones(3, 2), "w": torch.ones(2, 5)})
        assert out["y"].shape == (3, 5) and out["n"].shape == (3, 2)


def test_a_type_error_names_every_axis_it_needs_at_once() -> None:
    with fmesh.Context.fake(4) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        made = shard_map(lambda ax, x, w: x * w, mesh=mesh, in_specs=(P("dp", "tp"), P()), out_specs=P("dp", "tp"),
                         ctx=ctx, names=("x", "w"))
        with pytest.raises(SpmdTypeError, match=r"w wants a gradient and is invariant along \('dp', 'tp'\).*fix: "
                                                r"ax.pvary\(w, \('dp', 'tp'\)\)"):
            made.local(torch.ones(2, 2), torch.ones(1, requires_grad=True))


def test_a_region_over_two_axes_compiled_first_finds_its_groups() -> None:
    with fmesh.Context.fake(4) as ctx:  # a psum over both axes at once: its group made by the region, in eager
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        made = shard_map(lambda ax, x: ax.psum(x, ("dp", "tp")).sum(), mesh=mesh, in_specs=P(partial=("dp", "tp")),
                         out_specs=P(), ctx=ctx)
        torch._dynamo.reset()
        step = torch.compile(lambda x: made.local(x), backend="aot_eager", fullgraph=True, dynamic=False)
        assert step(torch.ones(3)).shape == ()
    torch._dynamo.reset()


def test_a_compiled_region_returning_loss_and_output_differentiates_the_loss_alone() -> None:
    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("tp",))
        made = shard_map(lambda ax, x, w: (ax.psum((x @ w).sum(), "tp"), x @ w), mesh=mesh,
                         in_specs=(P(None, "tp"), P("tp")), out_specs=(P(), P(partial="tp")), ctx=ctx)
        torch._dynamo.reset()
        step = torch.compile(lambda x, w: made.local(x, w), backend="aot_eager", fullgraph=True, dynamic=False)
        w = torch.ones(2, 3, requires_grad=True)
        loss, y = step(torch.ones(4, 2), w)
        loss.backward()
        assert y.shape == (4, 3) and w.grad is not None and w.grad.shape == (2, 3)
    torch._dynamo.reset()
