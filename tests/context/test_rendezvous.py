"""The start rendezvous on an in-process store, ranks as threads: ranks that all come meet; a rank that
reports a bad launcher environment, or means another world size, ends every other rank's wait at once; a rank
that never comes is a timeout naming how many came."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from support import in_threads, within

import fmesh
from fmesh.context.store import keys
from fmesh.context.store.rendezvous import meet, post_failure


def ranks_meet(store: dist.Store, world_sizes: dict[int, int], seconds: float = 20) -> dict[int, Any]:
    """Each rank meets in a thread with its own world size; rank -> (None or the exception, seconds taken)."""
    outcome: dict[int, Any] = {}

    def rank_of(rank: int) -> None:
        started = time.monotonic()
        try:
            meet(store, rank=rank, world_size=world_sizes[rank], timeout=timedelta(seconds=seconds))
            outcome[rank] = (None, time.monotonic() - started)
        except Exception as error:
            outcome[rank] = (error, time.monotonic() - started)

    in_threads(rank_of, list(world_sizes))
    return outcome


def test_ranks_that_all_come_meet_and_meet_again_on_their_next_start() -> None:
    store = dist.HashStore()
    for _ in range(2):  # a second start (a default group made again) meets under its own keys
        outcome = ranks_meet(store, {0: 3, 1: 3, 2: 3})
        assert all(error is None for error, _ in outcome.values()), outcome


def test_a_reported_bad_environment_ends_every_wait_naming_what_that_process_read() -> None:
    store = dist.HashStore()
    threading.Timer(0.5, post_failure, (store, {"RANK": "abc"}, ValueError("the launcher's RANK='abc'"))).start()
    outcome = ranks_meet(store, {0: 3, 1: 3})  # rank 2 is the one that cannot start
    for error, seconds in outcome.values():
        assert isinstance(error, fmesh.RankLostError) and "could not start" in str(error), outcome
        assert "ValueError: the launcher's RANK='abc' (it read RANK='abc'; host" in str(error) and seconds < within(3)


def test_ranks_started_with_different_world_sizes_are_told_so() -> None:
    outcome = ranks_meet(dist.HashStore(), {0: 2, 1: 3})
    errors = {type(error).__name__: str(error) for error, _ in outcome.values()}
    assert sorted(errors) == ["RankLostError", "ValueError"], outcome  # the second to come raises, and tells
    assert "but another rank of this job started with WORLD_SIZE=" in errors["ValueError"]
    assert errors["ValueError"].partition(": ")[0] in errors["RankLostError"]


def test_a_rank_that_never_comes_is_a_timeout_naming_how_many_came() -> None:
    outcome = ranks_meet(dist.HashStore(), {0: 2}, seconds=0.3)
    with pytest.raises(fmesh.GroupTimeoutError, match=r"only 1 of the job's 2 processes started within 0\.3s"):
        raise outcome[0][0]


def test_a_second_process_with_the_same_rank_is_told_so_and_every_waiting_rank_stops() -> None:
    # Another process (pid 1) claimed RANK=1 first; this one, started with RANK=1 too, is refused naming both, and
    # rank 0, waiting for the job, stops at once naming what it read (it paired with the wrong process, or hung).
    store = dist.HashStore()
    store.set(keys.start_claim("0", 1), "host elsewhere, pid 1")
    outcome = ranks_meet(store, {0: 2, 1: 2})
    duplicate, waiting = outcome[1][0], outcome[0][0]
    assert isinstance(duplicate, fmesh.LaunchError), outcome
    assert "two processes of this job read RANK=1: this one (host " in str(duplicate)
    assert "and another (host elsewhere, pid 1) that started first" in str(duplicate)
    assert isinstance(waiting, fmesh.RankLostError) and "two processes of this job read RANK=1" in str(waiting)
    assert outcome[0][1] < within(5), outcome


def test_a_process_that_starts_again_keeps_its_rank() -> None:
    store = dist.HashStore()
    for _ in range(2):  # one process, two starts (threads of it here): its claim is its own
        assert all(error is None for error, _ in ranks_meet(store, {0: 2, 1: 2}).values())
