"""The heartbeat (:mod:`fmesh.context.store.pulse`): a watcher calls a member gone when its counter stood still for
the silence's length of the watcher's own clock, never one that beats, one that never beat, nor one already gone;
it posts the silent member's final status on its behalf, which names it."""

from __future__ import annotations

import gc
import os
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from support import patience

import fmesh
from fmesh.context.store import pulse as pulse_module
from fmesh.context.store.agreement import connect_failed
from fmesh.context.store.board import Board
from fmesh.context.store.records import CLOSED, SILENT, Status


def boards(store: dist.Store, ranks: int) -> list[Board]:
    return [Board(store, "hb", rank, timedelta(seconds=5)) for rank in range(ranks)]


def test_a_member_whose_heartbeat_stands_still_is_posted_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pulse_module, "SILENT_SECONDS", 0.3)
    store = dist.HashStore()
    watcher, beating, dead, _never, closed, failed = boards(store, 6)
    watcher.open()
    try:
        for member in (beating, dead, closed, failed):
            store.add(member.keys.beat(member.rank), 1)
        closed.post(CLOSED)
        failed.failed(RuntimeError("caught, and went on"))  # failed, but may be alive: watched like any other
        assert watcher.silent(range(6)) == []  # the first look only notes the counters
        deadline = time.monotonic() + patience(5)
        while time.monotonic() < deadline:
            store.add(beating.keys.beat(1), 1)
            quiet = watcher.silent(range(6))
            if quiet:
                break
            time.sleep(0.05)
        assert quiet == [2, 5], quiet  # not the beating one, the one that never beat, nor the closed one
        statuses = watcher.statuses([2, 4, 5])
        assert statuses[2].state == SILENT and statuses[4].state == CLOSED, statuses
        assert statuses[2].describe(2).startswith("rank 2 is gone: its heartbeat stood still for "), statuses[2]
        assert watcher.finals() >= {2, 4, 5}
        assert watcher.silent(range(6)) == []  # posted once: gone already
    finally:
        watcher.leave(aborted=False)
    assert failed.statuses([5])[5].state == SILENT  # its failure posted, then its silence


def test_a_watcher_that_never_looked_settles_before_it_calls_a_member_silent() -> None:
    store = dist.HashStore()
    watcher, dead = boards(store, 2)
    watcher.open()
    try:
        store.add(dead.keys.beat(1), 1)
        started = time.monotonic()
        assert watcher.silent([1], settle=0.3) == [1]
        assert time.monotonic() - started >= 0.3
    finally:
        watcher.leave(aborted=False)


def test_a_board_that_does_not_beat_watches_nobody() -> None:
    store = dist.HashStore()
    watcher, dead = boards(store, 2)
    store.add(dead.keys.beat(1), 1)
    assert watcher.silent([1], settle=0.2) == []  # not open: no heartbeat of its own, no watch (a unit's board)


def test_the_pulse_beats_until_its_board_leaves() -> None:
    store = dist.HashStore()
    (board,) = boards(store, 1)
    board.open()
    first = int(store.get(board.keys.beat(0)))
    deadline = time.monotonic() + patience(10)
    while int(store.get(board.keys.beat(0))) == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(store.get(board.keys.beat(0))) > first
    (pulse,) = board.pulse
    board.leave(aborted=False)
    assert not board.pulse and not pulse.thread.is_alive()  # its thread ended with the board


