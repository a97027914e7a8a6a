"""Benchmark: the cost model (``fmesh.cost``) against what gloo on loopback measures on this machine.

Calibrate a loopback link profile on broadcasts only (2 and 4 processes, 4 KiB and 16 MiB: a latency per
step, a launch latency and a bandwidth), then predict ``all_reduce``, ``all_gather``, ``reduce_scatter`` and
``all_to_all`` with it and compare with their measured medians (``ctx.<collective>`` on ``fmesh.launch``
processes, each call timed alone after a barrier). One host, so every step is an "intra" step.

    python bench/costs.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = [("4 KiB", 2**12), ("1 MiB", 2**20), ("16 MiB", 2**24)]
COLLECTIVES = ("broadcast", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _measure_rank(ctx: Any, repeats: dict[str, int]) -> dict[tuple[str, int], float]:
    """Median seconds of each collective and size on this rank (``nbytes`` in the model's convention)."""
    import torch

    import fmesh

    world = ctx.world_size
    mesh = fmesh.make_mesh((world,), ("g",))
    results: dict[tuple[str, int], float] = {}
    for _, nbytes in SIZES:
        n = repeats["large" if nbytes > 2**20 else "small"]
        full = torch.zeros(nbytes // 4)  # float32: the whole buffer / the all_gather output / the scatter input
        part = torch.zeros(nbytes // 4 // world)
        calls = {
            "broadcast": lambda full=full: ctx.broadcast(full, mesh, "g"),
            "all_reduce": lambda full=full: ctx.all_reduce(full, mesh, "g"),
            "all_gather": lambda part=part: ctx.all_gather(part, mesh, "g"),
            "reduce_scatter": lambda full=full: ctx.reduce_scatter(full, mesh, "g"),
            "all_to_all": lambda full=full: ctx.all_to_all(full, mesh, "g"),
        }
        for name, call in calls.items():
            call()  # warm-up (and the group's first use)
            times = []
            for _ in range(n):
                ctx.barrier(mesh, "g")
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            results[(name, nbytes)] = statistics.median(times)
    return results


def measure(worlds: list[int], repeats: dict[str, int]) -> dict[int, dict[tuple[str, int], float]]:
    import fmesh

    out = {}
    for world in worlds:
        per_rank = fmesh.launch(functools.partial(_measure_rank, repeats=repeats), world, timeout=600,
                                start_method="forkserver")
        # the slowest rank's median: a collective ends when its last member does
        out[world] = {key: max(rank[key] for rank in per_rank) for key in per_rank[0]}
    return out


def calibrate(measured: dict[int, dict[tuple[str, int], float]]) -> Any:
    """A loopback profile from broadcasts alone: t(p, n) = base + (p - 1) * a + n / B."""
    from fmesh.plan.costs import Links

    small, large = SIZES[0][1], SIZES[-1][1]
    t2s, t4s = measured[2][("broadcast", small)], measured[4][("broadcast", small)]
    step = max((t4s - t2s) / 2, 0.0)
    base = max(t2s - step, 0.0)
    bandwidth = (large - small) / max(measured[2][("broadcast", large)] - t2s, 1e-9)
    return Links(intra_bandwidth=bandwidth, inter_bandwidth=bandwidth, intra_latency=step, inter_latency=step,
                 base_latency=base, name="gloo on loopback, fitted to broadcasts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few repeats (a smoke run; numbers are noisy)")
    args = parser.parse_args(argv)
    import torch

    import fmesh
    from fmesh.plan.costs import LOOPBACK, estimate

    repeats = {"small": 5, "large": 2} if args.quick else {"small": 60, "large": 12}
    measured = measure([2, 4], repeats)
    fitted = calibrate(measured)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, gloo on loopback"
          f"{' (--quick: few repeats, noisy)' if args.quick else ''}\n")
    print(f"fitted from broadcasts: launch {fitted.base_latency * 1e6:.0f} µs, "
          f"step {fitted.intra_latency * 1e6:.0f} µs, bandwidth {fitted.intra_bandwidth / 1e9:.2f} GB/s "
          f"(fmesh.plan.costs.LOOPBACK: launch "
          f"{LOOPBACK.base_latency * 1e6:.0f} µs, step {LOOPBACK.intra_latency * 1e6:.0f} µs, "
          f"{LOOPBACK.intra_bandwidth / 1e9:.2f} GB/s)\n")
    print("| procs | collective | size | measured ms | model ms (fitted) | model / measured | algorithm |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for world, results in measured.items():
        mesh = fmesh.make_mesh((world,), ("g",))
        topology = fmesh.Topology(1, world)
        for name in COLLECTIVES:
            for label, nbytes in SIZES:
                got = results[(name, nbytes)]
                model = estimate(mesh, "g", name, nbytes, topology, fitted)
                print(f"| {world} | {name} | {label} | {got * 1e3:.3f} | {model.seconds * 1e3:.3f} | "
                      f"{model.seconds / got:.2f} | {model.algorithm} |")
    print("\nmeasured: the slowest rank's median of calls each timed alone after a barrier. The profile is fitted "
          "to the broadcast rows only; every other row is a prediction.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
