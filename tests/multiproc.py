"""Run a module-level function on N gloo processes on loopback; bounded in time."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple[Any, ...], out: Any) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )
    try:
        out.put((rank, True, fn(rank, world, *args)))
    except BaseException as error:  # report everything, including timeouts, to the parent
        out.put((rank, False, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def _outcomes(fn: Callable[..., Any], world: int, args: tuple[Any, ...], timeout: float) -> dict[int, tuple[bool, Any]]:
    """Start ``world`` processes; rank -> (ok, result or error text). Kills stragglers on the way out."""
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    procs = [context.Process(target=_child, args=(fn, r, world, port, args, out), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    outcomes: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in range(world):
            rank, ok, value = out.get(timeout=timeout)
            outcomes[rank] = (ok, value)
    except queue.Empty:
        missing = sorted(set(range(world)) - outcomes.keys())
        raise TimeoutError(f"ranks {missing} did not finish within {timeout}s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return outcomes


def run(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120) -> list[Any]:
    """``[fn(rank, world, *args) for rank in range(world)]``, each in its own process.

    Raises ``RuntimeError`` with the failing rank's traceback, or ``TimeoutError``;
    leaves no process behind either way.
    """
    outcomes = _outcomes(fn, world, args, timeout)
    failures = {rank: value for rank, (ok, value) in outcomes.items() if not ok}
    if failures:
        raise RuntimeError("\n".join(f"rank {r} failed: {msg}" for r, msg in sorted(failures.items())))
    return [outcomes[r][1] for r in range(world)]


def failures_of(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120) -> dict[int, str]:
    """Like :func:`run` but returns each rank's error text ("" for success), for tests of failures."""
    return {rank: "" if ok else value for rank, (ok, value) in _outcomes(fn, world, args, timeout).items()}
