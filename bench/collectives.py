"""Benchmark: what the Context costs on top of torch.distributed.

(a) Latency of ``ctx.all_reduce`` against a bare ``dist.all_reduce`` on the same process group
    (gloo on loopback, 2 and 4 processes; 1 element, 1 KiB, 1 MiB; medians of individually timed
    calls after warm-up, the two interleaved in blocks). ``ctx.all_reduce`` returns a new tensor
    (it clones its input) while ``dist.all_reduce`` works in place, so the clone is shown too, and
    the cached group lookup (``ctx.group``, the hot path's lookup) is timed on its own.
(b) A torchtitan-like 5-axis mesh (pp, dp_replicate, dp_shard, cp, tp) with its flattened data-parallel
    views (dp, dp_shard_cp, dp_cp) and an expert-parallel unflatten of dp_shard_cp into (efsdp, ep), on
    the fake backend (one process, rank 0): groups created and time to build them, fmesh
    (``ctx.materialize`` of every axis and view) against torch (``init_device_mesh`` + ``_flatten`` +
    ``_unflatten``). Both sides build the same groups; the script checks it.
(c) The object collectives and the collective permute against the bare torch calls they replace, on
    the same group (gloo on loopback): ``ctx.all_gather_object`` against ``dist.all_gather_object``,
    ``ctx.broadcast_object`` against ``dist.broadcast_object_list``, and ``ctx.ppermute`` / ``ctx.shift``
    (a ring) against ``dist.batch_isend_irecv`` of the same sends and receives; with the time to pickle
    and unpickle the object once, which both sides pay.

(0) The members' check of their calls (issue 35), first: ``ctx.all_reduce`` in each mode of ``check_tensors``
    (default, every call, off) against a bare ``dist.all_reduce`` (in place, and on a clone), and torch's functional
    all_reduce, on 2 gloo processes, paired (interleaved in one launch), 1 element, 1 KiB, 1 MiB; the Python cost
    per call of each on a no-op backend (the dp axis on torch's fake backend, the store real; the thread's CPU
    clock); and a tensor- and sequence-parallel transformer block per step on fmesh's collectives against the same
    block on funcol's autograd collectives, eager and compiled.
(d) Gradients and compile: the autograd wrapper's cost per call (fake backend, no communication: the
    Python cost of ``ctx.all_reduce`` on a tensor that requires grad, against one that does not); a small
    tensor-parallel MLP (column- then row-parallel linear over tp) forward + backward, eager against
    ``torch.compile`` (aot_eager), fmesh's ``sum_gradients`` / ``sum_partials`` against the same model written with
    torch's functional collectives on the exported DeviceMesh's tp group. Parts (a) and (c) run with the check off.

    python bench/collectives.py [--quick] [--only checks|d]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = [("1 elem", 1), ("1 KiB", 256), ("1 MiB", 262144)]  # float32 elements


# ------------------------------------------------------------------------------------------- (a) latency


def _timed(fn: Callable[[], Any], n: int, clock: Callable[[], int] = time.perf_counter_ns) -> list[float]:
    out = []
    for _ in range(n):
        start = clock()
        fn()
        out.append((clock() - start) / 1000)
    return out


def _latency_rank(ctx: Any, iterations: dict[str, int]) -> list[tuple[Any, ...]]:
    import torch
    import torch.distributed as dist

    import fmesh

    world = ctx.world_size
    rows = []
    mesh = fmesh.make_mesh((world,), ("dp",))
    group = ctx.group(mesh, "dp")
    for label, numel in SIZES:
        t = torch.zeros(numel)  # zeros: a sum of zeros stays finite however often it runs in place
        n = iterations["large" if numel > 1024 else "small"]
        got = _medians({  # interleaved in blocks, so drift hits all alike
            "bare": lambda t=t: dist.all_reduce(t, group=group),
            "wrapped": lambda t=t: ctx.all_reduce(t, mesh, "dp"),
            "bare + clone": lambda t=t: dist.all_reduce(t.clone(), group=group),
            "clone": t.clone,
        }, n)
        rows.append((world, label, got["bare"], got["wrapped"], got["bare + clone"], got["clone"]))
    ctx.barrier()
    return rows


def _medians(calls: dict[str, Callable[[], Any]], n: int, blocks: int = 10,
             clock: Callable[[], int] = time.perf_counter_ns) -> dict[str, float]:
    """Median µs per call of each of ``calls``, after a warm-up, interleaved in ``blocks``, on ``clock``."""
    for fn in calls.values():
        _timed(fn, max(3, n // 10), clock)
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(blocks):  # interleaved, so drift hits all alike
        for label, fn in calls.items():
            times[label] += _timed(fn, max(1, n // blocks), clock)
    return {label: statistics.median(values) for label, values in times.items()}


OBJECTS: list[tuple[str, object]] = [
    ("small dict", {"step": 1200, "loss": 0.25, "lr": 3e-4, "tag": "x" * 64}),
    ("64 KiB bytes", {"blob": b"x" * 65536}),
]


def _objects_rank(ctx: Any, iterations: dict[str, int]) -> list[tuple[Any, ...]]:
    import pickle

    import torch
    import torch.distributed as dist

    import fmesh

    world, rank = ctx.world_size, ctx.rank
    mesh = fmesh.make_mesh((world,), ("dp",))
    group = ctx.group(mesh, "dp")
    rows: list[tuple[Any, ...]] = []
    for label, obj in OBJECTS:
        n = iterations["large" if label.startswith("64") else "small"]

        def bare_gather(obj: object = obj) -> None:
            dist.all_gather_object([None] * world, obj, group=group)

        def bare_broadcast(obj: object = obj) -> None:
            dist.broadcast_object_list([obj], src=0, group=group)

        got = _medians({
            "torch gather": bare_gather,
            "fmesh gather": lambda obj=obj: ctx.all_gather_object(obj, mesh, "dp"),
            "torch broadcast": bare_broadcast,
            "fmesh broadcast": lambda obj=obj: ctx.broadcast_object(obj, mesh, "dp", src=0),
            "pickle": lambda obj=obj: pickle.loads(pickle.dumps(obj)),
        }, n)
        rows.append((world, "all_gather_object", label, got["torch gather"], got["fmesh gather"], got["pickle"]))
        rows.append((world, "broadcast_object", label, got["torch broadcast"], got["fmesh broadcast"], got["pickle"]))
    t = torch.zeros(256)  # 1 KiB
    after, before = (rank + 1) % world, (rank - 1) % world
    ring = [(i, (i + 1) % world) for i in range(world)]

    def bare_ring() -> None:
        received = torch.zeros_like(t)  # like for like: ppermute returns a new tensor
        operations = [dist.P2POp(dist.isend, t, after, group), dist.P2POp(dist.irecv, received, before, group)]
        for work in dist.batch_isend_irecv(operations):
            work.wait()

    got = _medians({
        "torch": bare_ring,
        "ppermute": lambda: ctx.ppermute(t, mesh, "dp", ring),
        "shift": lambda: ctx.shift(t, mesh, "dp", wrap=True),
    }, iterations["small"])
    rows.append((world, "ppermute (ring)", "1 KiB", got["torch"], got["ppermute"], 0.0))
    rows.append((world, "shift(wrap=True)", "1 KiB", got["torch"], got["shift"], 0.0))
    ctx.barrier()
    return rows


def on_ranks(rank_rows: Callable[..., list[tuple[Any, ...]]], worlds: list[int],
             iterations: dict[str, int]) -> list[tuple[Any, ...]]:
    """Rank 0's rows of ``rank_rows(ctx, iterations)`` run on gloo processes, for each world size; the members'
    check of their tensors off (what the Context adds besides it; its own cost is part (d))."""
    import fmesh

    rows: list[tuple[Any, ...]] = []
    for world in worlds:
        results = fmesh.launch(functools.partial(rank_rows, iterations=iterations), world, timeout=600,
                               context_options={"timeout": 120, "check_tensors": False}, start_method="forkserver")
        rows.extend(results[0])  # rank 0's view
    return rows


def lookup_overhead(calls: int) -> list[tuple[str, float]]:
    """Per-call µs of the Python-side hot path, on the fake backend (no communication at all)."""
    import torch
    import torch.distributed as dist

    import fmesh

    rows = []
    with fmesh.Context.fake(4, rank=0) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        group = ctx.group(mesh, "tp")
        t = torch.zeros(256)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("ctx.group(mesh, 'tp') (cached group lookup)", lambda: ctx.group(mesh, "tp")),
            ("ctx.group(mesh, ('dp', 'tp'))", lambda: ctx.group(mesh, ("dp", "tp"))),
            ("t.clone(), 1 KiB", t.clone),
            ("dist.all_reduce(t, group) on fake (no comm)", lambda: dist.all_reduce(t, group=group)),
            ("ctx.all_reduce(t, mesh, 'tp') on fake (no comm)", lambda: ctx.all_reduce(t, mesh, "tp")),
            ("dist.batch_isend_irecv(send + recv) on fake (no comm)", lambda: [w.wait() for w in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, t, 1, group), dist.P2POp(dist.irecv, torch.zeros_like(t), 1, group)])]),
            ("ctx.shift(t, mesh, 'tp', wrap=True) on fake (no comm)", lambda: ctx.shift(t, mesh, "tp", wrap=True)),
            ("ctx.ppermute(t, mesh, 'tp', [(0, 1), (1, 0)]) on fake (no comm)",
             lambda: ctx.ppermute(t, mesh, "tp", [(0, 1), (1, 0)])),
        ]
        for label, fn in cases:
            fn()
            per_batch = []
            batch = max(1, calls // 50)
            for _ in range(50):
                start = time.perf_counter_ns()
                for _ in range(batch):
                    fn()
                per_batch.append((time.perf_counter_ns() - start) / batch / 1000)
            rows.append((label, statistics.median(per_batch)))
    return rows


# -------------------------------------------------------------------------------------- (b) group creation

TITAN_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _titan_sizes(world: int) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(pp, dp_replicate, dp_shard, cp, tp) and (efsdp, ep) splitting dp_shard * cp."""
    return {
        64: ((2, 2, 4, 2, 2), (2, 4)),
        512: ((2, 2, 8, 2, 8), (2, 8)),
    }[world]


