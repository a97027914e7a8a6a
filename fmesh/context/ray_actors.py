"""Ranks as Ray actors: a launcher whose engine keeps the survivors when a rank dies, on one machine or many.

torchrun's agent stops every worker of a job when one fails, so no survivor is left to :meth:`~fmesh.Context.recover`
in place; Slurm's ``srun`` keeps them only without ``--kill-on-bad-exit``. Ray keeps them: each rank is an actor (a
process of its own on some node of the cluster), and an actor's death ends only that actor. :func:`launch` starts
``world_size`` actors, hosts the job's store in the calling process (the driver, as torchrun's agent hosts it, so the
store outlives every rank), runs ``fn(ctx)`` on each with a :class:`~fmesh.Context` made from the launcher's
variables, and returns each rank's result. It watches the actors: a dead one is marked in the store (the survivors'
roll call ends at once, naming it) and, with ``on_rank_loss="continue"``, its place in the result is a
:class:`~fmesh.LaunchError`, while the survivors recover and go on.

Needs ``ray`` (``pip install fmesh[ray]``); importing this module does not: Ray is imported when :func:`launch` runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fmesh.context.context import Context
from fmesh.context.launch import COLLECTIVE_SHARE, CREATION_SHARE, ON_RANK_LOSS, OnRankLoss, free_port
from fmesh.context.options import DEFAULT_CREATION_TIMEOUT, normalize_timeout
from fmesh.context.store.board import mark_ended
from fmesh.context.store.hosting import host_store
from fmesh.errors import LaunchError
from fmesh.layout.int_tuple import is_int

POLL_SECONDS = 0.2  # how often the driver looks for a finished or dead actor


def _ray() -> Any:
    """The ``ray`` module; ``ImportError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError("fmesh.context.ray_actors needs ray: pip install 'fmesh[ray]' (or pip install ray)") from None
    return ray


def start_local_cluster(**options: Any) -> None:
    """Start a local Ray cluster (``ray.init(**options)``) whose workers run at this process's priority. Ray starts
    its workers at nice 15 (its ``worker_niceness``): beside busy processes a rank's actor barely ran (still importing
    torch after 90 s beside six busy loops on 2 cores; its rank started within 13 s at nice 0).

    Not run as a doctest (it starts Ray's processes):

    >>> start_local_cluster(num_cpus=4)  # doctest: +SKIP
    """
    _ray().init(include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0}, **options)


class RankActor:
    """One rank of the job, in an actor process of its own (made a Ray actor class by :func:`launch`)."""

    def pid(self) -> int:
        """This actor's process id (the driver's handle to kill it, or to see that it died)."""
        return os.getpid()

    def run(self, fn: Callable[[Context], Any], rank: int, world_size: int, address: str, port: int,
            options: Mapping[str, Any]) -> Any:
        """``fn(ctx)`` with a Context made from the launcher's variables (the store is the driver's)."""
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=address, MASTER_PORT=str(port),
                          LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), TORCHELASTIC_USE_AGENT_STORE="True")
        torch.set_num_threads(1)
        with Context(backend="gloo", init_method="env://", rank=rank, world_size=world_size, **options) as ctx:
            return fn(ctx)


def launch(fn: Callable[[Context], Any], world_size: int = 4, *, timeout: float = 120,
           context_options: Mapping[str, Any] | None = None, on_rank_loss: OnRankLoss = "fail",
           return_exceptions: bool = False, cpus_per_rank: float = 1.0) -> list[Any]:
    """``[fn(ctx) for each rank]``, each rank a Ray actor with its own :class:`~fmesh.Context` (gloo), on the Ray
    cluster this process is connected to (``ray.init()`` first; a local one is started if none is). Options as
    :func:`fmesh.launch`'s: a rank that raises makes the launch raise it (``return_exceptions``: its place holds it);
    an actor that dies ends the launch with :class:`~fmesh.LaunchError`, or, with ``on_rank_loss="continue"``, the
    survivors go on (the store is this process's) and the dead rank's place holds that ``LaunchError``. Every actor
    is killed when the launch returns or raises.

    >>> launch(lambda ctx: ctx.rank, 0)
    Traceback (most recent call last):
    ...
    ValueError: world_size must be a positive int, got 0
    """
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if on_rank_loss not in ON_RANK_LOSS:
        raise ValueError(f"on_rank_loss: expected one of {ON_RANK_LOSS}, but got {on_rank_loss!r}")
    normalize_timeout(timeout)
    if not callable(fn):
        raise TypeError(f"launch runs a function of one argument (the Context), got {fn!r}")
    ray = _ray()
    if not ray.is_initialized():
        start_local_cluster()
    options = {"timeout": COLLECTIVE_SHARE * timeout,
               "creation_timeout": min(CREATION_SHARE * timeout, DEFAULT_CREATION_TIMEOUT.total_seconds()),
               **(context_options or {})}
    address = ray.util.get_node_ip_address()
    port = free_port()
    store = host_store(port, world_size, timeout, host=address)
    actor_class = ray.remote(num_cpus=cpus_per_rank)(RankActor)
    actors = [actor_class.remote() for _ in range(world_size)]
    try:
        refs = {actor.run.remote(fn, rank, world_size, address, port, options): rank
                for rank, actor in enumerate(actors)}
        return _gather(ray, refs, store, world_size, time.monotonic() + timeout, timeout, on_rank_loss,
                       return_exceptions)
    finally:
        for actor in actors:
            ray.kill(actor)
        del store


def _gather(ray: Any, refs: dict[Any, int], store: Any, world_size: int, deadline: float, timeout: float,
            on_rank_loss: str, return_exceptions: bool) -> list[Any]:
    """Every rank's result, as each comes; a dead actor marked in the store at once."""
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
        for ref in done:
            rank = refs[ref]
            try:
                results[rank] = ray.get(ref)
            except ray.exceptions.RayActorError:
                error = LaunchError(f"rank {rank} died (its Ray actor ended)")
                error.rank = rank  # type: ignore[attr-defined]
                mark_ended(store, rank, "actor died")  # the survivors' roll call need not wait for it
                if on_rank_loss != "continue" and not return_exceptions:
                    raise error from None
                results[rank] = error
            except ray.exceptions.RayTaskError as failure:
                cause: BaseException = failure.cause if isinstance(failure.cause, BaseException) else failure
                cause.rank = rank  # type: ignore[attr-defined]
                if not return_exceptions:
                    raise cause from None
                results[rank] = cause
        if pending and time.monotonic() > deadline:
            waiting = sorted(refs[ref] for ref in pending)
            raise TimeoutError(f"launch: ranks {waiting} did not finish within {timeout}s (a hang, or a rank waiting "
                               "for one that never comes); every actor was killed")
    return [results[rank] for rank in range(world_size)]
