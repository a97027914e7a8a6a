"""Two halves of a world that call each other lost (#29): ranks 0 and 1 recover without 2 and 3 while 2 and 3
recover without 0 and 1, nobody dead. Both halves must never go on into crossed worlds (rank 0 with 3, rank 1 with 2,
an all_reduce summing the wrong ranks): when they come together, every rank gets ``RecoveryError``; when one half
comes after the other went on, the late half is refused and the first half's world is whole.

The agreement is checked in threads of this process against one real ``TCPStore`` (20 rounds with jitter), and
end to end by ``Context.recover`` in 4 processes.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import in_threads, launch, patience, within

import fmesh
from fmesh import Context
from fmesh.context.store.board import Board
from fmesh.context.store.recovery_vote import ALIVE_GRACE_SECONDS, agree_on_loss

HALVES = {0: [2, 3], 1: [2, 3], 2: [0, 1], 3: [0, 1]}  # each rank's lost set: the other half

pytestmark = pytest.mark.usefixtures("nothing_left_behind")  # tests/support.py: nothing left behind


def tcp_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=60), wait_for_workers=False, use_libuv=True)


def split(store: dist.Store, prefix: str, delays: dict[int, float], late: Sequence[int] = ()) -> dict[int, Any]:
    """Every rank's outcome of recovering without the other half (its held groups, or its error), each rank a
    thread with its own connection that starts after ``delays[rank]`` seconds; the ``late`` ranks start once every
    other rank has its outcome (past any grace those gave them, however slow the machine)."""
    for rank in HALVES:  # as every Context does at its start: each rank's status is there
        Board(store, prefix, rank, timedelta(seconds=30)).post("running")
    outcomes: dict[int, Any] = {}
    ended = {rank: threading.Event() for rank in HALVES}

    def recover(rank: int) -> None:
        if rank in late:
            for other in HALVES:
                if other not in late:
                    ended[other].wait(patience(60))
        time.sleep(delays[rank])
        lost = HALVES[rank]
        agreement = Board(store.clone(), prefix, rank, timedelta(seconds=30))  # type: ignore[attr-defined]
        try:
            outcomes[rank] = agree_on_loss(agreement, [r for r in HALVES if r not in lost], lost, [])
        except fmesh.RecoveryError as error:
            outcomes[rank] = error
        finally:
            ended[rank].set()

    in_threads(recover, list(HALVES), timeout=60)
    return outcomes


@pytest.mark.slow  # 20 rounds of four threads: about 20 s
def test_two_halves_that_call_each_other_lost_all_fail_in_20_of_20_rounds() -> None:
    store, jitter = tcp_store(), random.Random(29)
    for round_ in range(20):
        outcomes = split(store, f"round{round_}", {rank: jitter.uniform(0, 0.3) for rank in HALVES})
        assert sorted(outcomes) == [0, 1, 2, 3]
        for rank, outcome in outcomes.items():
            assert isinstance(outcome, fmesh.RecoveryError), (round_, rank, outcome)
            assert "disagree about the ranks lost" in str(outcome) or "fenced it out" in str(outcome), outcome


def test_a_half_that_comes_after_the_other_went_on_is_refused() -> None:
    """Ranks 2 and 3 come past the grace the last of 0 and 1 gives them: 0 and 1 recover together, and 2 and 3 are
    told they were fenced out; never both halves."""
    outcomes = split(tcp_store(), "late", dict.fromkeys(HALVES, 0.0), late=(2, 3))
    assert outcomes[0] == outcomes[1] == {}, outcomes  # they recovered (holding no group)
    for rank in (2, 3):
        assert isinstance(outcomes[rank], fmesh.RecoveryError), outcomes[rank]
        assert "already fenced it out of their world" in str(outcomes[rank]), outcomes[rank]


def test_survivors_told_the_lost_rank_is_alive_name_it() -> None:
    """Rank 2, called lost by 0 and 1, comes to recover without rank 3 only: the error names rank 2 and its set."""
    store = tcp_store()
    for rank in range(4):
        Board(store, "alive", rank, timedelta(seconds=30)).post("running")
    outcomes: dict[int, Any] = {}
    claims = {0: [2, 3], 1: [2, 3], 2: [3]}

    def recover(rank: int) -> None:
        agreement = Board(store.clone(), "alive", rank, timedelta(seconds=30))
        survivors = [r for r in range(4) if r not in claims[rank]]
        try:
            outcomes[rank] = agree_on_loss(agreement, survivors, claims[rank], [])
        except fmesh.RecoveryError as error:
            outcomes[rank] = str(error)

    in_threads(recover, [0, 1, 2], timeout=60)
    assert all(isinstance(outcome, str) for outcome in outcomes.values()), outcomes
    for rank in (0, 1):
        assert f"rank {rank} says [2, 3], rank 2 says [3]" in outcomes[rank], outcomes[rank]


def recovers_without_the_other_half(ctx: Context) -> Any:
    """Every rank, nobody dead, recovers without the other half; what it gets (an error, or the sum over its new
    world: 0 and 1 alone would make 3.0, 2 and 3 alone 7.0, crossed worlds 5.0)."""
    world = fmesh.make_mesh((4,), ("all",))
    ctx.all_reduce(torch.ones(1), world, "all")
    started = time.monotonic()
    try:
        renewed = ctx.recover(HALVES[ctx.rank])
    except fmesh.RecoveryError as error:
        return "RecoveryError", str(error), time.monotonic() - started
    assert renewed is not None
    with renewed:
        pair = fmesh.make_mesh((2,), ("all",))
        return "recovered", renewed.all_reduce(torch.tensor([ctx.rank + 1.0]), pair, "all").item()


@pytest.mark.slow
@pytest.mark.parametrize("run", range(20))
def test_split_brain_recovery_ends_in_recovery_error_on_every_rank(run: int) -> None:
    results = launch(recovers_without_the_other_half, 4, timeout=60)
    for rank, result in enumerate(results):
        assert not isinstance(result, BaseException), (rank, result)
        assert result[0] == "RecoveryError", (rank, result)
        # at once where both halves come together (milliseconds measured); a half that comes later waits out the
        # 2 s grace the other gives it (ALIVE_GRACE_SECONDS); never the creation timeout
        assert result[2] < ALIVE_GRACE_SECONDS + within(3), (rank, result)


@pytest.mark.parametrize("inside_set_up", [True, False])
def test_a_survivor_inside_torchs_set_up_at_the_creation_timeout_is_waited_for(inside_set_up: bool) -> None:
    """Campaign seed 735 (5 ranks, under load): rank 3 was inside gloo's set-up of the group of all five when rank 0
    died there; gloo held it five connect timeouts (75 s: ``set_up.set_up_bound``) as rank 0's
    connections closed, so rank 3 came to the survivors' vote after the creation timeout, and every survivor raised
    RecoveryError.
    The vote now waits, past the creation timeout, for a survivor alive inside torch's set-up; one that is busy
    elsewhere is still named at the timeout."""
    store, creation = tcp_store(), 1.0
    late = Board(store, "set-up", 1, timedelta(seconds=creation))
    set_up = patience(60)  # how long torch's set-up of a group may take (Board.set_up_seconds)
    late.post("waiting", at="k", what="dp (0, 1, 2)")
    if inside_set_up:  # the members agreed: rank 1 went on into torch's set-up of the group
        store.set(late.keys.agreement("k").verdict, "ok")
    Board(store, "set-up", 0, timedelta(seconds=creation)).post("running")
    outcomes: dict[int, Any] = {}
    first_done = threading.Event()

    def recover(rank: int) -> None:
        if rank == 1:  # comes past rank 0's creation timeout (after rank 0's outcome, where it has one)
            first_done.wait(patience(60) if not inside_set_up else 3 * creation)
        agreement = Board(store.clone(), "set-up", rank, timedelta(seconds=creation),  # type: ignore[attr-defined]
                          set_up_seconds=set_up)
        try:
            outcomes[rank] = agree_on_loss(agreement, [0, 1], [2], [])
        except fmesh.RecoveryError as error:
            outcomes[rank] = error
        finally:
            agreement.waiter.release()  # its connection for blocking waits, as a recovery's try ends it
        if rank == 0:
            first_done.set()

    in_threads(recover, [0, 1], timeout=120)
    if inside_set_up:
        assert outcomes == {0: {}, 1: {}}, outcomes  # both recovered
    else:
        assert isinstance(outcomes[0], fmesh.RecoveryError), outcomes
        assert "survivors [1] did not come to recover without [2] within 1s (rank 1 waits to create dp (0, 1, 2))" in \
            str(outcomes[0]), outcomes
