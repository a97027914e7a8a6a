"""Benchmark: the manual region's cost (fmesh.spmd.shard_map) on top of the Context's collectives, and a
tensor-parallel MLP in the region (eager, compiled) against the same MLP written on DTensor.

(a) Per collective, 2 gloo processes on loopback, a float32 tensor of 2 elements (``torch.ones(2)``), medians of
    individually timed calls:
    today's Context call (``ctx.sum_partials``, ``ctx.all_gather``, ``ctx.reduce_scatter``), the region's
    (``ax.psum``, ``ax.all_gather``, ``ax.psum_scatter``) with checks off, and with checks on (inside the region's
    type-tracking mode).
(a0) The same calls on the fake backend (one process, no communication), checks off and on: the Python cost
    alone, where a microsecond shows (gloo's own noise on loopback is tens of microseconds).
(b) A tensor-parallel MLP (column- then row-parallel, tp=2), forward + backward: the region eager (checked and
    unchecked), the region compiled (aot_eager, fullgraph), and DTensor (``distribute_tensor`` weights,
    ``F.linear`` on DTensors) on the same exported DeviceMesh.
(c) A Megatron tensor- and sequence-parallel transformer block (pre-LN attention and MLP, tp=2), forward +
    backward: the region eager (checked and unchecked) and compiled (aot_eager, fullgraph), against the same
    ``nn.Module`` parallelized by torch (``parallelize_module`` with ``SequenceParallel`` layer norms,
    ``PrepareModuleInput`` gathering the sequence, ``ColwiseParallel`` and
    ``RowwiseParallel(output_layouts=Shard(1))`` linears) on the same exported DeviceMesh, eager and compiled
    (aot_eager, fullgraph). A step ends with every gradient complete: DTensor leaves the layer norms' gradients
    pending (``Partial``) after backward, and its step reduces them (``redistribute`` to ``Replicate``, what the
    optimizer's step would do). A way that fails is a row saying so, with the error; the last column is each
    way's first loss minus DTensor's (the same computation).

The processes run with ``check_tensors=False``: the members' check of their tensors before each eager Context
collective (one small all_reduce each, measured in ``bench/collectives.py``) is off, as DTensor's collectives
make no such check.

(d) The steady state of the check (``check=True``: checked once per signature, then unchecked) against
    ``check=False`` on notebook 04's block, on the fake backend (the Python cost alone).

    python bench/spmd.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_us(fn: Callable[[], Any], n: int) -> float:
    for _ in range(max(3, n // 10)):
        fn()
    out = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(out)


def _rank(ctx: Any, n: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import fmesh
    from fmesh.spmd import P
    from fmesh.spmd.region import Axes, shard_map

    mesh = fmesh.make_mesh((2,), ("tp",))
    ctx.materialize(mesh)
    x = torch.ones(2)
    ax = Axes(ctx, mesh)
    rows: dict[str, tuple[float, float, float]] = {}
    pairs = {
        "psum": (lambda: ctx.sum_partials(x, mesh, "tp"), lambda a: a.psum(x, "tp"), P(partial="tp")),
        "all_gather": (lambda: ctx.all_gather(x, mesh, "tp", 0), lambda a: a.all_gather(x, "tp", 0), P("tp")),
        "psum_scatter": (lambda: ctx.reduce_scatter(x, mesh, "tp", 0), lambda a: a.psum_scatter(x, "tp", 0),
                         P(partial="tp")),
    }
    for name, (today, region_call, spec) in pairs.items():
        ctx.barrier(mesh, "tp")
        bare = _median_us(today, n)
        ctx.barrier(mesh, "tp")
        off = _median_us(lambda region_call=region_call: region_call(ax), n)
        found: list[float] = []

        def checked(a: Any, block: Any, region_call: Any = region_call, found: list[float] = found,
                    spec: Any = spec) -> Any:
            nonlocal x
            x = block  # the typed input
            found.append(_median_us(lambda: region_call(a), n))
            return a.psum(block, "tp") if spec.partial else a.all_gather_invariant(block, "tp", 0)

        ctx.barrier(mesh, "tp")
        shard_map(checked, mesh=mesh, in_specs=spec, out_specs=P(), ctx=ctx).local(torch.ones(2))
        x = torch.ones(2)
        rows[name] = (bare, off, found[0])

    g = torch.Generator().manual_seed(0)
    hidden, ffn, batch = 64, 256, 32
    data = torch.randn(batch, hidden, generator=g)
    w1, w2 = torch.randn(ffn, hidden, generator=g), torch.randn(hidden, ffn, generator=g)
    index = ctx.index(mesh, "tp")
    w1l = w1.chunk(2, 0)[index].clone().requires_grad_()
    w2l = w2.chunk(2, 1)[index].clone().requires_grad_()

    def body(a: Any, xb: Any, w1b: Any, w2b: Any) -> Any:
        return a.psum(F.linear(F.gelu(F.linear(xb, w1b)), w2b), "tp").sum()

    specs = dict(mesh=mesh, in_specs=(P(), P("tp", None), P(None, "tp")), out_specs=P(), ctx=ctx)
    regions = {"region, checked": shard_map(body, **specs), "region, unchecked": shard_map(body, check=False, **specs)}
    unchecked = regions["region, unchecked"]
    torch._dynamo.reset()
    regions["region, compiled"] = torch.compile(lambda *a: unchecked.local(*a), backend="aot_eager", fullgraph=True)
    device_mesh = ctx.device_mesh(mesh)
    dw1 = distribute_tensor(w1, device_mesh, [Shard(0)]).requires_grad_()
    dw2 = distribute_tensor(w2, device_mesh, [Shard(1)]).requires_grad_()
    dx = distribute_tensor(data, device_mesh, [Replicate()])
    mlp: dict[str, float] = {}
    steps = max(5, n // 20)
    for name, region in regions.items():
        def step(region: Any = region) -> None:
            (region.local if hasattr(region, "local") else region)(data, w1l, w2l).backward()
        ctx.barrier(mesh, "tp")
        mlp[name] = _median_us(step, steps)

    def on_dtensor() -> None:
        F.linear(F.gelu(F.linear(dx, dw1)), dw2).sum().full_tensor().backward()
    ctx.barrier(mesh, "tp")
    mlp["DTensor"] = _median_us(on_dtensor, steps)
    return {"collectives": rows, "mlp": mlp, "block": _block(ctx, mesh, steps)}


BLOCK = dict(batch=4, seq=32, hidden=64, heads=4, ffn=256)


def _block(ctx: Any, mesh: Any, steps: int) -> dict[str, Any]:
    """(c): each way's best of 3 medians, µs per forward + backward step (or the error that stopped it), and
    each way's first loss minus DTensor's."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from fmesh.spmd import P, Sharding
    from fmesh.spmd.region import shard_map

    b, s, h, heads, ffn = (BLOCK[k] for k in ("batch", "seq", "hidden", "heads", "ffn"))
    count = b * s * h

    def attention(x: Any, wq: Any, wk: Any, wv: Any) -> Any:  # this rank's heads, whatever their number
        bb, ss, _ = x.shape
        q, k, v = (w(x).view(bb, ss, -1, h // heads).transpose(1, 2) for w in (wq, wk, wv))
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(h // heads), dim=-1)
        return (scores @ v).transpose(1, 2).reshape(bb, ss, -1)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv = (nn.Linear(h, h, bias=False) for _ in range(3))
            self.wo = nn.Linear(h, h)

        def forward(self, x: Any) -> Any:
            return self.wo(attention(x, self.wq, self.wk, self.wv))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

        def forward(self, x: Any) -> Any:
            return self.w2(F.gelu(self.w1(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(h), Attention(), nn.LayerNorm(h), Mlp()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    torch.manual_seed(0)
    model = Block()
    data = torch.randn(b, s, h, generator=torch.Generator().manual_seed(1))
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = ["ln1.weight", "ln1.bias", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight",
             "attn.wo.bias", "ln2.weight", "ln2.bias", "mlp.w1.weight", "mlp.w1.bias", "mlp.w2.weight",
             "mlp.w2.bias"]
    specs = {"attn.wq.weight": P("tp", None), "attn.wk.weight": P("tp", None), "attn.wv.weight": P("tp", None),
             "attn.wo.weight": P(None, "tp"), "mlp.w1.weight": P("tp", None), "mlp.w1.bias": P("tp"),
             "mlp.w2.weight": P(None, "tp")}
    def mine(value: Any, spec: Any) -> Any:  # this rank's block, a leaf
        block = Sharding(mesh, spec).block(ctx.rank, value.shape)
        return value[tuple(slice(lo, hi) for lo, hi in block)].clone()

    weights = [mine(full[k], specs.get(k, P())).requires_grad_() for k in names]
    x_local = mine(data, P(None, "tp", None))

    def body(ax: Any, x: Any, ln1w: Any, ln1b: Any, wq: Any, wk: Any, wv: Any, wo: Any, bo: Any, ln2w: Any,
             ln2b: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
        ln1w, ln1b, bo, ln2w, ln2b, b2 = (ax.pvary(w, "tp") for w in (ln1w, ln1b, bo, ln2w, ln2b, b2))
        g = ax.all_gather(F.layer_norm(x, (h,), ln1w, ln1b), "tp", dim=1)  # the whole sequence
        a = F.linear(attention(g, *(lambda t, w=w: F.linear(t, w) for w in (wq, wk, wv))), wo)  # partial
        x = x + ax.psum_scatter(a, "tp", dim=1) + bo
        g = ax.all_gather(F.layer_norm(x, (h,), ln2w, ln2b), "tp", dim=1)
        y = x + ax.psum_scatter(F.linear(F.gelu(F.linear(g, w1, b1)), w2), "tp", dim=1) + b2
        return ax.psum((y ** 2).sum() / count, "tp")

    in_specs = [P(None, "tp", None)] + [specs.get(k, P()) for k in names]
    region_args = dict(mesh=mesh, in_specs=in_specs, out_specs=P(), ctx=ctx)
    unchecked = shard_map(body, check=False, **region_args)
    ways: dict[str, Any] = {"region, checked": shard_map(body, **region_args), "region, unchecked": unchecked}
    torch._dynamo.reset()
    ways["region, compiled"] = torch.compile(lambda *a: unchecked.local(*a), backend="aot_eager", fullgraph=True)

    device_mesh = ctx.device_mesh(mesh)
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(model, device_mesh, {
        "ln1": SequenceParallel(), "attn": gather, "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "ln2": SequenceParallel(), "mlp": gather, "mlp.w1": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    dx = distribute_tensor(data, device_mesh, [Shard(1)])

    def dtensor_loss(x: Any) -> Any:
        return (model(x) ** 2).sum() / count

    compiled_dtensor = torch.compile(dtensor_loss, backend="aot_eager", fullgraph=True)
    steps_of: dict[str, Any] = {name: (lambda way=way: (way.local if hasattr(way, "local") else way)(x_local, *weights))
                                for name, way in ways.items()}
    steps_of["DTensor (parallelize_module)"] = lambda: dtensor_loss(dx).full_tensor()
    steps_of["DTensor, compiled"] = lambda: compiled_dtensor(dx).full_tensor()
    found: dict[str, Any] = {}
    losses: dict[str, float] = {}
    for round_ in range(3):  # the ways in turn, three times: the best median of each (the machine is shared)
        for name, loss_of in steps_of.items():
            if isinstance(found.get(name), str):
                continue
            ctx.barrier(mesh, "tp")
            try:
                if round_ == 0:
                    losses[name] = float(loss_of().detach())

                def step(loss_of: Any = loss_of, dtensor: bool = name.startswith("DTensor")) -> None:
                    for w in model.parameters() if dtensor else weights:
                        w.grad = None
                    loss_of().backward()
                    if dtensor:  # gradients left pending (Partial: the layer norms') reduced, as a step would
                        for w in model.parameters():
                            if any(placement.is_partial() for placement in w.grad.placements):
                                w.grad = w.grad.redistribute(placements=[Replicate()])

                found[name] = min(found.get(name, math.inf), _median_us(step, steps))
            except Exception as error:  # a row saying what failed, not a missing row
                found[name] = f"fails: {type(error).__name__}: {str(error).splitlines()[0][:100]}"
                torch._dynamo.reset()
            ctx.barrier(mesh, "tp")
    base = losses.get("DTensor (parallelize_module)")
    found["loss differences"] = {k: abs(v - base) for k, v in losses.items()} if base is not None else {}
    found["loss"] = base
    return found


def _python_cost(n: int) -> dict[str, tuple[float, float, float]]:
    """The Python cost alone: the same calls on the fake backend (one process, no communication), the region's
    with checks off (an ``Axes`` with no types) and on (inside a checked region, on its typed input)."""
    import torch

    import fmesh
    from fmesh.spmd import P
    from fmesh.spmd.region import Axes, shard_map

    with fmesh.Context.fake(2) as ctx:
        mesh = fmesh.make_mesh((2,), ("tp",))
        ctx.materialize(mesh)
        x, ax = torch.ones(2), Axes(ctx, mesh)
        calls = {
            "psum": (lambda: ctx.sum_partials(x, mesh, "tp"), lambda a, b: a.psum(b, "tp"), P(partial="tp")),
            "all_gather": (lambda: ctx.all_gather(x, mesh, "tp", 0), lambda a, b: a.all_gather(b, "tp", 0), P("tp")),
            "psum_scatter": (lambda: ctx.reduce_scatter(x, mesh, "tp", 0), lambda a, b: a.psum_scatter(b, "tp", 0),
                             P(partial="tp")),
        }
        out = {}
        for name, (today, call, spec) in calls.items():
            found: list[float] = []

            def checked(a: Any, block: Any, call: Any = call, found: list[float] = found) -> Any:
                found.append(min(_median_us(lambda: call(a, block), n) for _ in range(3)))
                return a.psum(block, "tp") if spec.partial else a.all_gather_invariant(block, "tp", 0)  # noqa: B023

            shard_map(checked, mesh=mesh, in_specs=spec, out_specs=P(), ctx=ctx).local(torch.ones(2))
            rounds = [(_median_us(today, n), _median_us(lambda call=call: call(ax, x), n)) for _ in range(3)]
            out[name] = min(r[0] for r in rounds), min(r[1] for r in rounds), found[0]
        return out


def _steady(n: int) -> dict[str, float]:
    """(d) The steady state of the check: notebook 04's block (sequence- and tensor-parallel, (dp=2, tp=2), fake
    backend: the Python cost alone), forward + backward, checked (checked once, at its first call, then run
    unchecked) against unchecked, interleaved, best of 5 medians, µs."""
    import math

    import torch
    import torch.nn.functional as F

    import fmesh
    from fmesh.spmd import P, Sharding
    from fmesh.spmd.region import shard_map

    b, s, h, heads, ffn = 4, 8, 8, 4, 16
    shapes = {"ln1w": (h,), "ln1b": (h,), "wq": (h, h), "wk": (h, h), "wv": (h, h), "wo": (h, h), "bo": (h,),
              "ln2w": (h,), "ln2b": (h,), "w1": (ffn, h), "b1": (ffn,), "w2": (h, ffn), "b2": (h,)}
    specs = {"wq": P("tp", None), "wk": P("tp", None), "wv": P("tp", None), "wo": P(None, "tp"),
             "w1": P("tp", None), "b1": P("tp"), "w2": P(None, "tp")}
    names = tuple(shapes)

    def attention(x: Any, wq: Any, wk: Any, wv: Any, count: int) -> Any:
        bb, ss, _ = x.shape
        q, k, v = (F.linear(x, w).view(bb, ss, count, -1).transpose(1, 2) for w in (wq, wk, wv))
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(h // heads), dim=-1)
        return (scores @ v).transpose(1, 2).reshape(bb, ss, -1)

    def body(ax: Any, x: Any, *weights: Any) -> Any:
        p = dict(zip(names, weights, strict=True))
        for k in ("ln1w", "ln1b", "bo", "ln2w", "ln2b", "b2"):
            p[k] = ax.pvary(p[k], ("dp", "tp"))
        for k in specs:
            p[k] = ax.pvary(p[k], "dp")
        g = ax.all_gather(F.layer_norm(x, (h,), p["ln1w"], p["ln1b"]), "tp", dim=1)
        a = F.linear(attention(g, p["wq"], p["wk"], p["wv"], heads // 2), p["wo"])
        x = x + ax.psum_scatter(a, "tp", dim=1) + p["bo"]
        g = ax.all_gather(F.layer_norm(x, (h,), p["ln2w"], p["ln2b"]), "tp", dim=1)
        y = x + ax.psum_scatter(F.linear(F.gelu(F.linear(g, p["w1"], p["b1"])), p["w2"]), "tp", dim=1) + p["b2"]
        return ax.psum((y ** 2).sum() / (b * s * h), ("dp", "tp"))

    with fmesh.Context.fake(4) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        gen = torch.Generator().manual_seed(0)
        in_specs = [P("dp", "tp", None)] + [specs.get(k, P()) for k in names]
        whole = [torch.randn(b, s, h, generator=gen)] + [torch.randn(shapes[k], generator=gen) for k in names]
        blocks = [v[tuple(slice(lo, hi) for lo, hi in Sharding(mesh, spec).block(0, v.shape))].clone()
                  for v, spec in zip(whole, in_specs, strict=True)]
        for w in blocks[1:]:
            w.requires_grad_()
        ways = {check: shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P(), ctx=ctx, check=check)
                for check in (True, False)}
        found: dict[str, float] = {}
        for _ in range(5):
            for check, region in ways.items():
                def step(region: Any = region) -> None:
                    region.local(*blocks).backward()
                name = "checked" if check else "unchecked"
                found[name] = min(found.get(name, math.inf), _median_us(step, n))
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = parser.parse_args()
    import fmesh

    n = 20 if args.quick else 1000
    print("(a0) the Python cost of one collective, fake backend (no communication), best of 3 medians, µs\n")
    print("| collective | Context µs | region, checks off µs | overhead µs | region, checks on µs | overhead µs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (bare, off, on) in _python_cost(n * 5).items():
        print(f"| {name} | {bare:.2f} | {off:.2f} | {off - bare:+.2f} | {on:.2f} | {on - bare:+.2f} |")
    print()
    results = fmesh.launch(lambda ctx: _rank(ctx, n), 2, timeout=600,
                           context_options={"timeout": 300, "check_tensors": False})
    rows = results[0]["collectives"]
    print("(a) one collective, 2 gloo processes, torch.ones(2) (float32), median µs (rank 0)\n")
    print("| collective | Context µs | region, checks off µs | overhead µs | region, checks on µs |")
    print("| --- | --- | --- | --- | --- |")
    for name, (bare, off, on) in rows.items():
        print(f"| {name} | {bare:.1f} | {off:.1f} | {off - bare:+.1f} | {on:.1f} |")
    print("\n(b) tensor-parallel MLP (batch 32, hidden 64, ffn 256, tp=2), forward + backward, median µs (rank 0)\n")
    print("| how | µs |")
    print("| --- | --- |")
    for name, us in results[0]["mlp"].items():
        print(f"| {name} | {us:.0f} |")
    block = dict(results[0]["block"])
    differences, loss = block.pop("loss differences"), block.pop("loss")
    sizes = ", ".join(f"{k} {v}" for k, v in BLOCK.items())
    print(f"\n(c) tensor- and sequence-parallel transformer block ({sizes}, tp=2), forward + backward, best "
          "of 3 medians, µs (rank 0)\n")
    print("| how | µs | first loss - DTensor's |")
    print("| --- | --- | --- |")
    for name, us in block.items():
        shown = f"{us:.0f}" if isinstance(us, float) else us
        difference = f"{differences[name]:.1e}" if name in differences else "-"
        print(f"| block: {name} | {shown} | {difference} |")
    print(f"\nDTensor's first loss: {loss}")
    steady = _steady(max(20, n // 5))
    print("\n(d) the steady state of the check: notebook 04's block, (dp=2, tp=2), fake backend (the Python cost "
          "alone), forward + backward, best of 5 medians (interleaved), µs\n")
    print("| region | µs | / unchecked |")
    print("| --- | --- | --- |")
    for name, us in steady.items():
        print(f"| {name} | {us:.0f} | {us / steady['unchecked']:.3f} |")


if __name__ == "__main__":
    main()
