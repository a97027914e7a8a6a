"""Run collectives on simulated ranks from a notebook, or in tests, on a CPU.

* :func:`launch` starts ``world_size`` real gloo processes on loopback, gives each
  a :class:`~fmesh.Context`, runs ``fn(ctx)`` and returns every rank's result.
* :func:`simulate` runs every rank at once in this process: torch's
  ``LocalTensorMode`` over the fake backend executes each collective for all
  simulated ranks together.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, get_args

import attrs
import torch

from fmesh.context import _torch
from fmesh.context.context import Context
from fmesh.context.options import DEFAULT_CREATION_TIMEOUT, normalize_timeout
from fmesh.context.store.board import mark_ended
from fmesh.context.store.hosting import host_store
from fmesh.errors import LaunchError, RemoteTraceback
from fmesh.layout.int_tuple import is_int

StartMethod = Literal["fork", "spawn", "forkserver"]
"""How :func:`launch` starts its processes (``multiprocessing``'s start methods)."""
OnRankLoss = Literal["fail", "continue"]
"""What :func:`launch` does when a rank's process dies: end the launch, or let the others go on (and recover)."""
START_METHODS: tuple[StartMethod, ...] = get_args(StartMethod)
ON_RANK_LOSS: tuple[OnRankLoss, ...] = get_args(OnRankLoss)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The ranks' own timeouts, as shares of the launch's: a rank waiting for a missing peer raises fmesh's error
# (naming the peer) before the launch gives up with its generic TimeoutError.
COLLECTIVE_SHARE = 0.8
CREATION_SHARE = 0.5


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now (for a rendezvous).

    >>> import socket
    >>> port = free_port()
    >>> with socket.socket() as s:  # nobody holds it: we can listen on it
    ...     s.bind(("127.0.0.1", port))
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with(parent: int | None) -> None:
    """End this process when ``parent`` (the launching process) ends, however it ends (SIGTERM, SIGKILL):
    the kernel sends SIGKILL on Linux; elsewhere a thread watches the parent's pid. ``None``: this process's parent is
    multiprocessing's fork server, which ends when the launching process does."""
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True, name="fmesh-parent-watch").start()
    if os.getppid() != parent:  # it ended before the line above
        os.kill(os.getpid(), signal.SIGKILL)


def _child(fn: Callable[[Context], Any], rank: int, world_size: int, port: int, options: dict[str, Any],
           out: Any, parent: int | None) -> None:
    _die_with(parent)
    # The store is the launcher's (as torchrun's agent hosts it), so it outlives any rank: the others
    # can still read what a failed rank posted.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1", TORCHELASTIC_USE_AGENT_STORE="True")
    torch.set_num_threads(1)
    try:
        with Context(backend="gloo", init_method="env://", rank=rank, world_size=world_size, **options) as ctx:
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


def _remote_error(rank: int, payload: tuple[bytes | None, str, str]) -> BaseException:
    """The exception a rank reported, with ``.rank`` set and its traceback as ``__cause__``."""
    original, summary, text = payload
    error: BaseException = pickle.loads(original) if original is not None else LaunchError(
        f"rank {rank} failed: {summary}")
    error.rank = rank  # type: ignore[attr-defined]
    error.__cause__ = RemoteTraceback(f"on rank {rank}:\n{text}")
    return error


def _check_launch(fn: object, world_size: object, start_method: str | None, timeout: object,
                  on_rank_loss: object = "fail") -> str:
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if on_rank_loss not in ON_RANK_LOSS:
        raise ValueError(f"on_rank_loss: expected one of {ON_RANK_LOSS}, but got {on_rank_loss!r}")
    normalize_timeout(timeout)  # a number of seconds in the valid range
    if not callable(fn):
        raise TypeError(f"launch runs a function of one argument (the Context), got {fn!r}")
    if start_method is None:
        start_method = "fork" if sys.platform.startswith("linux") else "spawn"
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method != "fork":
        try:
            pickle.dumps(fn)
        except Exception as error:
            raise TypeError(
                f"with start_method={start_method!r} each process imports fn, so it must be a module-level "
                f"function; {fn!r} is not importable ({error}). Define it at module level, or use 'fork'"
            ) from None
    return start_method


