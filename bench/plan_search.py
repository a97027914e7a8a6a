"""Benchmark: the model-aware search (``fmesh.plan.search.search``) for a model on N GPUs of 8 per node.

Every degree set, micro-batch and rank order for N GPUs is listed, filtered by memory and ranked by step time;
the table gives the seconds the whole search takes (wall clock, and the process's CPU time, which other work on a
shared machine does not inflate), the degree sets it considered and the best layout it found.

    python bench/plan_search.py [--model llama3-70b] [--gpus 16384 4096 512] [--hardware h100]
    python bench/plan_search.py --model mixtral-8x7b --gpus 2048
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fmesh.plan.hardware import HARDWARE, hardware
from fmesh.plan.model import PRESETS, Options, preset
from fmesh.plan.search import candidates, search


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(PRESETS), default="llama3-70b")
    parser.add_argument("--gpus", type=int, nargs="+", default=[16384, 4096, 512])
    parser.add_argument("--hardware", choices=tuple(HARDWARE), default="h100")
    args = parser.parse_args(argv)
    model, kind = preset(args.model), hardware(args.hardware)
    print(f"{args.model} on {args.hardware}, 8 GPUs per node")
    print(f"{'GPUs':>6}  {'degree sets':>11}  {'search':>8}  {'CPU':>8}  best layout (step time)")
    for gpus in args.gpus:
        began, cpu = time.perf_counter(), time.process_time()
        best = search(model, Options(), gpus, 8, kind, top=5)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        count = sum(1 for _ in candidates(model, gpus))
        shown = f"{best[0].label} ({best[0].time.total:.2f} s)" if best else "nothing fits"
        print(f"{gpus:>6}  {count:>11}  {seconds:>7.2f}s  {cpu:>7.2f}s  {shown}")


if __name__ == "__main__":
    main()
