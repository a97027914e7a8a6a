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
        shard_map(checked, mesh=mesh, in_specs=spec, out_specs=P(), ctx=ctx)(torch.ones(2))
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
    regions["region, compiled"] = torch.compile(lambda *a: unchecked(*a), backend="aot_eager", fullgraph=True)
    device_mesh = ctx.device_mesh(mesh)
    dw1 = distribute_tensor(w1, device_mesh, [Shard(0)]).requires_grad_()
    dw2 = distribute_tensor(w2, device_mesh, [Shard(1)]).requires_grad_()
    dx = distribute_tensor(data, device_mesh, [Replicate()])
    mlp: dict[str, float] = {}
    steps = max(5, n // 20)
    for name, region in regions.items():
        def step(region: Any = region) -> None:
            region(data, w1l, w2l).to_local().backward()
        ctx.barrier(mesh, "tp")
        mlp[name] = _median_us(step, steps)

    def on_dtensor() -> None:
        F.linear(F.gelu(F.linear(dx, dw1)), dw2).sum().full_tensor().backward()
    ctx.barrier(mesh, "tp")
    mlp["DTensor"] = _median_us(on_dtensor, steps)
    return {"collectives": rows, "mlp": mlp}


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

            shard_map(checked, mesh=mesh, in_specs=spec, out_specs=P(), ctx=ctx)(torch.ones(2))
            rounds = [(_median_us(today, n), _median_us(lambda call=call: call(ax, x), n)) for _ in range(3)]
            out[name] = min(r[0] for r in rounds), min(r[1] for r in rounds), found[0]
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = parser.parse_args()
    import fmesh

    n = 50 if args.quick else 1000
    print("(a0) the Python cost of one collective, fake backend (no communication), best of 3 medians, µs\n")
    print("| collective | Context µs | region, checks off µs | overhead µs | region, checks on µs | overhead µs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (bare, off, on) in _python_cost(n * 5).items():
        print(f"| {name} | {bare:.2f} | {off:.2f} | {off - bare:+.2f} | {on:.2f} | {on - bare:+.2f} |")
    print()
    results = fmesh.launch(lambda ctx: _rank(ctx, n), 2, timeout=600, context_options={"timeout": 300})
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


if __name__ == "__main__":
    main()