def test_a_rank_that_came_to_the_start_and_stood_still_ends_the_meeting_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's watchers read the heartbeats of the ranks that came, by their place of arrival (whose value names
    the rank): rank 2 came first and never beat again, rank 1 never came; rank 0, a watcher, raises ``RankLostError``
    naming rank 2 (not rank 1: a rank that never came may be slow to start, and keeps the timeout)."""
    import fmesh
    from fmesh.context.store import keys, pulse, rendezvous

    monkeypatch.setattr(pulse, "SILENT_SECONDS", 0.3)  # the silence of a beat a second (pulse.silent_seconds)
    store = dist.HashStore()
    held = keys.starting("doc", 0)
    store.add(held.arrivals, 1)  # rank 2 came first
    store.add(keys.arrival_beat(held, 1), 3 + 2)  # its first beat: the world size, and its rank
    beating: list = []
    try:
        with pytest.raises(fmesh.RankLostError, match=r"rank 2 is gone: its heartbeat stood still for \d+s \(the 1st"):
            rendezvous.meet(store, rank=0, world_size=3, timeout=timedelta(seconds=patience(30)),
                            numbered=lambda: held, beating=beating)
    finally:
        for pulse in beating:
            pulse.stop()
    assert int(store.get(keys.arrival_beat(held, 2))) % 3 == 0  # rank 0's own pulse beat its place (the 2nd)


def test_the_pulse_slows_with_the_world_so_the_stores_beat_load_stays_bounded() -> None:
    """A beat a second per rank up to BEATS_PER_SECOND ranks, then less often: the store takes at most that many beats
    a second from all the ranks together, whatever the world size, and the silence that calls a rank gone is as many
    beats' worth as at a beat a second (so a death is named within 30 s up to 4,096 ranks)."""
    from fmesh.context.store import pulse

    for world in (1, 2, 1000, 4096, 4097, 16_384, 131_072, 2**31 - 1):
        every = pulse.pulse_seconds(world)
        assert every >= pulse.PULSE_SECONDS and world / every <= pulse.BEATS_PER_SECOND, (world, every)
        assert pulse.silent_seconds(world) == pulse.SILENT_SECONDS * every / pulse.PULSE_SECONDS, world
    assert pulse.pulse_seconds(4096) == pulse.PULSE_SECONDS and pulse.silent_seconds(4096) == pulse.SILENT_SECONDS
    assert pulse.pulse_seconds(16_384) == 4.0 and pulse.silent_seconds(16_384) == 40.0
    # a board of a world that large beats that often, and waits that long for a member's heartbeat to move
    board = Board(dist.HashStore(), "hb", 0, timedelta(seconds=5), beat_every=pulse.pulse_seconds(16_384)).open()
    try:
        assert board.pulse[0].every == 4.0 and board.silence == 40.0
    finally:
        board.leave(aborted=False)


def beats_seen(ctx: object) -> tuple[int | None, int | None]:
    """The other rank's heartbeat at its board's key, read twice, 2.5 s apart (None: not there)."""
    board = ctx._board  # type: ignore[attr-defined]
    key = board.keys.beat(1 - board.rank)
    seen = []
    for _ in range(2):
        time.sleep(2.5)
        seen.append(int(board.store.get(key)) if board.store.check([key]) else None)
    return seen[0], seen[1]


@pytest.mark.slow
def test_the_starts_heartbeat_beats_on_at_the_boards_key() -> None:
    """The pulse each rank starts as it arrives at the start's meeting goes on as its context's board's: a peer reads it
    moving at the board's key (the pulse's connection is a clone of the board's store, in whatever namespaces torch
    wrapped it: beats sent elsewhere would read as a heartbeat never beaten, and the rank called gone after 10 s)."""
    import fmesh

    for first, second in fmesh.launch(beats_seen, 2, timeout=patience(60, 2)):
        assert first is not None and second is not None and second > first, (first, second)


def test_a_pulse_whose_connection_is_cut_beats_on_on_a_fresh_one() -> None:
    # A living rank whose own beat failed (its connection cut with a failed group's sockets, or a read timed out on a
    # starved machine) stopped beating for good, and its peers called it gone 10 s later: a wrong blame (seen once
    # in the death-to-error test under a load of 40, rank 1 naming the living rank 0).
    from fmesh.context.store.connections import shut, sockets_to
    from fmesh.context.store.pulse import Pulse

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    before = sockets_to("127.0.0.1", server.port)
    pulse = Pulse(server, "beat/0", every=0.05)
    own = sockets_to("127.0.0.1", server.port) - before
    assert own, "the pulse has a connection of its own"
    pulse.start()
    try:
        shut(own)
        cut_at = int(server.get("beat/0"))
        deadline = time.monotonic() + patience(10)
        while time.monotonic() < deadline and int(server.get("beat/0")) < cut_at + 5:
            time.sleep(0.05)
        assert int(server.get("beat/0")) >= cut_at + 5, (cut_at, int(server.get("beat/0")))
        assert pulse.thread.is_alive() and not pulse.unanswered and not pulse.paused
    finally:
        pulse.stop()


