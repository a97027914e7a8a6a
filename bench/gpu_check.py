"""GPU check: fmesh on NCCL and the visible GPUs, one command, a table at the end.

    python bench/gpu_check.py            # every visible GPU, NCCL (what a GPU machine should run)
    python bench/gpu_check.py --cpu      # the same checks with gloo on 2 CPU processes (a smoke run)

It runs, each under ``torchrun`` with one process per GPU:

1. NCCL collectives through the Context, groups made lazily on first use: every collective along
   every axis of 1-, 2- and (with 4+ GPUs) 3-axis meshes, a permuted rank map among them, checked
   against the answer ``mesh.group`` implies.
2. The same with a device-bound default group (``init_process_group(device_id=...)``, eager NCCL)
   and ``ctx.materialize(...)``: one split per layout, the group order checked against the mesh.
3. DTensor (distribute, redistribute) and FSDP2 (``fully_shard``, a few steps of a small model,
   losses equal to one process) on ``ctx.device_mesh(...)``, which must be CUDA meshes.
4. The training example, ``examples/train.py``, on all visible GPUs.
5. ``ctx.all_reduce`` in each mode of the members' check against a bare ``dist.all_reduce`` and funcol's on the
   same NCCL ranks (median µs), and 200 steady-state collectives under ``torch.cuda.set_sync_debug_mode("error")``
   (the default check never synchronises the host with the device).

With torch 2.15, whose ``nccl`` is the torchcomms engine, 1 and 2 run again with
``TORCH_DIST_USE_NCCL2=0``. Nothing is skipped silently: a check that cannot run here says why.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' collective oracle (tests/support.py)


# ----------------------------------------------------------------------------------------- on each rank


def meshes(world: int) -> list[Any]:
    import fmesh

    found = [fmesh.make_mesh((world,), ("dp",)), fmesh.make_mesh((world,), ("dp",), rank_map=list(range(world))[::-1])]
    if world % 2 == 0 and world >= 2:
        found.append(fmesh.make_mesh((2, world // 2), ("dp", "tp")))
    if world % 4 == 0 and world >= 4:
        found.append(fmesh.make_mesh((2, 2, world // 4), ("pp", "dp", "tp")))
    return found


def check_collectives(ctx: Any) -> list[str]:
    """Every collective along every axis of every mesh, against the answer mesh.group implies (the tests' oracle)."""
    from support import collective_answers, collective_inputs

    problems: list[str] = []
    for mesh in meshes(ctx.world_size):
        for axis in mesh.axis_names:
            group = mesh.group(ctx.rank, axis)
            sent, want = collective_inputs(ctx.rank, len(group), ctx.device), collective_answers(ctx.rank, group)
            got = {
                "all_reduce": ctx.all_reduce(sent["all_reduce"], mesh, axis),
                "all_gather": ctx.all_gather(sent["all_gather"], mesh, axis),
                "reduce_scatter": ctx.reduce_scatter(sent["reduce_scatter"], mesh, axis),
                "broadcast": ctx.broadcast(sent["broadcast"], mesh, axis, src=len(group) - 1),
                "all_to_all": ctx.all_to_all(sent["all_to_all"], mesh, axis),
            }
            for name, tensor in got.items():
                if tensor.cpu().tolist() != want[name]:
                    problems.append(f"{name} {axis} of {mesh!r}: {tensor.cpu().tolist()} != {want[name]}")
    return problems


def check_group_order(ctx: Any) -> list[str]:
    """The group torch made for each axis lists its ranks in the mesh's order (permuted maps included)."""
    import torch.distributed as dist

    problems = []
    for mesh in meshes(ctx.world_size):
        for axis in mesh.axis_names:
            ranks, want = dist.get_process_group_ranks(ctx.group(mesh, axis)), list(mesh.group(ctx.rank, axis))
            if ranks != want:
                problems.append(f"group {axis} of {mesh!r}: torch has {ranks}, the mesh {want}")
    return problems


def check_dtensor_fsdp(ctx: Any) -> list[str]:
    """DTensor and FSDP2 on ctx.device_mesh: on the context's device, right values, losses of one process."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import fmesh

    problems = []
    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    dm = ctx.device_mesh(mesh)
    if dm.device_type != ctx.device.type:
        problems.append(f"exported mesh is on {dm.device_type}, the context on {ctx.device.type}")
    full = torch.arange(ctx.world_size * 4 * 3, dtype=torch.float32).reshape(ctx.world_size * 4, 3)
    sharded = distribute_tensor(full.to(ctx.device), dm, [Shard(0)])
    if not torch.equal(sharded.to_local().cpu(), full.chunk(ctx.world_size)[ctx.rank]):
        problems.append("DTensor Shard(0) local shard is wrong")
    if not torch.equal(sharded.redistribute(dm, [Replicate()]).to_local().cpu(), full):
        problems.append("DTensor redistribute to Replicate is wrong")

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(ctx.world_size * 2, 8, generator=generator)
    y = torch.randn(ctx.world_size * 2, 4, generator=generator)
    reference = model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    want = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(reference(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    wrapped = model().to(ctx.device)
    fully_shard(wrapped, mesh=dm)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    got = []
    xs, ys = x.chunk(ctx.world_size)[ctx.rank].to(ctx.device), y.chunk(ctx.world_size)[ctx.rank].to(ctx.device)
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(wrapped(xs), ys)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        got.append(ctx.all_reduce(loss.detach(), mesh, "dp", op="avg").item())
    if any(abs(a - b) > 1e-4 * max(1.0, abs(b)) for a, b in zip(got, want, strict=True)):
        problems.append(f"FSDP2 losses {got} differ from one process {want}")
    return problems


def latency(ctx: Any) -> list[dict[str, Any]]:
    """Median µs of a bare dist.all_reduce, funcol's, and ctx.all_reduce in each mode of the members' check, on the
    same ranks, interleaved (issue 35's table on NCCL)."""
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    import fmesh

    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    group = ctx.group(mesh, "dp")
    every = fmesh.Context(name="every-call", check_tensors="every-call", timeout=120)
    off = fmesh.Context(name="unchecked", check_tensors=False, timeout=120)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    rows = []
    # Rounds of interleaved calls, each call timed that many times: the GPU's figures; a smoke run's few (CPU: gloo).
    rounds, repeats = (10, 20) if ctx.device.type == "cuda" else (2, 5)
    for label, numel in (("1 elem", 1), ("1 KiB", 256), ("1 MiB", 262144)):
        t = torch.zeros(numel, device=ctx.device)
        calls = {"bare": lambda t=t: dist.all_reduce(t, group=group),
                 "bare + clone": lambda t=t: dist.all_reduce(t.clone(), group=group),
                 "funcol": lambda t=t: funcol.wait_tensor(funcol.all_reduce(t, "sum", group)),
                 "fmesh default": lambda t=t: ctx.all_reduce(t, mesh, "dp"),
                 "fmesh every call": lambda t=t: every.all_reduce(t, mesh, "dp"),
                 "fmesh off": lambda t=t: off.all_reduce(t, mesh, "dp")}
        timings: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for fn in calls.values():
                fn()
        sync()
        for _ in range(rounds):
            for name, fn in calls.items():
                for _ in range(repeats):
                    sync()
                    start = time.perf_counter()
                    fn()
                    sync()
                    timings[name].append((time.perf_counter() - start) * 1e6)
        rows.append({"size": label, **{name: statistics.median(values) for name, values in timings.items()}})
    every.close()
    off.close()
    return rows


def check_no_host_sync(ctx: Any) -> list[str]:
    """200 steady-state collectives with the default members' check never synchronise the host with the device:
    on CUDA under ``torch.cuda.set_sync_debug_mode("error")`` (a synchronising call raises); on CPU, counting the
    host's reads of a tensor's value (``aten._local_scalar_dense``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import fmesh

    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    t = torch.ones(4, device=ctx.device)
    for _ in range(8):  # the first calls meet in the store: every window is known afterwards
        ctx.all_reduce(t, mesh, "dp")
    reads = [0]

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                reads[0] += 1
            return func(*args, **(kwargs or {}))

    try:
        if ctx.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        with Reads():
            for _ in range(200):
                ctx.all_reduce(t, mesh, "dp")
    except RuntimeError as error:
        return [f"a host synchronisation in steady state: {error}"]
    finally:
        if ctx.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    return [f"{reads[0]} host reads of a tensor in 200 collectives"] if reads[0] else []


def worker(args: argparse.Namespace) -> int:
    """One rank, under torchrun: the checks of ``args.part``; rank 0 writes the results as JSON."""
    import torch
    import torch.distributed as dist

    import fmesh

    results: dict[str, Any] = {}
    backend = "gloo" if args.cpu else None
    if args.part == "bound":
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    with fmesh.Context.from_env(backend=backend, timeout=120) as ctx:
        if args.part == "bound":
            ctx.materialize(*meshes(ctx.world_size))
        results["collectives"] = check_collectives(ctx)
        results["group order"] = check_group_order(ctx)
        if args.part == "lazy":
            results["dtensor and fsdp2"] = check_dtensor_fsdp(ctx)
            results["latency"] = latency(ctx)
            results["no host sync"] = check_no_host_sync(ctx)
        results["device"] = str(ctx.device)
        results["stats"] = {k: v for k, v in ctx.stats().items() if k != "groups"}
    if args.part == "bound" and dist.is_initialized():
        dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        Path(args.out).write_text(json.dumps(results))
    return 0


# --------------------------------------------------------------------------------------------- driver


def torchrun(processes: int, *command: str, env: dict[str, str] | None = None,
             timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", *command], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=ROOT)


def run_part(part: str, processes: int, cpu: bool, env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "results.json"
        flags = ["--worker", part, "--out", str(out), *(["--cpu"] if cpu else [])]
        result = torchrun(processes, str(Path(__file__).resolve()), *flags, env=env)
        if result.returncode != 0 or not out.exists():
            return {"error": (result.stderr or result.stdout)[-1500:]}
        return dict(json.loads(out.read_text()))


def verdict(problems: Any) -> tuple[str, str]:
    if isinstance(problems, list):
        return ("ok", "") if not problems else ("FAILED", "; ".join(problems[:3]))
    return "FAILED", str(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="gloo on 2 CPU processes instead of NCCL on the GPUs")
    parser.add_argument("--worker", choices=("lazy", "bound"), dest="part", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        return worker(args)
    import torch

    gpus = torch.cuda.device_count()
    if not args.cpu and gpus == 0:
        print("gpu_check: no GPU is visible here; run it on a GPU machine, or with --cpu for the gloo smoke run",
              file=sys.stderr)
        return 2
    processes = 2 if args.cpu else gpus
    name = "CPU (gloo)" if args.cpu else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {processes} x {name}, CUDA {torch.version.cuda}, python "
          f"{sys.version.split()[0]}\n")
    table: list[tuple[str, str, str]] = []
    engines = [("", None)]
    if not args.cpu and tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 15):
        engines.append((" (TORCH_DIST_USE_NCCL2=0)", {"TORCH_DIST_USE_NCCL2": "0"}))
    lazy: dict[str, Any] = {}
    for suffix, env in engines:
        lazy_run = run_part("lazy", processes, args.cpu, env)
        lazy = lazy if suffix else lazy_run
        for key, label in (("collectives", "collectives, groups made lazily"), ("group order", "group order, lazily")):
            table.append((label + suffix, *verdict(lazy_run.get(key, lazy_run.get("error", "did not run")))))
        if args.cpu:
            table.append(("device-bound default group + materialize" + suffix, "not run",
                          "needs a GPU: gloo cannot bind the default group to a device"))
        else:
            bound = run_part("bound", processes, args.cpu, env)
            for key, label in (("collectives", "collectives, device-bound + materialize"),
                               ("group order", "group order, device-bound + materialize (split_group)")):
                table.append((label + suffix, *verdict(bound.get(key, bound.get("error", "did not run")))))
    table.append(("the members' check: no host synchronisation in steady state",
                  *verdict(lazy.get("no host sync", lazy.get("error", "did not run")))))
    table.append(("DTensor and FSDP2 on ctx.device_mesh", *verdict(lazy.get("dtensor and fsdp2",
                                                                            lazy.get("error", "did not run")))))
    tp = 2 if processes % 2 == 0 else 1
    train = torchrun(processes, "examples/train.py", "--tp", str(tp), "--steps", "10",
                     *(["--backend", "gloo"] if args.cpu else []))
    losses = [line.split()[3] for line in train.stdout.splitlines() if line.startswith("step ")]
    detail = f"tp {tp} x dp {processes // tp}, losses {losses[0]} -> {losses[-1]}" if losses else train.stderr[-800:]
    table.append(("examples/train.py on every process", "ok" if train.returncode == 0 else "FAILED", detail))
    print("| check | result | detail |")
    print("| --- | --- | --- |")
    for check, result, detail in table:
        print(f"| {check} | {result} | {detail.replace('|', '/').replace(chr(10), ' ')} |")
    print(f"\ncontext device: {lazy.get('device', '?')}; groups: {lazy.get('stats', {})}\n")
    rows = lazy.get("latency", [])
    if rows:
        ways = [key for key in rows[0] if key != "size"]
        print("| size | " + " | ".join(f"{way} µs" for way in ways) + " | default - (bare + clone) µs |")
        print("| --- |" + " ---: |" * (len(ways) + 1))
        for row in rows:
            print(f"| {row['size']} | " + " | ".join(f"{row[way]:.1f}" for way in ways)
                  + f" | {row['fmesh default'] - row['bare + clone']:.1f} |")
    return 0 if all(result != "FAILED" for _, result, _ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