def _torch_build(world: int) -> tuple[float, dict[str, tuple[int, ...]], Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    sizes, (efsdp, ep) = _titan_sizes(world)
    start = time.perf_counter()
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=TITAN_AXES)
    views = {
        "dp": mesh["dp_replicate", "dp_shard"]._flatten("dp"),
        "dp_shard_cp": mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
        "dp_cp": mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
    }
    expert = views["dp_shard_cp"]._unflatten(0, (efsdp, ep), ("efsdp", "ep"))
    seconds = time.perf_counter() - start
    groups = {name: tuple(dist.get_process_group_ranks(mesh.get_group(name))) for name in TITAN_AXES}
    groups.update({name: tuple(dist.get_process_group_ranks(v.get_group())) for name, v in views.items()})
    groups.update({name: tuple(dist.get_process_group_ranks(expert.get_group(name))) for name in ("efsdp", "ep")})
    return seconds, groups, mesh


def _fmesh_meshes(world: int) -> list[Any]:
    import fmesh

    sizes, (efsdp, ep) = _titan_sizes(world)
    mesh = fmesh.make_mesh(sizes, TITAN_AXES)
    dp = fmesh.flatten(mesh, ("dp_replicate", "dp_shard"), "dp")
    dp_shard_cp = fmesh.flatten(mesh, ("dp_shard", "cp"), "dp_shard_cp")
    dp_cp = fmesh.flatten(mesh, ("dp_replicate", "dp_shard", "cp"), "dp_cp")
    expert = fmesh.unflatten(dp_shard_cp, "dp_shard_cp", {"efsdp": efsdp, "ep": ep})
    return [mesh, (dp, "dp"), (dp_shard_cp, "dp_shard_cp"), (dp_cp, "dp_cp"), (expert, "efsdp"), (expert, "ep")]


