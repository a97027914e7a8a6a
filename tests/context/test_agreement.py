"""The agreement protocol on an in-process store, members as threads: what it costs each member, and what
it reports when members disagree, wait in a cycle, fail or never come."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from support import CountingStore, in_threads, patience

import fmesh
from fmesh.context.store.agreement import agree, arrive
from fmesh.context.store.board import Board, mark_ended
from fmesh.context.store.diagnosis import diagnose
from fmesh.context.store.records import MISSING, RUNNING, Status
from fmesh.context.store.roll_call import roll_call


def members_agree(store: Any, members: Sequence[int], key: Callable[[int], str], description: Callable[[int], str],
                  *, grace: float = 0.2, creation: float = 20, who: Sequence[int] | None = None) -> dict[int, Any]:
    """Each of ``who`` (default: ``members``) agrees in a thread; rank -> None or the exception raised."""
    outcome: dict[int, Any] = {}

    def member(rank: int) -> None:
        agreement = Board(store, "test", rank, timedelta(seconds=creation), grace=grace)
        agreement.post("running")
        try:
            agree(agreement, key(rank), members, description(rank), f"group {key(rank)}")
            outcome[rank] = None
        except Exception as error:
            outcome[rank] = error

    in_threads(member, list(members if who is None else who))
    return outcome


def test_each_member_touches_a_constant_number_of_keys_and_bytes() -> None:
    costs = {}
    for size in (2, 16, 128, 512):
        store = CountingStore()
        outcome = members_agree(store, range(size), lambda r: "group", lambda r: "Mesh(dp=N) axes dp " * 8,
                                grace=60)  # no slow path: the cost of agreeing, not of diagnosing
        assert set(outcome.values()) == {None}
        costs[size] = (max(len(k) for k in store.keys.values()), max(store.bytes.values()))
    keys, moved = costs[2]
    assert all(k == keys for k, _ in costs.values()), costs  # the same keys whatever the group size
    assert keys <= 8 and all(b <= 2 * moved for _, b in costs.values()), costs


def test_a_member_that_means_another_group_is_a_mismatch_on_every_member() -> None:
    outcome = members_agree(CountingStore(), range(4), lambda r: "g", lambda r: "Mesh(b)" if r == 2 else "Mesh(a)")
    for rank, error in outcome.items():
        assert isinstance(error, fmesh.MeshMismatchError), (rank, error)
        assert f"on rank {rank}" in str(error) and "Mesh(a)" in str(error) and "Mesh(b)" in str(error)


def test_ranks_waiting_for_each_other_in_a_cycle_are_told_in_seconds() -> None:
    # Rank 0 waits with rank 1 under one group's key, rank 1 with rank 0 under another's (permuted maps).
    outcome = members_agree(CountingStore(), [0, 1], lambda r: f"order{r}", lambda r: f"Mesh(order {r})")
    for error in outcome.values():
        assert isinstance(error, fmesh.MeshMismatchError), error
        assert "in a cycle" in str(error) and "Mesh(order 0)" in str(error) and "Mesh(order 1)" in str(error)


def test_a_member_that_never_comes_times_out_naming_it_and_what_it_does() -> None:
    store = CountingStore()
    Board(store, "test", 1, timedelta(seconds=60)).post("running")  # alive, doing something else
    outcome = members_agree(store, [0, 1], lambda r: "g", lambda r: "Mesh(x)", creation=1.5, who=[0])
    error = outcome[0]
    assert isinstance(error, fmesh.GroupTimeoutError), error
    assert "ranks [1] never came" in str(error) and "rank 1 is not creating a group" in str(error)


def test_a_member_that_failed_is_reported_with_its_error() -> None:
    store = CountingStore()
    Board(store, "test", 1, timedelta(seconds=60)).failed(ValueError("no data on rank 1"))
    outcome = members_agree(store, [0, 1], lambda r: "g", lambda r: "Mesh(x)", who=[0])
    error = outcome[0]
    assert isinstance(error, fmesh.RankLostError), error
    assert "ValueError: no data on rank 1" in str(error)


def test_a_failed_mismatch_stays_a_mismatch() -> None:
    store = CountingStore()
    Board(store, "test", 1, timedelta(seconds=60)).failed(fmesh.MeshMismatchError("rank 1 saw Mesh(z)"))
    outcome = members_agree(store, [0, 1], lambda r: "g", lambda r: "Mesh(x)", who=[0])
    assert isinstance(outcome[0], fmesh.MeshMismatchError) and "Mesh(z)" in str(outcome[0])


def test_the_roll_call_names_who_does_not_answer() -> None:
    store = dist.HashStore()
    answers: dict[int, list[int]] = {}

    def survivor(rank: int) -> None:
        answers[rank] = roll_call(Board(store, "test", rank, timedelta(seconds=60)), "ar", [0, 1, 2], 1.0)

    threads = [threading.Thread(target=survivor, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=patience(30))
    assert answers == {0: [2], 1: [2]}


def test_statuses_of_ranks_that_never_posted_one() -> None:
    store = dist.HashStore()
    agreement = Board(store, "test", 0, timedelta(seconds=60))
    agreement.post("running")
    assert agreement.statuses([0, 1]) == {0: Status(RUNNING), 1: Status(MISSING)}


def test_a_board_whose_ranks_all_came_to_the_start_posts_nothing_as_it_opens_and_reads_them_running() -> None:
    # The start's meeting proved that every rank came (issue 37: a store operation per rank less): a rank that posted
    # no status since is running, not missing; one that posted is read as it posted.
    store = dist.HashStore()
    board = Board(store, "test", 0, timedelta(seconds=60), present=True).open()
    try:
        assert not store.check([board.keys.status(0)])
        Board(store, "test", 1, timedelta(seconds=60), present=True).post("closed", aborted=True)
        statuses = board.statuses([0, 1, 2])
        assert statuses[0] == statuses[2] == Status(RUNNING) and statuses[1].state == "closed", statuses
    finally:
        board.leave(aborted=False)


def test_a_close_after_an_abort_still_tells_the_abort() -> None:
    # abort() on a watchdog thread halts the context; close() on the main thread may post after it.

    store = dist.HashStore()
    aborting = Board(store, "test", 0, timedelta(seconds=5))
    aborting.close_quietly(aborted=False)
    assert aborting.statuses([0])[0].describe(0) == "rank 0 closed its context"
    aborting.connections.halted.set()
    aborting.close_quietly(aborted=False)
    assert aborting.statuses([0])[0].describe(0) == "rank 0 aborted its context"


def test_a_member_that_exited_without_closing_is_named_with_what_ended_it(monkeypatch: Any) -> None:
    store = CountingStore()
    monkeypatch.setattr("sys.last_value", KeyError("lost batch"), raising=False)  # as after an uncaught exception
    Board(store, "test", 1, timedelta(seconds=60)).post_exit()
    outcome = members_agree(store, [0, 1], lambda r: "g", lambda r: "Mesh(x)", who=[0])
    assert isinstance(outcome[0], fmesh.RankLostError), outcome
    assert "rank 1 exited without closing its Context after an uncaught KeyError: 'lost batch'" in str(outcome[0])


EXIT_RUN = """
import sys, torch.distributed as dist, fmesh
store = dist.FileStore(sys.argv[1], 100)  # more users than it will have: the file outlives the process
closed = fmesh.Context(backend="gloo", rank=0, world_size=1, store=store, name="closed")
left = fmesh.Context(backend="gloo", rank=0, world_size=1, name="left")  # joins the default group
closed.close()
"""


@pytest.mark.slow
def test_an_exit_hook_posts_exited_for_an_open_context_only(tmp_path: Any) -> None:
    script = tmp_path / "exit.py"
    script.write_text(EXIT_RUN)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    store = dist.PrefixStore("0/", dist.FileStore(str(tmp_path / "store"), 100))  # the default group's prefix
    states = {name: Board(store, f"fmesh/{name}/0", 0, timedelta(seconds=5)).statuses([0])[0].state
              for name in ("closed", "left")}
    assert states == {"closed": "closed", "left": "exited"}


def test_a_forked_child_that_exits_posts_nothing_for_its_parents_rank(monkeypatch: Any) -> None:
    store = dist.HashStore()
    agreement = Board(store, "test", 1, timedelta(seconds=60))
    agreement.post("running")
    monkeypatch.setattr("os.getpid", lambda: agreement.pid + 1)  # the hook runs in a child the rank forked
    agreement.post_exit()
    assert agreement.statuses([1])[1] == Status(RUNNING)


def cycle_readings(done_before: bool) -> dict[str, bool]:
    """Rank 0 waits at group A for rank 1, whose status says it waits at group B for rank 0: a cycle, as a look
    reads it. ``done_before``: A completed before the look (its members moved on; the look is a slow, stale one).
    Which groups got a mismatch verdict from rank 0's look."""
    store = dist.HashStore()
    zero, one = (Board(store, "t", rank, timedelta(seconds=5)) for rank in (0, 1))
    zero.post("waiting", at="A", what="group A")
    one.post("waiting", at="B", what="group B")
    store.set("t/agree/B/members", "[0, 1]")
    if done_before:
        store.set("t/agree/A/done", "ok")
    diagnose(zero, "A", [0, 1], "A")
    return {key: store.check([f"t/agree/{key}/done"]) and store.get(f"t/agree/{key}/done").decode().startswith(
        "mismatch") for key in ("A", "B")}