def launch(
    fn: Callable[[Context], Any],
    world_size: int = 4,
    *,
    timeout: float = 120,
    context_options: Mapping[str, Any] | None = None,
    return_exceptions: bool = False,
    start_method: StartMethod | None = None,
    on_rank_loss: OnRankLoss = "fail",
) -> list[Any]:
    """``[fn(ctx) for each rank]``, each rank a real gloo process with its own :class:`Context`.

    Works with functions defined in a notebook cell (processes are forked on Linux; with
    ``start_method="spawn"`` or ``"forkserver"``, or off Linux, ``fn`` must be importable; the fork server imports
    torch and fmesh once, where each spawned rank imports them itself). ``context_options`` go to
    each rank's ``Context``; its ``timeout`` defaults to 80% of the launch's and its ``creation_timeout``
    to half of it (at most the usual 2 min), so that a rank waiting for a missing peer raises fmesh's
    error, naming the peer, before the launch gives up. The ranks end with the launching process,
    however it ends (SIGTERM, SIGKILL): none is orphaned. A rank that raises makes the
    whole launch raise that exception, with ``.rank`` set and the rank's traceback as its
    ``__cause__``; with ``return_exceptions=True`` the exception takes that rank's place in the
    result instead, and the other ranks run on. A launch that outlives ``timeout`` seconds raises
    ``TimeoutError``. Either way no process is left behind.

    A rank process that dies (exits, or is killed, without returning) ends the launch with a
    :class:`~fmesh.LaunchError` naming its exit code. With ``on_rank_loss="continue"`` the other ranks
    live on instead (the store is this process's, so it survives any rank): the dead rank's place in the
    result holds that ``LaunchError`` (``.rank`` and ``.exitcode`` set), so the result says which ranks
    died; the survivors can :meth:`~fmesh.Context.recover` and finish. Exceptions a rank raises are
    still governed by ``return_exceptions``.

    >>> import fmesh, torch
    >>> def total(ctx):
    ...     mesh = fmesh.make_mesh((2,), ("dp",))
    ...     return ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), mesh, "dp").item()
    >>> fmesh.launch(total, world_size=2)
    [3.0, 3.0]
    """
    method = _check_launch(fn, world_size, start_method, timeout, on_rank_loss)
    options = {"timeout": COLLECTIVE_SHARE * timeout,
               "creation_timeout": min(CREATION_SHARE * timeout, DEFAULT_CREATION_TIMEOUT.total_seconds()),
               **(context_options or {})}
    if torch.distributed.is_initialized():
        raise RuntimeError(
            "this process already has a default process group (a Context is open?); close it before "
            "launch(), whose processes would otherwise inherit it"
        )
    context: Any = mp.get_context(method)
    if method == "forkserver":  # its server imports torch and fmesh once, and each rank forks from it (not seconds)
        context.set_forkserver_preload(["__main__", "torch", "fmesh"])
    out = context.Queue()
    port = free_port()
    procs = [
        context.Process(target=_child, args=(fn, rank, world_size, port, options, out,
                                             None if method == "forkserver" else os.getpid()), daemon=True)
        for rank in range(world_size)
    ]
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    store = None
    try:
        # Forked ranks inherit this process's objects frozen (the gc module's copy-on-write advice): a rank's
        # full collection, such as a Context's close, then walks only what the rank made, not everything
        # the parent had loaded (a second or more in a large test process, ~80 ms in a small one).
        if method == "fork":
            gc.freeze()
        try:
            for proc in procs:
                proc.start()
        finally:
            if method == "fork":
                gc.unfreeze()
        # After the forks (a forked child must not inherit the store's server thread).
        store = host_store(port, world_size, timeout)
        while len(results) < world_size:
            try:
                rank, status, payload = out.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                for rank in dead:
                    error = LaunchError(f"rank {rank} died with exit code {procs[rank].exitcode}")
                    if not (return_exceptions or on_rank_loss == "continue"):
                        raise error from None
                    error.rank = rank  # type: ignore[attr-defined]
                    error.exitcode = procs[rank].exitcode  # type: ignore[attr-defined]
                    results[rank] = error
                    # The survivors' roll call need not wait for it: it can never answer.
                    mark_ended(store, rank, procs[rank].exitcode)
                if time.monotonic() > deadline and len(results) < world_size:
                    waiting = sorted(set(range(world_size)) - results.keys())
                    raise TimeoutError(
                        f"launch: ranks {waiting} did not finish within {timeout}s (a hang, or a rank waiting "
                        "for one that never comes); all processes were stopped"
                    ) from None
                continue
            if status == "ok":
                results[rank] = pickle.loads(payload)
                continue
            failure = _remote_error(rank, payload)
            if not return_exceptions:
                raise failure
            results[rank] = failure
            # Its process ends now, and a rank that raised out of a recovery posts nothing more (a forked process runs
            # no exit hook): the survivors waiting for it are told at once.
            mark_ended(store, rank, "raised")
    finally:
        started = [proc for proc in procs if proc.pid is not None]
        for proc in started:
            if proc.is_alive():
                proc.terminate()
        for proc in started:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()  # its pipe now, not when an exception holding this frame is collected
        out.close()
        # The last references, now rather than when an exception holding this frame is collected: the store's
        # server stops, and the queue's pipes close.
        del store, out
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
        local = _torch.local_values(tensor)
        return dict.fromkeys(range(self.world_size), tensor) if local is None else local


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
    with Context.fake(world_size, rank=0, simulated=True) as ctx, _torch.local_tensor_mode(world_size) as mode:
        yield Simulation(ctx, mode)