def creation(worlds: list[int], reps: int) -> list[tuple[Any, ...]]:
    import torch.distributed as dist

    import fmesh
    from fmesh.context.device_mesh import process_group_count

    rows: list[tuple[Any, ...]] = []
    for world in worlds:
        torch_times, fmesh_times, again_torch, again_fmesh = [], [], [], []
        counts: dict[str, int] = {}
        same = True
        for _ in range(reps):
            # torch
            dist.init_process_group("fake", rank=0, world_size=world)
            before = process_group_count()
            seconds, torch_groups, root = _torch_build(world)
            counts["torch"] = process_group_count() - before
            torch_times.append(seconds)
            # Another part of the program (say the MoE layers) asks the same root for the same views.
            _, (efsdp, ep) = _titan_sizes(world)
            before = process_group_count()
            start = time.perf_counter()
            root["dp_replicate", "dp_shard"]._flatten("dp")
            root["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
            root["dp_shard", "cp"]._flatten("dp_shard_cp")._unflatten(0, (efsdp, ep), ("efsdp", "ep"))
            again_torch.append(time.perf_counter() - start)
            counts["torch again"] = process_group_count() - before
            dist.destroy_process_group()
            # fmesh: building the mesh values is part of its time
            with fmesh.Context.fake(world, rank=0) as ctx:
                before = process_group_count()
                start = time.perf_counter()
                items = _fmesh_meshes(world)
                ctx.materialize(*items)
                fmesh_times.append(time.perf_counter() - start)
                counts["fmesh"] = process_group_count() - before
                mine = {name: tuple(dist.get_process_group_ranks(ctx.group(items[0], name))) for name in TITAN_AXES}
                for mesh, axis in items[1:]:
                    mine[axis] = tuple(dist.get_process_group_ranks(ctx.group(mesh, axis)))
                same = same and mine == torch_groups
                before = process_group_count()
                start = time.perf_counter()
                ctx.materialize(*_fmesh_meshes(world))  # new values, equal to the first: groups are shared
                again_fmesh.append(time.perf_counter() - start)
                counts["fmesh again"] = process_group_count() - before
        rows.append((world, "build mesh + views + ep", counts["torch"], counts["fmesh"],
                     statistics.median(torch_times), statistics.median(fmesh_times), same))
        rows.append((world, "same views asked again", counts["torch again"], counts["fmesh again"],
                     statistics.median(again_torch), statistics.median(again_fmesh), same))
    return rows


# ------------------------------------------------------------------------------------------------ report


# ------------------------------------------------------------------------------ (d) gradients and compile


def autograd_overhead(calls: int) -> list[tuple[str, float]]:
    """Per-call µs of ``ctx.all_reduce`` through the autograd Function and without, on the fake backend."""
    import torch

    import fmesh

    with fmesh.Context.fake(4) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        plain, recorded = torch.ones(4), torch.ones(4, requires_grad=True)

        def no_grad_call() -> None:
            with torch.no_grad():
                ctx.all_reduce(recorded, mesh, "tp")

        got = _medians({"plain": lambda: ctx.all_reduce(plain, mesh, "tp"),
                        "grad": lambda: ctx.all_reduce(recorded, mesh, "tp"),
                        "no_grad": no_grad_call}, calls)
    return [("ctx.all_reduce(t) on fake, t without grad (the hot path)", got["plain"]),
            ("ctx.all_reduce(t) on fake, t.requires_grad (through the autograd Function)", got["grad"]),
            ("the autograd wrapper's cost (difference)", got["grad"] - got["plain"]),
            ("ctx.all_reduce(t) on fake, t.requires_grad under torch.no_grad()", got["no_grad"])]


CHECKS = {"default": True, "every call": "every-call", "off": False}  # the members' check, by column


def _contexts(ctx: Any, axis_options: Any = None) -> dict[str, Any]:
    """A context per mode of the members' check on the launch's world (the launch's own, for the default, where
    ``axis_options`` is None), their groups made."""
    import fmesh

    made = {}
    for label, check in CHECKS.items():
        made[label] = ctx if label == "default" and axis_options is None else fmesh.Context(
            backend="gloo", name=f"bench-{label.replace(' ', '-')}", check_tensors=check, timeout=120,
            axis_options=axis_options)
    return made


def _latency_ways(ctx: Any, mesh: Any, t: Any, contexts: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Each way to all_reduce ``t`` over ``mesh``'s dp group: bare c10d (in place, and on a clone, the like-for-like
    baseline of an out-of-place call), torch's functional collective, and fmesh in each check mode."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    group = ctx.group(mesh, "dp")

    def bare_clone() -> None:
        dist.all_reduce(t.clone(), group=group)

    ways: dict[str, Callable[[], Any]] = {
        "bare c10d": lambda: dist.all_reduce(t, group=group),
        "bare c10d + clone": bare_clone,
        "funcol": lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", group)),
    }
    for label, context in contexts.items():
        ways[f"fmesh {label}"] = functools.partial(context.all_reduce, t, mesh, "dp")
    return ways


def _paired_rank(ctx: Any, iterations: dict[str, int]) -> list[tuple[Any, ...]]:
    """Per size, the median µs of every way of :func:`_latency_ways`, interleaved in blocks (one launch: the
    machine's drift hits every way alike)."""
    import torch

    import fmesh

    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    contexts = _contexts(ctx)
    rows = []
    for label, numel in SIZES:
        t = torch.zeros(numel)  # zeros: a sum of zeros stays finite however often it runs in place
        got = _medians(_latency_ways(ctx, mesh, t, contexts), iterations["large" if numel > 1024 else "small"])
        rows.append((ctx.world_size, label, got))
    for context in contexts.values():
        if context is not ctx:
            context.close()
    ctx.barrier()
    return rows


def _batched(fn: Callable[[], Any], batch: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(batch):
            fn()
    return run


def _python_cost_rank(ctx: Any, iterations: dict[str, int]) -> list[tuple[str, float]]:
    """µs per call of each way, and fmesh's with autograd, with the dp axis on torch's fake backend (a no-op: no
    communication) while the store and the members' check are real."""
    import torch

    import fmesh
    from fmesh.context.options import AxisOptions

    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    t, recorded = torch.zeros(256), torch.zeros(256, requires_grad=True)
    contexts = _contexts(ctx, {"dp": AxisOptions(backend="fake")})
    ways = _latency_ways(contexts["default"], mesh, t, contexts)
    ways["fmesh default, t.requires_grad"] = functools.partial(contexts["default"].all_reduce, recorded, mesh, "dp")
    ways["fmesh off, t.requires_grad"] = functools.partial(contexts["off"].all_reduce, recorded, mesh, "dp")
    batch = iterations["batch"]
    # This thread's CPU time: with no communication there is no waiting, so it is the Python cost alone, and other
    # work on the machine (which takes the CPU away from this process) does not count.
    got = _medians({label: _batched(fn, batch) for label, fn in ways.items()}, iterations["small"],
                   clock=time.thread_time_ns)
    for context in contexts.values():
        context.close()
    return [(label, us / batch) for label, us in got.items()]


def checks_and_baselines(quick: bool) -> None:
    """The table of issue 35: fmesh against bare c10d and funcol, in each mode of the members' check."""
    import fmesh

    print("### The members' check, and fmesh against c10d and funcol\n")
    iterations = {"small": 40, "large": 5} if quick else {"small": 3000, "large": 300}
    rows = fmesh.launch(functools.partial(_paired_rank, iterations=iterations), 2, timeout=900,
                        context_options={"timeout": 120}, start_method="forkserver")[0]
    ways = list(rows[0][2])
    print("| procs | size | " + " | ".join(f"{way} µs" for way in ways) + " | default - (bare + clone) µs |")
    print("| ---: | --- |" + " ---: |" * (len(ways) + 1))
    for world, label, got in rows:
        print(f"| {world} | {label} | " + " | ".join(_us(got[way]) for way in ways)
              + f" | {_us(got['fmesh default'] - got['bare c10d + clone'])} |")
    print("\ngloo on loopback, rank 0's medians of individually timed calls, every way interleaved in blocks in one "
          "launch. bare c10d = `dist.all_reduce(t, group=g)` in place; + clone = on `t.clone()` (fmesh returns a new "
          "tensor); funcol = `funcol.wait_tensor(funcol.all_reduce(t, 'sum', g))`; fmesh default = "
          "`ctx.all_reduce(t, mesh, 'dp')` (check_tensors=True: new windows of calls met in the store, known ones "
          "checked every 64 calls off the caller's thread); every call = check_tensors='every-call' (a meeting in "
          "the store before every call); off = check_tensors=False.\n")
    # --quick (a smoke run): 20 batches of 10 (the every-call mode meets in the store before each call)
    cost_iterations = {"small": 20, "batch": 10} if quick else {"small": 1000, "batch": 100}
    cost = fmesh.launch(functools.partial(_python_cost_rank, iterations=cost_iterations), 2,
                        timeout=900, context_options={"timeout": 120}, start_method="forkserver")[0]
    print("| the Python cost per call: 1 KiB, the dp axis on torch's fake backend (no communication) | µs |")
    print("| --- | ---: |")
    for label, us in cost:
        print(f"| {label} | {us:.2f} |")
    values = dict(cost)
    print(f"| fmesh default - (bare c10d + clone) | {values['fmesh default'] - values['bare c10d + clone']:.2f} |")
    print(f"| fmesh default - bare c10d | {values['fmesh default'] - values['bare c10d']:.2f} |")
    print(f"| fmesh default, t.requires_grad - (bare c10d + clone) | "
          f"{values['fmesh default, t.requires_grad'] - values['bare c10d + clone']:.2f} |")
    print(f"\n2 processes; each call timed in batches of {cost_iterations['batch']} on the calling thread's CPU clock "
          "(no communication, so no waiting: the Python cost alone, whatever else the machine runs), medians of the "
          "batches, every way interleaved; the store and the members' check are real (a checkpoint's store "
          "operations run on the watch's thread, not counted here).\n")


def _sp_block_rank(ctx: Any, iterations: dict[str, int], sizes: list[tuple[int, int]]) -> list[tuple[Any, ...]]:
    """A Megatron tensor- and sequence-parallel transformer block (:func:`_sp_block_step`) at each size: the four
    ways' medians per step, interleaved."""
    import fmesh

    tp = ctx.world_size
    mesh = fmesh.make_mesh((tp,), ("tp",))
    rows: list[tuple[Any, ...]] = []
    for hidden, seq in sizes:
        steps = {f"{way} {how}": _sp_block_step(ctx, mesh, hidden, seq, way, how == "compiled")
                 for how in ("eager", "compiled")[:1 if iterations["block"] < 50 else 2] for way in ("fmesh", "funcol")}
        rows.append((tp, hidden, seq, _medians(steps, iterations["block"])))
    ctx.barrier()
    return rows


def _sp_block_step(ctx: Any, mesh: Any, hidden: int, seq: int, way: str, compiled: bool) -> Callable[[], None]:
    """One step (forward + backward) of a pre-LN block, causal attention (8 heads) and a 4x MLP, batch 2, with the
    sequence split over tp between the blocks: gathered before each column-parallel linear, reduce-scattered after
    each row-parallel one; on fmesh's collectives (default check) or funcol's autograd collectives."""
    import torch
    import torch.nn.functional as F
    from torch.distributed import _functional_collectives as funcol

    tp, heads, batch = mesh.size, 8, 2
    group = ctx.device_mesh(mesh).get_group("tp")
    torch.manual_seed(0)
    weights = [(torch.randn(*shape) * 0.02).requires_grad_() for shape in (
        (hidden, 3 * hidden // tp), (hidden // tp, hidden), (hidden, 4 * hidden // tp), (4 * hidden // tp, hidden))]
    w_qkv, w_out, w_up, w_down = weights
    x = torch.randn(seq // tp, batch, hidden)

    def gather(t: torch.Tensor) -> torch.Tensor:
        if way == "fmesh":
            return ctx.all_gather(t, mesh, "tp", dim=0)
        return funcol.all_gather_tensor_autograd(t, 0, group)

    def scatter(t: torch.Tensor) -> torch.Tensor:
        if way == "fmesh":
            return ctx.reduce_scatter(t, mesh, "tp", dim=0)
        return funcol.reduce_scatter_tensor_autograd(t, "sum", 0, group)

    def block(x: torch.Tensor) -> torch.Tensor:
        h = gather(F.layer_norm(x, (hidden,)))
        q, k, v = (part.reshape(seq, batch, heads // tp, -1).permute(1, 2, 0, 3)
                   for part in (h @ w_qkv).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3)
        x = x + scatter(attended.reshape(seq, batch, hidden // tp) @ w_out)
        h = gather(F.layer_norm(x, (hidden,)))
        return x + scatter(F.gelu(h @ w_up) @ w_down)

    model = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block

    def run() -> None:
        model(x.detach().requires_grad_()).square().mean().backward()
        for w in weights:
            w.grad = None
    return run


def sp_block(quick: bool) -> None:
    import fmesh

    sizes = [(64, 64)] if quick else [(64, 64), (128, 128), (256, 256), (512, 256)]
    world = 2 if quick else 4
    rows = fmesh.launch(functools.partial(_sp_block_rank, iterations={"block": 5 if quick else 200}, sizes=sizes),
                        world, timeout=1800, context_options={"timeout": 300}, start_method="forkserver")[0]
    print("| procs (tp) | hidden | sequence | fmesh eager µs | funcol eager µs | eager ratio | fmesh compiled µs "
          "| funcol compiled µs | compiled ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tp, hidden, seq, got in rows:
        compiled = (f"{_us(got['fmesh compiled'])} | {_us(got['funcol compiled'])} | "
                    f"{got['fmesh compiled'] / got['funcol compiled']:.3f}") if "fmesh compiled" in got else "— | — | —"
        print(f"| {tp} | {hidden} | {seq} | {_us(got['fmesh eager'])} | {_us(got['funcol eager'])} | "
              f"{got['fmesh eager'] / got['funcol eager']:.3f} | {compiled} |")
    print("\nA tensor- and sequence-parallel transformer block (pre-LN causal attention, 8 heads, and a 4x MLP; batch "
          "2; the sequence split over tp), forward + backward per step: two all_gathers and two reduce_scatters "
          "forward, as many backward. fmesh = `ctx.all_gather` / `ctx.reduce_scatter` along tp with the default "
          "check; funcol = `all_gather_tensor_autograd` / `reduce_scatter_tensor_autograd` on the exported "
          "DeviceMesh's tp group; compiled = `torch.compile(fullgraph=True, backend='aot_eager')`; rank 0's medians, "
          "the four interleaved (--quick: eager only, a smoke run).\n")


def _mlp_rank(ctx: Any, iterations: dict[str, int]) -> list[tuple[Any, ...]]:
    import torch
    from torch.distributed import _functional_collectives as funcol

    import fmesh

    mesh = fmesh.make_mesh((ctx.world_size,), ("tp",))
    group = ctx.device_mesh(mesh).get_group("tp")
    batch, width, hidden = 8, 64, 256
    torch.manual_seed(0)
    w1 = torch.randn(width, hidden // ctx.world_size, requires_grad=True)
    w2 = torch.randn(hidden // ctx.world_size, width, requires_grad=True)
    x = torch.randn(batch, width)

    def with_fmesh(x: torch.Tensor) -> torch.Tensor:
        inner = torch.relu(ctx.sum_gradients(x, mesh, "tp") @ w1)
        return ctx.sum_partials(inner @ w2, mesh, "tp").square().mean()

    def with_funcol(x: torch.Tensor) -> torch.Tensor:
        inner = torch.relu(x @ w1)
        return funcol.all_reduce(inner @ w2, "sum", group).square().mean()

    def step(model: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            leaf = x.detach().requires_grad_()
            model(leaf).backward()
            w1.grad = w2.grad = None
        return run

    compiled = {name: torch.compile(model, backend="aot_eager", fullgraph=True)
                for name, model in (("fmesh", with_fmesh), ("funcol", with_funcol))}
    calls = {"fmesh eager": step(with_fmesh), "funcol eager": step(with_funcol),
             "fmesh compiled": step(compiled["fmesh"]), "funcol compiled": step(compiled["funcol"])}
    got = _medians(calls, iterations["mlp"])
    ctx.barrier()
    return [(ctx.world_size, label, us) for label, us in got.items()]


def gradients_and_compile(quick: bool) -> None:
    print("\n### (d) gradients and compile\n")
    print("| call | µs |")
    print("| --- | ---: |")
    for label, us in autograd_overhead(2_000 if quick else 200_000):
        print(f"| {label} | {us:.2f} |")
    print("\n| procs | TP MLP forward + backward (batch 8, 64 -> 256 -> 64, tp split) | µs |")
    print("| ---: | --- | ---: |")
    for world, label, us in on_ranks(_mlp_rank, [2], {"mlp": 10 if quick else 500}):
        print(f"| {world} | {label} | {_us(us)} |")
    print("\nfmesh = `ctx.sum_gradients` on the column-parallel input and `ctx.sum_partials` on the row-parallel "
          "output; funcol = torch's `funcol.all_reduce` on the exported DeviceMesh's `get_group('tp')` (its own "
          "autograd: an all_reduce backward), one all_reduce forward and one backward on both sides; compiled = "
          "`torch.compile(fullgraph=True, backend='aot_eager')`.")


def _us(x: float) -> str:
    return f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few iterations, small worlds (a smoke run)")
    parser.add_argument("--only", choices=["all", "checks", "d"], default="all",
                        help="run every section, the check's tables alone, or those and (d)")
    args = parser.parse_args(argv)
    quick = args.quick
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}"
          f"{' (--quick: few iterations, numbers are noisy)' if quick else ''}\n")

    checks_and_baselines(quick)
    sp_block(quick)
    if args.only == "checks":
        return 0
    gradients_and_compile(quick)
    if args.only == "d":
        return 0
    iterations = {"small": 40, "large": 5} if quick else {"small": 3000, "large": 300}
    rows = on_ranks(_latency_rank, [2] if quick else [2, 4], iterations)
    print("### (a) all_reduce latency, gloo on loopback (rank 0, median µs)\n")
    print("| procs | size | bare µs | fmesh µs | overhead µs | ratio | bare+clone µs | fmesh - (bare+clone) µs "
          "| clone µs |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world, label, bare, wrapped, bare_clone, clone in rows:
        print(f"| {world} | {label} | {_us(bare)} | {_us(wrapped)} | {_us(wrapped - bare)} | {wrapped / bare:.3f} "
              f"| {_us(bare_clone)} | {_us(wrapped - bare_clone)} | {_us(clone)} |")
    print("\nbare = `dist.all_reduce(t, group=g)` in place; fmesh = `ctx.all_reduce(t, mesh, 'dp')` on the same "
          "group `g`, which returns a new tensor: it clones `t` (clone timed alone in the last column); "
          "bare+clone = `dist.all_reduce(t.clone(), group=g)`, the like-for-like baseline. All four are "
          "interleaved in blocks; each call is timed alone and waits for the slowest peer, so on a loaded "
          "machine the spread between runs is larger than fmesh's own cost (see the next table).\n")

    print("### (a') the Python hot path alone (fake backend, no communication; µs per call)\n")
    print("| call | µs |")
    print("| --- | ---: |")
    for label, us in lookup_overhead(2_000 if quick else 200_000):
        print(f"| {label} | {us:.2f} |")

    worlds = [64] if quick else [64, 512]
    print("\n### (b) torchtitan-like mesh (pp, dp_replicate, dp_shard, cp, tp) + dp, dp_shard_cp, dp_cp views "
          "+ ep unflatten; fake backend, rank 0\n")
    print("| world | what | torch groups | fmesh groups | torch ms | fmesh ms | same groups |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for world, what, torch_groups, fmesh_groups, torch_s, fmesh_s, same in creation(worlds, 1 if quick else 3):
        print(f"| {world} | {what} | {torch_groups} | {fmesh_groups} | {torch_s * 1e3:.2f} | {fmesh_s * 1e3:.2f} "
              f"| {'yes' if same else 'NO'} |")
    for world in worlds:
        sizes, (efsdp, ep) = _titan_sizes(world)
        axes = dict(zip(TITAN_AXES, sizes, strict=True))
        print(f"\nworld {world}: {axes}, dp_shard*cp -> efsdp={efsdp}, ep={ep}.", end="")
    print("\ngroups = process groups this rank holds afterwards (torch's `pg_map`); time = building the meshes "
          "and groups (torch calls `new_group` for every subgroup of a dim, members or not; fmesh creates this "
          "rank's groups only). 'asked again': torch's `_flatten` finds its cached views, `_unflatten` "
          "creates its groups again; fmesh finds every group in its cache.")
    print("\n### (c) object collectives and collective permutes, gloo on loopback (rank 0, median µs)\n")
    print("| procs | call | object | torch µs | fmesh µs | overhead µs | pickle + unpickle µs |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    object_iterations = {"small": 20, "large": 5} if quick else {"small": 1000, "large": 200}
    object_rows = on_ranks(_objects_rank, [2] if quick else [2, 4], object_iterations)
    for world, call, label, bare, ours, pickling in object_rows:
        print(f"| {world} | {call} | {label} | {_us(bare)} | {_us(ours)} | {_us(ours - bare)} "
              f"| {_us(pickling) if pickling else '—'} |")
    print("\ntorch = `dist.all_gather_object`, `dist.broadcast_object_list` (src 0), and `dist.batch_isend_irecv` of "
          "one send to the next rank and one receive from the previous into a new tensor; fmesh = "
          "`ctx.all_gather_object`, `ctx.broadcast_object`, `ctx.ppermute` with the ring's pairs and "
          "`ctx.shift(wrap=True)`, on the same group. "
          "Both object collectives pickle on every sender and unpickle on every receiver (last column: once).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