def test_a_cycle_is_concluded_only_from_a_reading_that_still_holds() -> None:
    assert cycle_readings(done_before=False) == {"A": True, "B": True}  # a real cycle: both groups told
    # A finished before the (slow) look read it: the ranks it saw elsewhere had moved on; no group is blamed
    assert cycle_readings(done_before=True) == {"A": False, "B": False}


def watched_after_the_watcher_ends(end: Callable[[Board, dist.Store], None]) -> dict[int, tuple[Any, float]]:
    """Ranks 0..3 agree: rank 0 arrives first (a watcher), then its process ends (``end``), and rank 3 fails
    elsewhere; ranks 1 and 2 come after. What each of them raised, and after how long."""
    store, creation = dist.HashStore(), 120.0
    launcher = dist.HashStore()
    for rank in range(4):
        Board(store, "w", rank, timedelta(seconds=creation)).post("running")
    first = Board(store, "w", 0, timedelta(seconds=creation))
    assert arrive(first, "g", range(4), "Mesh(x)", "group g")  # the first to arrive watches
    end(first, launcher)
    Board(store, "w", 3, timedelta(seconds=creation)).failed(RuntimeError("out of memory on rank 3"))
    outcome: dict[int, tuple[Any, float]] = {}

    def member(rank: int) -> None:
        started = time.monotonic()
        try:
            agree(Board(store, "w", rank, timedelta(seconds=creation), grace=0.2,
                      launcher_store=launcher), "g", range(4), "Mesh(x)", "group g")
            outcome[rank] = (None, time.monotonic() - started)
        except Exception as error:
            outcome[rank] = (error, time.monotonic() - started)

    in_threads(member, [1, 2], timeout=2 * creation)
    return outcome


