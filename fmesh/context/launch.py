"""Run collectives on simulated ranks from a notebook on a CPU.

* :func:`launch` starts ``world_size`` real gloo processes on loopback, gives each
  a :class:`~fmesh.Context`, runs ``fn(ctx)`` and returns every rank's result.
* :func:`simulate` runs every rank at once in this process: torch's
  ``LocalTensorMode`` over the fake backend executes each collective for all
  simulated ranks together.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from fmesh.context.context import Context


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a launched rank (its ``__cause__``)."""


class LaunchError(RuntimeError):
    """A launched rank failed with an exception that could not be sent back as itself."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(fn: Callable[[Context], Any], rank: int, world_size: int, port: int, timeout: float, out: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        with Context(backend="gloo", init_method="env://", rank=rank, world_size=world_size, timeout=timeout) as ctx:
            result = fn(ctx)
        out.put((rank, "ok", pickle.dumps(result)))
    except BaseException as error:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        try:
            payload = pickle.dumps(error)
            pickle.loads(payload)
        except Exception:
            payload = None
        out.put((rank, "error", (payload, f"{type(error).__name__}: {error}", text)))


def launch(fn: Callable[[Context], Any], world_size: int = 4, *, timeout: float = 120) -> list[Any]:
    """``[fn(ctx) for each rank]``, each rank a real gloo process with its own :class:`Context`.

    Works with functions defined in a notebook cell (processes are forked on
    Linux; elsewhere ``fn`` must be importable). A rank that raises makes the
    whole launch raise that exception, with the rank's traceback as its
    ``__cause__``; a launch that outlives ``timeout`` seconds raises
    ``TimeoutError``. Either way no process is left behind.

    >>> import fmesh, torch
    >>> def total(ctx):
    ...     mesh = fmesh.make_mesh((2,), ("dp",))
    ...     return ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), mesh, "dp").item()
    >>> fmesh.launch(total, world_size=2)
    [3.0, 3.0]
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not callable(fn):
        raise TypeError(f"launch runs a function of one argument (the Context), got {fn!r}")
    if torch.distributed.is_initialized():
        raise RuntimeError(
            "this process already has a default process group (a Context is open?); close it before "
            "launch(), whose processes would otherwise inherit it"
        )
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context: Any = mp.get_context(method)
    out = context.Queue()
    port = _free_port()
    procs = [
        context.Process(target=_child, args=(fn, rank, world_size, port, timeout, out), daemon=True)
        for rank in range(world_size)
    ]
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.start()
        while len(results) < world_size:
            try:
                rank, status, payload = out.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise LaunchError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}") from None
                if time.monotonic() > deadline:
                    waiting = sorted(set(range(world_size)) - results.keys())
                    raise TimeoutError(
                        f"launch: ranks {waiting} did not finish within {timeout}s (a hang, or a rank waiting "
                        "for one that never comes); all processes were stopped"
                    ) from None
                continue
            if status == "ok":
                results[rank] = pickle.loads(payload)
                continue
            original, summary, text = payload
            cause = RemoteTraceback(f"on rank {rank}:\n{text}")
            if original is not None:
                error = pickle.loads(original)
                error.rank = rank
                raise error from cause
            raise LaunchError(f"rank {rank} failed: {summary}") from cause
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        out.close()
    return [results[rank] for rank in range(world_size)]


@attrs.frozen
class Simulation:
    """Every rank of a world at once in this process (see :func:`simulate`)."""

    ctx: Context
    mode: Any

    @property
    def world_size(self) -> int:
        """Number of simulated ranks."""
        return self.ctx.world_size

    def per_rank(self, make: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """One tensor standing for ``make(rank)`` on every simulated rank."""
        made: torch.Tensor = self.mode.rank_map(make)
        return made

    def values(self, tensor: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each simulated rank's value of ``tensor`` (from :meth:`per_rank` or a collective)."""
        local = getattr(tensor, "_local_tensors", None)
        if local is None:
            return dict.fromkeys(range(self.world_size), tensor)
        return dict(local)


@contextlib.contextmanager
def simulate(world_size: int) -> Iterator[Simulation]:
    """All ``world_size`` ranks in this process: collectives and DTensor run for every rank at once.

    Uses torch's ``LocalTensorMode`` over the fake backend. Its collectives need
    groups whose ranks are sorted and evenly spaced (an identity rank map and
    axes that are one stride apart); use :func:`launch` for the others.

    >>> import fmesh, torch
    >>> with fmesh.simulate(4) as sim:
    ...     mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    ...     total = sim.ctx.all_reduce(sim.per_rank(lambda r: torch.tensor([float(r)])), mesh, "tp")
    ...     {rank: t.item() for rank, t in sim.values(total).items()}
    {0: 1.0, 1: 1.0, 2: 5.0, 3: 5.0}
    """
    from torch.distributed._local_tensor import LocalTensorMode

    with Context.fake(world_size, rank=0, simulated=True) as ctx, LocalTensorMode(world_size) as mode:
        yield Simulation(ctx, mode)
