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
from fmesh.context.store.rendezvous import count_connected, meet, post_failure


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


def test_ranks_whose_context_options_differ_are_each_told_which_field_and_whose() -> None:
    """The Context's wire-relevant options travel in the start's own ``compare_set`` (issue 37: no meeting of their
    own): a rank that means others ends the meeting, and every rank raises ValueError naming both ranks and the
    field that differs, within seconds."""
    store = dist.HashStore()
    outcome: dict[int, Any] = {}

    def rank_of(rank: int) -> None:
        while rank != 0 and not store.check([keys.start(1).compared]):  # rank 0 compares first: its options stay
            time.sleep(0.01)
        started = time.monotonic()
        try:
            meet(store, rank=rank, world_size=3, timeout=timedelta(seconds=20),
                 options={"backend": "'gloo'", "check_tensors": "'steady'" if rank != 1 else "'off'"})
            outcome[rank] = (None, time.monotonic() - started)
        except Exception as error:
            outcome[rank] = (error, time.monotonic() - started)

    in_threads(rank_of, [0, 1, 2])
    for error, seconds in outcome.values():
        assert isinstance(error, ValueError), outcome
        assert "rank 1's Context options differ from rank 0's, which started first" in str(error), error
        assert "check_tensors: 'off' on rank 1, 'steady' on rank 0" in str(error) and "backend" not in str(error)
        assert seconds < within(5), outcome


def test_ranks_whose_options_agree_meet_and_count_their_connections_in_two_operations_each() -> None:
    store = dist.HashStore()
    held: dict[int, keys.MeetingKeys] = {}

    def rank_of(rank: int) -> None:
        held[rank] = meet(store, rank=rank, world_size=3, timeout=timedelta(seconds=20), options={"backend": "'gloo'"})
        counted = Counting(store)
        count_connected(counted, held[rank], rank=rank, world_size=3, timeout=timedelta(seconds=20))
        assert counted.calls <= 3, counted.calls  # one add and one read (and the verdict, for the last)

    in_threads(rank_of, [0, 1, 2])
    assert len(set(held.values())) == 1


def test_a_rank_that_never_connects_is_a_timeout_and_one_that_ended_is_named() -> None:
    meeting = keys.start("connect-test")
    with pytest.raises(fmesh.GroupTimeoutError, match=r"only 1 of the job's 2 processes connected their default"):
        count_connected(dist.HashStore(), meeting, rank=0, world_size=2, timeout=timedelta(seconds=0.3))
    started = time.monotonic()
    with pytest.raises(fmesh.RankLostError, match=r"the processes of ranks \[1\] ended before the job's default"):
        count_connected(dist.HashStore(), meeting, rank=0, world_size=2, timeout=timedelta(seconds=20),
                        gone=lambda: [1])
    assert time.monotonic() - started < within(5)


class Counting:
    """A store that counts the operations made through it (its clones' too: a blocking wait's connection)."""

    def __init__(self, inner: dist.Store, calls: list[int] | None = None) -> None:
        self.inner, self.counter = inner, calls if calls is not None else [0]

    @property
    def calls(self) -> int:
        return self.counter[0]

    def clone(self) -> Counting:
        return Counting(self.inner, self.counter)

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.inner, name)
        if name == "set_timeout":  # the client's own setting: the store sees nothing
            return call

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counter[0] += 1
            return call(*args, **kwargs)

        return counted