@pytest.mark.parametrize("how", ["exited", "killed"])
def test_the_watch_survives_the_death_of_the_first_watcher(how: str) -> None:
    # Before: only the first member to arrive looked; with it gone, the others waited the whole creation timeout
    # (GroupTimeoutError after 2 minutes) although a member had failed.
    def end(watcher: Board, launcher: dist.Store) -> None:
        if how == "exited":
            watcher.post_exit()  # its process ended without closing its context: the exit hook says so
        else:
            mark_ended(launcher, 0, -9)  # killed: its status still says it waits; the launcher saw it end

    outcome = watched_after_the_watcher_ends(end)
    for rank, (error, seconds) in outcome.items():
        assert isinstance(error, fmesh.RankLostError), (rank, error)
        assert seconds < patience(30), (rank, seconds, error)  # within seconds, not at the creation timeout
        named = "rank 0 exited" if how == "exited" else "the launcher saw the process of rank 0 end"
        assert named in str(error) or "rank 3 failed: RuntimeError: out of memory" in str(error), error


def test_statuses_and_ended_ranks_cost_a_few_operations_whatever_the_number_of_ranks() -> None:
    store, launcher = CountingStore(), CountingStore()
    ranks = range(1024)
    for rank in ranks:
        if rank != 700:  # one rank never posted a status
            Board(store.inner, "s", rank, timedelta(seconds=5)).post("running")
        if rank in (5, 900):
            mark_ended(launcher.inner, rank, 1)
    agreement = Board(store, "s", 0, timedelta(seconds=5), launcher_store=launcher)
    statuses = agreement.statuses(ranks)
    assert statuses[700] == Status(MISSING) and statuses[3] == Status(RUNNING)
    assert store.ops <= 2 * 11 + 2, store.ops  # halving: about two checks per level for the one missing rank
    assert agreement.ended(ranks) == [5, 900] and launcher.ops == 1  # one read, not a check per rank


