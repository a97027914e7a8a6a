"""A Megatron tensor- and sequence-parallel transformer block in the manual region, on a (dp=2, tp=2) mesh of 4
gloo processes, against the same block in one process; and seeded mistakes, each caught in the forward pass.

Everything runs inside one 4-process launch: the correct program (checked, and unchecked), then each seeded
mistake (its forward only), then the backward of an invariant all_gather. The parent compares.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support import patience
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import fmesh
from fmesh.errors import SpmdTypeError
from fmesh.spmd import P, Sharding
from fmesh.spmd.placements import to_placements
from fmesh.spmd.region import Axes, shard_map

B, S, H, HEADS, FFN = 4, 4, 8, 4, 16
NAMES = ("ln1w", "ln1b", "wq", "wk", "wv", "wo", "bo", "ln2w", "ln2b", "w1", "b1", "w2", "b2")
SPECS = {  # column-parallel weights split their outputs over tp, row-parallel ones their inputs
    "ln1w": P(), "ln1b": P(), "wq": P("tp", None), "wk": P("tp", None), "wv": P("tp", None), "wo": P(None, "tp"),
    "bo": P(), "ln2w": P(), "ln2b": P(), "w1": P("tp", None), "b1": P("tp"), "w2": P(None, "tp"), "b2": P(),
}
X_SPEC = P("dp", "tp", None)  # batch over dp, sequence over tp (sequence parallel)
STEPS, LR = 3, 0.1

# Each seeded mistake: name -> (what is wrong, how its message names the offending value). Each must raise
# SpmdTypeError in the forward pass, naming that value, an axis and the fix.
BUGS = {
    "ln weight not pvaried over tp": (
        "LN weights meet sequence-sharded activations; their gradient is never summed", "ln1w"),
    "bias bo not pvaried over tp": ("a replicated bias added to sequence-sharded activations", "bo"),
    "column weight not pvaried over dp": ("the data-parallel gradient sum forgotten (DDP's all_reduce)", "wq"),
    "pvary twice": ("a doubled gradient reduction over dp", "wk"),
    "all_gather where psum_scatter belongs": (
        "row-parallel partial output gathered instead of reduce-scattered", "linear(reshape(…), wo)"),
    "psum then psum_scatter": ("a doubled reduction of the attention output", "psum(linear(…), 'tp')"),
    "loss psum twice": ("a doubled reduction of the loss", "psum(div(…), ('dp', 'tp'))"),
    "gelu on partial": ("a non-linear op on the row-parallel partial output", "linear(gelu(linear(…)), w2)"),
    "bias before reduce": ("the row-parallel bias added to a partial sum (added once per member)",
                           "adds b2 (as a bias)"),
    "residual without reduce": ("the row-parallel output added to the residual unreduced", "linear(reshape(…), wo)"),
    "wrong axis": ("the attention output reduce-scattered over dp instead of tp",
                   "psum_scatter of linear(reshape(…), wo)"),
    "loss not reduced over dp": (
        "out spec claims the loss replicated but it varies over dp", "output 0: psum(div(…), 'tp')"),
    "sum vs mean over dp": (
        "each member's mean loss summed over dp and tp: dp x tp times the mean", "psum(mean(…), ('dp', 'tp'))"),
    "out spec claims replicated": (
        "the block output is sequence-sharded but its out spec says replicated over tp", "output 1: add(add("),
    "out spec wrong dimension": (
        "the block output is split at the sequence dim but its spec names the hidden dim", "output 1: add(add("),
    "gather over the wrong axis": (
        "the sequence gathered over dp (which splits the batch) instead of tp", "layernorm(x, ln1w, ln1b)"),
    "no sequence gather": (
        "the sequence-parallel gather before the column-parallel projections forgotten", "layernorm(x, ln1w, ln1b)"),
}


def parameters(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"ln1w": (H,), "ln1b": (H,), "wq": (H, H), "wk": (H, H), "wv": (H, H), "wo": (H, H), "bo": (H,),
              "ln2w": (H,), "ln2b": (H,), "w1": (FFN, H), "b1": (FFN,), "w2": (H, FFN), "b2": (H,)}
    params = {k: torch.randn(s, generator=g, dtype=torch.float64) / math.sqrt(s[-1]) for k, s in shapes.items()}
    params["ln1w"] += 1
    params["ln2w"] += 1
    return params


def data(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, S, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def attention(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, _ = x.shape
    q, k, v = (F.linear(x, w).view(b, s, heads, -1).transpose(1, 2) for w in (wq, wk, wv))
    scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(H // HEADS), dim=-1)
    return (scores @ v).transpose(1, 2).reshape(b, s, -1)


def block(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The single-process block: pre-LN attention and MLP with residuals."""
    h = F.layer_norm(x, (H,), p["ln1w"], p["ln1b"])
    x = x + F.linear(attention(h, p["wq"], p["wk"], p["wv"], HEADS), p["wo"], p["bo"])
    h = F.layer_norm(x, (H,), p["ln2w"], p["ln2b"])
    return x + F.linear(F.gelu(F.linear(h, p["w1"], p["b1"])), p["w2"], p["b2"])


