"""Benchmark: how long gloo's set-up of a group holds the other members when one dies inside it.

    python bench/gloo_set_up.py            # groups of 3, 5, 8 and 16 (about 1.5 minutes)
    python bench/gloo_set_up.py --quick    # groups of 3 and 8 (about 30 s)

Each run starts G processes on one ``TCPStore``; they build a ``ProcessGroupGloo`` with a connect timeout T, one
member comes 1 s late, and another is killed (SIGKILL) 50 ms into its set-up, so it dies while its peers connect.
The table gives each run's longest wait among the survivors (from the late member's arrival, when set-up could first
finish) in seconds and in units of T. torch hands gloo one timeout, and gloo's members wait on each other's
connections in turn: the others raise after five of them, whatever the group's size
(``fmesh.context.set_up.GLOO_SET_UP_WAITS``): with the 15 s bound, 75 s; so fmesh tries 3 s first
(``fmesh.context.set_up.connect_tries``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import signal
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist

from fmesh.context.launch import free_port
from fmesh.context.set_up import GLOO_SET_UP_WAITS, NEW_WORLD_CONNECT, connect_tries

LATE = 1.0  # seconds the last member comes after the others
KILL_AFTER = 0.05  # seconds into its set-up the victim is killed
VICTIM = 1
TIMEOUT = 2.0  # the connect timeout T of the runs: short, so that the table takes seconds


def _member(rank: int, size: int, port: int, timeout: float, results: multiprocessing.Queue[tuple[int, float, str]]) \
        -> None:
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timedelta(seconds=120))
    if rank == size - 1:
        time.sleep(LATE)
    if rank == VICTIM and os.fork() == 0:  # the killer: its parent dies inside gloo's set-up
        time.sleep(KILL_AFTER)
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(0)
    started = time.monotonic()
    try:
        dist.ProcessGroupGloo(dist.PrefixStore("group", store), rank, size, timedelta(seconds=timeout))
        outcome = "connected"
    except RuntimeError as error:
        outcome = "raised" if "connectFullMesh" in str(error) else f"raised {type(error).__name__}"
    results.put((rank, time.monotonic() - started - (0.0 if rank == size - 1 else LATE), outcome))
    if rank == 0:  # the store's host stays until the others have raised
        time.sleep(GLOO_SET_UP_WAITS * timeout + 2 * LATE)


def longest_wait(size: int, timeout: float) -> tuple[float, int]:
    """The longest a survivor of a group of ``size`` waited in gloo's set-up (seconds, from the late member's
    arrival) with connect timeout ``timeout``, and how many survivors raised."""
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[tuple[int, float, str]] = context.Queue()
    port = free_port()
    members = [context.Process(target=_member, args=(rank, size, port, timeout, results)) for rank in range(size)]
    for member in members:
        member.start()
    seen: list[tuple[int, float, str]] = []
    deadline = time.monotonic() + 2 * GLOO_SET_UP_WAITS * timeout + 30
    while len(seen) < size - 1 and time.monotonic() < deadline:
        try:
            seen.append(results.get(timeout=1))
        except queue.Empty:
            continue
    for member in members:
        member.kill()
        member.join()
    return max((waited for _, waited, _ in seen), default=float("nan")), sum(o == "raised" for _, _, o in seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two group sizes (a smoke run)")
    args = parser.parse_args()
    sizes = [3, 8] if args.quick else [3, 5, 8, 16]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; a member killed {KILL_AFTER * 1000:.0f} ms into gloo's "
          f"set-up, another {LATE:g} s late\n")
    print("| group | connect timeout T (s) | survivors that raised | longest wait (s) | longest wait / T |")
    print("| --- | --- | --- | --- | --- |")
    for size in sizes:
        waited, raised = longest_wait(size, TIMEOUT)
        print(f"| {size} | {TIMEOUT:g} | {raised} of {size - 1} | {waited:.1f} | {waited / TIMEOUT:.2f} |", flush=True)
    tries = [connect.total_seconds() for connect in connect_tries(NEW_WORLD_CONNECT)]
    print(f"\nfmesh sets up a group agreed on its own (on first use) in tries of T = "
          f"{' then '.join(f'{t:g}' for t in tries)} s: a death inside the first holds the others "
          f"{GLOO_SET_UP_WAITS} x {tries[0]:g} s (a mesh's groups agreed in one meeting: one try of {tries[-1]:g} s).")


if __name__ == "__main__":
    main()