def test_a_member_alive_inside_torchs_set_up_of_another_group_is_waited_for_past_the_creation_timeout() -> None:
    """Campaign seed 152 (8 ranks, under load): rank 3 was inside gloo's set-up of the group [1, 3, 5, 7] when rank
    1 failed; gloo held it five connect timeouts (75 s: ``set_up.set_up_bound``), and rank 2,
    waiting for rank 3 at the group [2, 3], timed out (GroupTimeoutError: no loss, so no recovery). A member alive
    inside torch's set-up of a group is on its way: the agreement waits for it up to ``Board.set_up_seconds`` past the
    creation timeout."""
    store, creation = dist.HashStore(), 1.0
    late = Board(store, "test", 1, timedelta(seconds=creation))
    late.post("waiting", at="other", what="group other")
    store.set(late.keys.agreement("other").verdict, "ok")  # agreed: rank 1 went on into torch's set-up of it
    outcome: dict[int, Any] = {}

    def member(rank: int) -> None:
        if rank == 1:  # its set-up fails past rank 0's creation timeout; then it comes
            time.sleep(3 * creation)
        board = Board(store, "test", rank, timedelta(seconds=creation), grace=0.2, set_up_seconds=patience(60))
        try:
            agree(board, "g", [0, 1], "Mesh(dp=2)", "group g")
            outcome[rank] = None
        except Exception as error:
            outcome[rank] = error

    in_threads(member, [0, 1])
    assert outcome == {0: None, 1: None}, outcome


def test_a_member_gone_to_recover_before_the_creation_timeout_is_a_loss_not_a_timeout() -> None:
    """Campaign seed 152, once gloo's set-up ended in 15 s: rank 3 left its failed set-up and went to recover without
    rank 1 a moment before rank 2's creation timeout at the group [2, 3], between two of its watcher's looks, and rank 2
    raised GroupTimeoutError (no loss, so it did not recover with the others). A timeout looks once more first: a
    member that went to recover is a RankLostError naming the ranks it recovers without."""
    store, creation = dist.HashStore(), 1.0
    recovering = Board(store, "test", 1, timedelta(seconds=creation))
    board = Board(store, "test", 0, timedelta(seconds=creation), grace=patience(60))  # no look before the timeout
    timer = threading.Timer(creation / 2, lambda: recovering.post("recovering", lost=(3,)))
    timer.start()
    try:
        with pytest.raises(fmesh.RankLostError, match=r"ranks \[3\] are lost; call ctx.recover\(\[3\]\)"):
            agree(board, "g", [0, 1], "Mesh(dp=2)", "group g")
    finally:
        timer.join()