def reference() -> dict[str, Any]:
    params = {k: v.clone().requires_grad_() for k, v in parameters().items()}
    x = data()
    found: dict[str, Any] = {}
    for step in range(STEPS):
        y = block(x, params)
        loss = (y ** 2).mean()
        loss.backward()
        if step == 0:
            found["loss"], found["y"] = loss.item(), y.detach()
            found["grads"] = {k: v.grad.clone() for k, v in params.items()}  # type: ignore[union-attr]
        with torch.no_grad():
            for v in params.values():
                v -= LR * v.grad
                v.grad = None
    found["params"] = {k: v.detach() for k, v in params.items()}
    return found


def program(ax: Axes, bug: str, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block on this rank's blocks: sequence-parallel LN, column- then row-parallel linears."""
    p = dict(zip(NAMES, weights, strict=True))
    everywhere = ("dp", "tp")
    for k in ("ln1w", "ln1b", "bo", "ln2w", "ln2b", "b2"):  # replicated, used on sequence-sharded values
        if (bug, k) in (("ln weight not pvaried over tp", "ln1w"), ("bias bo not pvaried over tp", "bo")):
            p[k] = ax.pvary(p[k], "dp")
        else:
            p[k] = ax.pvary(p[k], everywhere)
    for k in ("wq", "wk", "wv", "wo", "w1", "b1", "w2"):  # sharded over tp, replicated over dp
        if not (bug == "column weight not pvaried over dp" and k == "wq"):
            p[k] = ax.pvary(p[k], "dp")
    if bug == "pvary twice":
        p["wk"] = ax.pvary(p["wk"], "dp")

    h = F.layer_norm(x, (H,), p["ln1w"], p["ln1b"])
    if bug == "gather over the wrong axis":
        h = ax.all_gather(h, "dp", dim=1)
    elif bug != "no sequence gather":
        h = ax.all_gather(h, "tp", dim=1)  # the whole sequence, for the column-parallel projections
    a = F.linear(attention(h, p["wq"], p["wk"], p["wv"], HEADS // ax.axis_size("tp")), p["wo"])  # partial over tp
    if bug == "all_gather where psum_scatter belongs":
        a = ax.all_gather(a, "tp", dim=1)
    elif bug == "psum then psum_scatter":
        a = ax.psum_scatter(ax.psum(a, "tp"), "tp", dim=1)
    elif bug == "wrong axis":
        a = ax.psum_scatter(a, "dp", dim=0)
    elif bug != "residual without reduce":
        a = ax.psum_scatter(a, "tp", dim=1)
    x = x + a + p["bo"]

    h = ax.all_gather(F.layer_norm(x, (H,), p["ln2w"], p["ln2b"]), "tp", dim=1)
    f = F.gelu(F.linear(h, p["w1"], p["b1"]))
    if bug == "bias before reduce":
        y = ax.psum_scatter(F.linear(f, p["w2"], p["b2"]), "tp", dim=1)
    elif bug == "gelu on partial":
        y = ax.psum_scatter(F.gelu(F.linear(f, p["w2"])), "tp", dim=1) + p["b2"]
    else:
        y = ax.psum_scatter(F.linear(f, p["w2"]), "tp", dim=1) + p["b2"]
    y = x + y

    local = (y ** 2).mean() if bug == "sum vs mean over dp" else (y ** 2).sum() / (B * S * H)
    if bug == "loss psum twice":
        loss = ax.psum(ax.psum(local, everywhere), "dp")
    elif bug == "loss not reduced over dp":
        loss = ax.psum(local, "tp")
    else:
        loss = ax.psum(local, everywhere)
    return loss, y


def out_specs(bug: str) -> tuple[P, P]:
    y = {"out spec claims replicated": P("dp", None, None), "out spec wrong dimension": P("dp", None, "tp")}
    return P(), y.get(bug, X_SPEC)


def blocks(ctx: fmesh.Context, mesh: fmesh.Mesh) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """This rank's block of the data and of every parameter (leaves that want a gradient)."""
    def mine(value: torch.Tensor, spec: P) -> torch.Tensor:
        block = Sharding(mesh, spec).block(ctx.rank, value.shape)
        return value[tuple(slice(a, b) for a, b in block)].clone()
    params = parameters()
    return mine(data(), X_SPEC), [mine(params[k], SPECS[k]).requires_grad_() for k in NAMES]


def train(ctx: fmesh.Context, mesh: fmesh.Mesh, check: bool) -> dict[str, Any]:
    x, weights = blocks(ctx, mesh)
    region = shard_map(lambda ax, *a: program(ax, "", *a), mesh=mesh, in_specs=[X_SPEC] + [SPECS[k] for k in NAMES],
                       out_specs=out_specs(""), ctx=ctx, check=check, names=("x", *NAMES))
    found: dict[str, Any] = {}
    for step in range(STEPS):
        loss, y = region.local(x, *weights)
        loss.backward()
        if step == 0:
            found["loss"], found["y"] = loss.item(), y.detach()
            found["grads"] = {k: w.grad.clone() for k, w in zip(NAMES, weights, strict=True)}
        with torch.no_grad():
            for w in weights:
                w -= LR * w.grad
                w.grad = None
    found["params"] = {k: w.detach() for k, w in zip(NAMES, weights, strict=True)}
    return found


def seeded(ctx: fmesh.Context, mesh: fmesh.Mesh, bug: str) -> str:
    """The message the forward of ``bug`` raised, or ``"no error"``."""
    x, weights = blocks(ctx, mesh)
    region = shard_map(lambda ax, *a: program(ax, bug, *a), mesh=mesh, in_specs=[X_SPEC] + [SPECS[k] for k in NAMES],
                       out_specs=out_specs(bug), ctx=ctx, names=("x", *NAMES))
    try:
        region.local(x, *weights)
    except SpmdTypeError as error:
        return str(error)
    return "no error"


def backward_nodes(grad_fn: Any) -> set[str]:
    seen, stack, names = set(), [grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


def gathers(ctx: fmesh.Context, mesh: fmesh.Mesh) -> dict[str, Any]:
    """An invariant all_gather's backward (a local slice, no collective) against the varying one's."""
    found: dict[str, Any] = {}
    for how, axes in (("all_gather_invariant", "tp"), ("all_gather", "tp"), ("invariant over both", ("dp", "tp"))):
        x = (torch.arange(4.0) + 10 * ctx.rank).requires_grad_()
        weight = torch.arange(4.0 * Axes(ctx, mesh).axis_size(axes))

        ax = Axes(ctx, mesh)
        g = getattr(ax, "all_gather" if how == "all_gather" else "all_gather_invariant")(x, axes, dim=0)
        loss = (g * weight).sum()
        found[how] = {"nodes": sorted(backward_nodes(loss.grad_fn))}
        loss.backward()
        found[how]["grad"] = x.grad.tolist()  # type: ignore[union-attr]
    return found


AGREE_SPECS = (X_SPEC, P(("dp", "tp")), P(None, ("dp", "tp")), P("tp", "dp"), P(None, None, "tp"), P())


def with_dtensor(ctx: fmesh.Context, mesh: fmesh.Mesh) -> dict[str, Any]:
    """Each spec's blocks reassembled by DTensor; an MLP in the region against the same MLP on DTensors."""
    whole = torch.arange(float(B * S * H)).reshape(B, S, H)
    device_mesh = ctx.device_mesh(mesh)
    found: dict[str, Any] = {"blocks": [bool(torch.equal(DTensor.from_local(
        local(whole, spec, ctx.rank), device_mesh, to_placements(Sharding(mesh, spec)), run_check=False
    ).full_tensor(), whole)) for spec in AGREE_SPECS]}
    x, params = data(), parameters()
    w1, w2 = params["w1"], params["w2"]
    mlp = shard_map(lambda ax, x, w1, w2: ax.psum(F.linear(F.gelu(F.linear(x, w1)), w2), "tp"), mesh=mesh,
                    in_specs=(P(), P("tp", None), P(None, "tp")), out_specs=P(), ctx=ctx)
    region = mlp.local(x, local(w1, P("tp", None), ctx.rank), local(w2, P(None, "tp"), ctx.rank))
    tp = device_mesh["tp"]
    dx = distribute_tensor(x, tp, [Replicate()])
    on_dtensor = F.linear(F.gelu(F.linear(dx, distribute_tensor(w1, tp, [Shard(0)]))),
                          distribute_tensor(w2, tp, [Shard(1)])).full_tensor()
    found["mlp"] = float((region - on_dtensor).abs().max())
    return found


def everything(ctx: fmesh.Context) -> dict[str, Any]:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    ctx.materialize(mesh)
    return {"checked": train(ctx, mesh, True), "unchecked": train(ctx, mesh, False),
            "bugs": {bug: seeded(ctx, mesh, bug) for bug in BUGS}, "gathers": gathers(ctx, mesh),
            "dtensor": with_dtensor(ctx, mesh)}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    found = fmesh.launch(everything, 4, timeout=patience(300), context_options={"timeout": 120}, return_exceptions=True)
    for result in found:
        if isinstance(result, BaseException):
            raise result
    return found


def local(value: torch.Tensor, spec: P, rank: int) -> torch.Tensor:
    """``rank``'s block of ``value`` under ``spec`` on the (dp=2, tp=2) mesh."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    return value[tuple(slice(a, b) for a, b in Sharding(mesh, spec).block(rank, value.shape))]


@pytest.mark.slow
def test_the_region_equals_the_single_process_block(results: list[dict[str, Any]]) -> None:
    want = reference()
    for rank, result in enumerate(results):
        for run in ("checked", "unchecked"):
            got = result[run]
            assert got["loss"] == pytest.approx(want["loss"], abs=1e-5), (rank, run)
            torch.testing.assert_close(got["y"], local(want["y"], X_SPEC, rank), atol=1e-5, rtol=0)
            for k in NAMES:
                torch.testing.assert_close(got["grads"][k], local(want["grads"][k], SPECS[k], rank),
                                           atol=1e-5, rtol=0, msg=f"rank {rank} {run} grad {k}")
                torch.testing.assert_close(got["params"][k], local(want["params"][k], SPECS[k], rank),
                                           atol=1e-5, rtol=0, msg=f"rank {rank} {run} param {k}")


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_seeded_mistake_raises_in_the_forward_naming_value_axis_and_fix(
        results: list[dict[str, Any]], bug: str) -> None:
    for result in results:
        message = result["bugs"][bug]
        assert message != "no error", bug
        assert "fix:" in message and ("'tp'" in message or "'dp'" in message), message
        assert BUGS[bug][1] in message, (BUGS[bug][1], message)  # the offending value, by name
    if bug == "sum vs mean over dp":  # summed over dp and tp: 4 times the mean, not 2
        assert "divide it by 4" in message and "ax.pmean(..., ('dp', 'tp'))" in message, message


@pytest.mark.slow
def test_an_invariant_all_gather_differentiates_with_no_collective(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        invariant, varying = result["gathers"]["all_gather_invariant"], result["gathers"]["all_gather"]
        collectives = [n for n in invariant["nodes"] if "Collective" in n]
        assert collectives == [], invariant
        assert any("Collective" in n for n in varying["nodes"]), varying
        index = rank % 2
        assert invariant["grad"] == [float(i) for i in range(4 * index, 4 * index + 4)]
        # over (dp, tp) on the row-major 2 x 2 mesh, rank r is the r-th member: its slice of arange(16)
        both = result["gathers"]["invariant over both"]
        assert both["grad"] == [float(i) for i in range(4 * rank, 4 * rank + 4)], (rank, both)
        assert [n for n in both["nodes"] if "Collective" in n] == [], both


@pytest.mark.slow
def test_the_region_and_dtensor_agree(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["dtensor"]["blocks"] == [True] * len(AGREE_SPECS)
        assert result["dtensor"]["mlp"] < 1e-10