def test_a_watcher_that_did_not_run_calls_nobody_silent_until_its_own_pulse_has_woken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A store host resumed after a freeze looked at its peers' heartbeats before its own pulse had woken to say that
    # this process did not run: it named a peer gone (the one whose pulse had ended on the frozen store) instead.
    monkeypatch.setattr(pulse_module, "SILENT_SECONDS", 0.3)
    store = dist.HashStore()
    watcher, still = boards(store, 2)
    watcher.open()
    try:
        pulse = watcher.pulse[0]
        pulse.every = 3600.0  # the thread wakes once more, at its current period's end, then not in this test
        time.sleep(1.5)
        store.add(still.keys.beat(1), 1)
        assert watcher.silent([1]) == []  # the first look notes the counter
        time.sleep(0.5)
        pulse.woke = time.monotonic() - 2 * 3600  # as if this process had been stopped for two periods
        assert watcher.silent([1]) == []
        pulse.woke = time.monotonic()
        assert watcher.silent([1]) == [1]
    finally:
        watcher.leave(aborted=False)


def test_a_pulse_stopped_inside_a_beat_takes_its_process_for_one_that_did_not_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # CI (torch 2.15), and 1 run in 3 beside four busy loops: a store host that stopped itself (SIGSTOP) a second
    # after its context started was stopped inside a beat, its pulse beating a second apart too. Resumed, the beat
    # ended, the sleep after it was on time, and the pulse beat on: the host named a peer gone, not its own pause.
    # A pause: 2 s late (paused_after, with a fast pulse), far above a thread's lag beside busy loops.
    monkeypatch.setattr(pulse_module, "STALL_SECONDS", 2.0)
    stopped_for = 3.5

    class StoppedInsideABeat(pulse_module.Pulse):
        def beat(self) -> None:
            super().beat()
            if int(self.store.get(self.key)) == 3:
                time.sleep(stopped_for)  # as if the process was stopped once its add was sent

    store = dist.HashStore()
    pulse = StoppedInsideABeat(store, "beat/0", every=0.05).start()
    try:
        deadline = time.monotonic() + patience(10)
        while time.monotonic() < deadline and pulse.thread.is_alive():
            time.sleep(0.05)
        assert not pulse.thread.is_alive(), "the pulse beats on after its process did not run"
        assert len(pulse.paused) == 1 and pulse.paused[0] >= stopped_for - 0.05, pulse.paused
        assert int(store.get("beat/0")) == 3  # no beat after the pause: its peers call it gone, as they may have
    finally:
        pulse.stop()


class Crowded:
    """A store where another thread connects just as the pulse makes its first connection."""

    def __init__(self, server: dist.TCPStore) -> None:
        self.server = server
        self.others: list[dist.Store] = []

    def clone(self) -> dist.Store:
        if not self.others:
            self.others.append(self.server.clone())
        return self.server.clone()


