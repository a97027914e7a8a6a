"""Benchmark: fmesh mesh values vs ``torch.distributed.DeviceMesh`` (fake backend, one process, CPU only).

Run from the repository root::

    python bench/mesh_ops.py            # full run (about a minute on 2 cores)
    python bench/mesh_ops.py --quick    # smoke run: smaller worlds, fewer repetitions
    python bench/mesh_ops.py --json results.json
    python bench/mesh_ops.py --large-only   # only table 2 (fmesh alone at 2^20 ranks), elastic rows included

Prints three markdown tables:

1. fmesh vs DeviceMesh on a torchtitan-like 5-axis mesh (pp, dp_replicate, dp_shard, cp, tp)
   at several world sizes. DeviceMesh runs on the ``fake`` process-group backend, so building
   a mesh (and flattening/unflattening one) creates its process groups eagerly, as it does in
   a real job; that cost is part of what is compared. fmesh values create no groups.
2. fmesh alone at 2^20 ranks: every operation and single-rank queries, the planning tools
   (recipes, host spans, ``python -m fmesh plan``, pictures) that unit tests no longer time, and the
   elastic operations (a lost rank, a join, rank conversion).
3. Peak Python memory (tracemalloc) of building a mesh and doing the operations at
   2^10, 2^15 and 2^20 ranks.

Every number is the median wall time of one call (time.perf_counter), in microseconds.
fmesh has no global caches, so "build" really builds a new value each repetition.
torch caches ``_flatten`` results by name on the root mesh, so each DeviceMesh flatten
repetition uses a fresh name (that is the cost of a first flatten, which creates groups).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

warnings.filterwarnings("ignore")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402

import fmesh  # noqa: E402

NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

# torchtitan-like degrees: (pp, dp_replicate, dp_shard, cp, tp).
SHAPES: dict[int, tuple[int, ...]] = {
    64: (2, 2, 4, 2, 2),
    1024: (2, 4, 16, 2, 4),
    4096: (4, 4, 32, 2, 4),
    32768: (4, 8, 64, 2, 8),  # 2^15
    2**20: (8, 16, 256, 2, 16),
}

TABLE_HEADER = "| op | world | fmesh µs | DeviceMesh µs | speedup |"


@dataclass(frozen=True)
class Budget:
    """How long to spend timing one operation: stop after ``seconds`` once ``min_reps`` are done."""

    seconds: float
    min_reps: int
    max_reps: int


@dataclass
class Row:
    """One line of the comparison table."""

    op: str
    world: int
    shape: tuple[int, ...]
    fmesh_us: float
    fmesh_reps: int
    result_ranks: int | None = None
    device_mesh_us: float | None = None
    device_mesh_reps: int = 0

    @property
    def speedup(self) -> float | None:
        if self.device_mesh_us is None:
            return None
        return self.device_mesh_us / self.fmesh_us


@dataclass
class Results:
    """Everything the run measured (what ``--json`` writes)."""

    comparison: list[Row] = field(default_factory=list)
    large: list[Row] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def time_op(fn: Callable[[], object], budget: Budget) -> tuple[float, int]:
    """Median seconds per call of ``fn`` and the number of calls timed.

    One untimed warm-up call comes first. As ``timeit`` does, the cyclic garbage collector
    is off while timing (after a full collection), so a collection that some earlier
    allocation made due does not land on one side of the comparison.
    """
    fn()
    gc.collect()
    gc.disable()
    try:
        samples: list[float] = []
        start = time.perf_counter()
        while len(samples) < budget.max_reps and (
            len(samples) < budget.min_reps or time.perf_counter() - start < budget.seconds
        ):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(samples), len(samples)


def split_in_two(size: int) -> tuple[int, int]:
    """A near-square factorisation ``(a, b)`` of ``size`` with ``a * b == size`` (for unflatten)."""
    a = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
    return a, size // a


def fmesh_ops(shape: tuple[int, ...], rank: int) -> dict[str, Callable[[], object]]:
    """The fmesh side of every benchmarked operation, on a mesh of this shape."""
    mesh = fmesh.make_mesh(shape, NAMES)
    a, b = split_in_two(shape[2])
    return {
        "build": lambda: fmesh.make_mesh(shape, NAMES),
        "slice": lambda: fmesh.slice(mesh, "dp_shard", "cp"),
        "flatten": lambda: fmesh.flatten(mesh, ("dp_replicate", "dp_shard"), "dp"),
        "unflatten": lambda: fmesh.unflatten(mesh, "dp_shard", {"x": a, "y": b}),
        "concat": lambda: fmesh.concat(mesh["dp_shard"], mesh["tp"]),
        "group tp": lambda: mesh.group(rank, "tp"),
        "coordinate": lambda: mesh.coordinate(rank),
        "build + slice": lambda: fmesh.slice(fmesh.make_mesh(shape, NAMES), "dp_shard", "cp"),
    }


def device_mesh_ops(shape: tuple[int, ...]) -> dict[str, Callable[[], object]]:
    """The DeviceMesh side of every benchmarked operation (rank 0 of a fake world)."""
    dm = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    a, b = split_in_two(shape[2])
    counter = iter(range(10**9))

    def flatten() -> DeviceMesh:
        # A fresh name each call: torch returns a cached flatten for a name it has seen.
        return dm["dp_replicate", "dp_shard"]._flatten(f"dp{next(counter)}")

    return {
        "build": lambda: init_device_mesh("cpu", shape, mesh_dim_names=NAMES),
        "slice": lambda: dm["dp_shard", "cp"],
        "flatten": flatten,
        "unflatten": lambda: dm["dp_shard"]._unflatten(0, (a, b), ("x", "y")),
        "concat": lambda: DeviceMesh._concatenate([dm["dp_shard"], dm["tp"]]),
        "group tp": lambda: dist.get_process_group_ranks(dm.get_group("tp")),
        "coordinate": lambda: dm.get_coordinate(),
        "build + slice": lambda: init_device_mesh("cpu", shape, mesh_dim_names=NAMES)["dp_shard", "cp"],
    }


def check_agreement(shape: tuple[int, ...]) -> None:
    """Both sides answer the same questions the same way on rank 0 (so the timings compare like with like)."""
    mesh = fmesh.make_mesh(shape, NAMES)
    dm = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    assert mesh.group(0, "tp") == tuple(dist.get_process_group_ranks(dm.get_group("tp")))
    assert mesh.coordinate(0) == tuple(dm.get_coordinate() or ())
    flat = fmesh.flatten(mesh, ("dp_replicate", "dp_shard"), "dp")
    dm_flat = dm["dp_replicate", "dp_shard"]._flatten("dp")
    assert flat.group(0, "dp") == tuple(dist.get_process_group_ranks(dm_flat.get_group()))
    sliced = fmesh.slice(mesh, "dp_shard", "cp")
    assert sliced.ranks(0).tolist() == dm["dp_shard", "cp"].mesh.tolist()


def compare(world: int, fmesh_budget: Budget, dm_budget: Budget) -> list[Row]:
    """Time every op on both sides at one world size; DeviceMesh on a fresh fake process group."""
    shape = SHAPES[world]
    assert math.prod(shape) == world, (world, shape)
    dist.init_process_group("fake", rank=0, world_size=world)  # the fake backend makes its own store
    try:
        check_agreement(shape)
        ours = fmesh_ops(shape, rank=0)
        theirs = device_mesh_ops(shape)
        rows = []
        for op, fn in ours.items():
            f_s, f_n = time_op(fn, fmesh_budget)
            d_s, d_n = time_op(theirs[op], dm_budget)
            rows.append(Row(op, world, shape, f_s * 1e6, f_n, device_mesh_us=d_s * 1e6, device_mesh_reps=d_n))
        return rows
    finally:
        dist.destroy_process_group()
        gc.collect()


def large_world(fmesh_budget: Budget) -> list[Row]:
    """fmesh alone at 2^20 ranks: every op plus single-rank queries on a rank deep inside the world."""
    world = 2**20
    shape = SHAPES[world]
    rank = world // 2 + 12345
    mesh = fmesh.make_mesh(shape, NAMES)
    ops = fmesh_ops(shape, rank)
    ops["group dp_shard"] = lambda: mesh.group(rank, "dp_shard")
    ops["group (dp_shard, cp)"] = lambda: mesh.group(rank, ("dp_shard", "cp"))
    flat = fmesh.flatten(mesh, ("dp_replicate", "dp_shard"), "dp")
    ops["group dp (flattened)"] = lambda: flat.group(rank, "dp")
    ops.update(planning_ops(world))
    ops.update(elastic_ops(world, rank))
    rows = []
    for op, fn in ops.items():
        seconds, reps = time_op(fn, fmesh_budget)
        result = fn()
        size = len(result) if op.startswith("group") and isinstance(result, tuple) else None
        rows.append(Row(op, world, shape, seconds * 1e6, reps, result_ranks=size))
    return rows


def planning_ops(world: int) -> dict[str, Callable[[], object]]:
    """The planning tools at ``world`` ranks, 8 per host: recipes, host spans, the plan, pictures."""
    degrees = {"pp": 8, "dp_replicate": 4, "cp": 2, "tp": 8, "ep": 64}
    dims = fmesh.ParallelDims(world, **degrees)
    topology = fmesh.Topology(world // 8, 8)
    mesh = fmesh.make_mesh(SHAPES[world], NAMES)
    return {
        "ParallelDims(...).meshes()": lambda: fmesh.ParallelDims(world, **degrees).meshes(),
        "Topology.spans(every recipe mesh)": lambda: topology.spans(dims.meshes()),
        "build_plan (python -m fmesh plan)": lambda: fmesh.plan.jobs.build_plan(world, 8, **degrees),
        "render (text picture)": lambda: fmesh.render(mesh, highlight="tp"),
        "rendering.html (notebook picture)": lambda: fmesh.rendering.html(mesh),
    }


def elastic_ops(world: int, rank: int) -> dict[str, Callable[[], object]]:
    """The elastic operations at ``world`` ranks: the mesh and the job after ``rank`` is lost, a join
    (a grow of the outermost axis needs no rank map; a grow of an inner one lists a new rank map of the
    whole world, so it costs what building a permuted universe costs), and converting a rank."""
    shape = SHAPES[world]
    mesh = fmesh.make_mesh(shape, NAMES)
    dims = fmesh.ParallelDims(world, pp=shape[0], dp_replicate=shape[1], cp=shape[3], tp=shape[4])
    smaller = fmesh.without(mesh, [rank], "dp_replicate")
    return {
        "without (lost rank: drop its dp_replicate slice)": lambda: fmesh.without(mesh, [rank], "dp_replicate"),
        "resize pp +1 (join; outermost, no rank map)": lambda: fmesh.resize(mesh, "pp", shape[0] + 1),
        "resize dp_shard +1 (join; new 2^20 rank map)": lambda: fmesh.resize(mesh, "dp_shard", shape[2] + 1),
        "rescale.scale_down(ParallelDims, [rank])": lambda: fmesh.plan.rescale.scale_down(dims, [rank]),
        "old_rank + new_rank": lambda: (fmesh.old_rank(smaller, 12345), fmesh.new_rank(smaller, rank)),
    }


def workload(shape: tuple[int, ...]) -> None:
    """Build a mesh and do every op once (what the memory table measures)."""
    rank = math.prod(shape) - 1
    mesh = fmesh.make_mesh(shape, NAMES)
    a, b = split_in_two(shape[2])
    sliced = fmesh.slice(mesh, "dp_shard", "cp")
    flat = fmesh.flatten(mesh, ("dp_replicate", "dp_shard"), "dp")
    split = fmesh.unflatten(mesh, "dp_shard", {"x": a, "y": b})
    joined = fmesh.concat(mesh["dp_shard"], mesh["tp"])
    for m in (mesh, sliced, flat, split, joined):
        m.coordinate(rank)
        m.group(rank, m.axis_names[-1])


def memory(worlds: Sequence[int]) -> list[dict[str, Any]]:
    """Peak tracemalloc bytes of :func:`workload` at each world size (after one untimed warm-up)."""
    workload(SHAPES[64])  # imports and lazily built module state are not what we measure
    out = []
    for world in worlds:
        gc.collect()
        tracemalloc.start()
        workload(SHAPES[world])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.append({"world": world, "shape": SHAPES[world], "peak_bytes": peak})
    return out


def fmt_us(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def fmt_speedup(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}x" if value >= 1 else f"{value:.2g}x"


def render(results: Results) -> str:
    lines = ["## fmesh vs torch DeviceMesh (fake backend, rank 0)", ""]
    shapes = sorted({(r.world, r.shape) for r in results.comparison})
    lines.append(
        "Mesh axes (pp, dp_replicate, dp_shard, cp, tp): "
        + ", ".join(f"{w} = {shape_text(s)}" for w, s in shapes)
        + ". Median µs per call."
    )
    lines += ["", TABLE_HEADER, "| --- | ---: | ---: | ---: | ---: |"]
    order = list(fmesh_ops(SHAPES[64], 0))
    for row in sorted(results.comparison, key=lambda r: (order.index(r.op), r.world)):
        speedup = row.speedup
        lines.append(
            f"| {row.op} | {row.world} | {fmt_us(row.fmesh_us)} | {fmt_us(row.device_mesh_us)} | "
            f"{fmt_speedup(speedup)} |"
        )
    lines += [
        "",
        "DeviceMesh creates every process group it may need while building (and flattening/unflattening),",
        "and keeps this rank's coordinate and group handles, so `group tp` and `coordinate` are lookups in",
        "state it computed up front; fmesh creates no groups and answers each query from the layout on each call.",
    ]
    big = results.large[0].shape if results.large else SHAPES[2**20]
    lines += ["", f"## fmesh alone at 2^20 = {2**20} ranks ({shape_text(big)})", ""]
    lines += ["| op | fmesh µs | ranks returned | repetitions |", "| --- | ---: | ---: | ---: |"]
    lines += [
        f"| {r.op} | {fmt_us(r.fmesh_us)} | {'—' if r.result_ranks is None else r.result_ranks} | {r.fmesh_reps} |"
        for r in results.large
    ]
    lines += ["", "## Peak memory (tracemalloc) of building a mesh and doing every op", ""]
    lines += ["| world | shape | peak KiB |", "| ---: | --- | ---: |"]
    lines += [f"| {m['world']} | {shape_text(m['shape'])} | {m['peak_bytes'] / 1024:.1f} |" for m in results.memory]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: worlds 64 and 4096, few repetitions")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--large-only", action="store_true", help="only the fmesh-alone table at 2^20 ranks")
    args = parser.parse_args(argv)

    if args.quick:
        worlds: tuple[int, ...] = (64, 4096)
        fmesh_budget, dm_budget = Budget(0.02, 5, 2000), Budget(0.05, 2, 20)
    else:
        worlds = (64, 4096, 32768)
        fmesh_budget, dm_budget = Budget(0.25, 50, 100_000), Budget(1.5, 5, 200)

    start = time.perf_counter()
    results = Results()
    for world in () if args.large_only else worlds:
        results.comparison += compare(world, fmesh_budget, dm_budget)
    results.large = large_world(fmesh_budget)
    results.memory = [] if args.large_only else memory((2**10, 2**15, 2**20))
    results.elapsed_s = time.perf_counter() - start

    text = render(results)
    if args.large_only:  # the one table measured
        text = text[text.index("## fmesh alone") : text.index("\n## Peak memory")]
    print(text)
    print()
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs; {'quick' if args.quick else 'full'} run took {results.elapsed_s:.1f} s"
    )
    if args.json:
        payload = {
            "comparison": [asdict(r) | {"speedup": r.speedup} for r in results.comparison],
            "large": [asdict(r) for r in results.large],
            "memory": results.memory,
            "elapsed_s": results.elapsed_s,
            "quick": args.quick,
            "torch": torch.__version__,
            "python": platform.python_version(),
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