def test_the_pulse_bounds_the_reads_of_its_own_connection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pulse bounded the reads of every connection to the store that appeared while it made its own: one another
    # thread made at that moment (a wait's, whose blocking read lasts up to the creation timeout) then failed after
    # 15 s, as if the store's host had stopped answering.
    import socket
    import struct

    from fmesh.context.store import pulse as pulse_module
    from fmesh.context.store.connections import sockets_to
    from fmesh.context.store.pulse import Pulse

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def bounded(fd: int) -> bool:
        with socket.socket(fileno=os.dup(fd)) as duplicate:
            return struct.unpack("ll", duplicate.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)) != (0, 0)

    monkeypatch.setattr(pulse_module, "tcp_address", lambda store: ("127.0.0.1", server.port))
    before = sockets_to("127.0.0.1", server.port)
    pulse = Pulse(Crowded(server), "beat/0")  # type: ignore[arg-type]
    appeared = sockets_to("127.0.0.1", server.port) - before
    assert len(appeared) == 2, appeared  # the other thread's connection, and the pulse's own
    assert sorted(bounded(fd) for fd, _ in appeared) == [False, True], appeared
    pulse.stop()
    # The pulse and its connections are a reference cycle: collected here, not in a process a later test forks
    # without freezing what it inherits (tests/context/test_reliability.py's scenarios), where a TCPStore client
    # collected with no thread of its own there aborts the process.
    del pulse
    gc.collect()


def test_a_pulse_whose_store_is_gone_stops_and_never_beats_on_its_owners_connection() -> None:
    # A pulse that could not make a fresh connection (the store's host gone) took the store for one that cannot be
    # cloned and beat on the connection it was given, which its owner uses from another thread: a TCPStore client
    # serves one thread at a time, and two survivors of a dead store host aborted (SIGABRT) as their contexts ended.
    from datetime import timedelta

    from fmesh.context.store.pulse import Pulse

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=1))
    pulse = Pulse(client, "beat/0", every=0.05).start()
    try:
        deadline = time.monotonic() + patience(10)
        while time.monotonic() < deadline and int(server.get("beat/0")) < 3:
            time.sleep(0.05)
        del server  # the store's host is gone
        deadline = time.monotonic() + patience(30)
        while time.monotonic() < deadline and pulse.thread.is_alive():
            time.sleep(0.1)
        assert not pulse.thread.is_alive(), "the pulse beats on, on its owner's connection"
        assert pulse.target[0] is not client
    finally:
        pulse.stop()


def test_a_rank_that_did_not_run_is_told_so_when_connecting_a_group_fails() -> None:
    # CI: a store host resumed after a freeze found the agreement on its first group decided (its peers had arrived
    # before they gave up on the store), failed to connect it (they had exited), and named a peer gone, not its pause.
    store = dist.HashStore()
    resumed, peer = boards(store, 2)
    resumed.open()
    try:
        # the peer, truly gone since, is posted silent (as this rank's own watch posts it once its pulse has woken)
        store.set(peer.keys.status(peer.rank), Status(SILENT, error="10s").dumps())
        store.append(peer.keys.finals, f"{peer.rank},")
        resumed.pulse[0].paused.append(40.0)
        error = connect_failed(resumed, [0, 1], "group g", dist.DistStoreError("Timeout waiting for key"))
        assert isinstance(error, fmesh.RankLostError), error
        assert "this process did not run for 40s" in str(error), error
    finally:
        resumed.leave(aborted=False)


def test_a_store_lost_as_a_set_up_try_begins_is_named_as_the_agreement_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The heartbeats read before a try that may be made again (GroupMaker.create) meet the store right after the
    # agreement: a store host dead in between raised torch's own DistNetworkError from there.
    import torch

    from fmesh.context import creation
    from fmesh.context.options import GroupSettings
    from fmesh.context.world import World

    class StoreGone(Board):
        def silent(self, ranks: object, settle: float = 0.0) -> list[int]:
            raise dist.DistNetworkError("Connection reset by peer")

    monkeypatch.setattr(creation, "agree", lambda *args: None)  # the members met
    settings = GroupSettings.of(None, 60, backend="gloo")
    maker = creation.GroupMaker(World(0, 2, "gloo", torch.device("cpu"), 2, "hb", 0, False), settings,
                                StoreGone(dist.HashStore(), "hb", 0, timedelta(seconds=5)))
    with pytest.raises(fmesh.RankLostError, match="the store is unreachable while creating dp: its host is gone"):
        maker.create(settings.spec(("dp",), (0, 1)), ("dp",), "dp", "a group of two", held=0)
