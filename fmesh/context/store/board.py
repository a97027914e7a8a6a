"""The status board: each rank of a Context posts what it is doing (a :class:`~fmesh.context.store.records.Status`)
under its key, so that a peer kept waiting for it can tell why it does not come, and the launcher marks the ranks
whose processes it saw end. Every protocol of :mod:`fmesh.context.store` reads the board to explain a slow meeting.

A status is posted when a rank starts (``running``; not where the start's meeting proved that every rank came:
:attr:`Board.present`), waits at an agreement (``waiting``), sees a collective fail
(``failing``), fails, recovers, closes or aborts its context, or its process exits without closing it. A rank whose
status is final (failed, closed, exited) also joins one list (:meth:`Board.finals`), so that a watcher's look costs
the same whatever the number of members it waits for.

>>> board = Board(dist.HashStore(), "doc", 0, timedelta(seconds=1))
>>> board.post("running"); {rank: status.state for rank, status in board.statuses([0, 1]).items()}
{0: 'running', 1: 'missing'}
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
import torch.distributed as dist

from fmesh.context.store.connections import Connections
from fmesh.context.store.keys import ENDED_LIST, Keys
from fmesh.context.store.keys import ended as ended_key
from fmesh.context.store.meeting import Meeting
from fmesh.context.store.pulse import ANSWER_SECONDS, PULSE_SECONDS, Pulse, silence_of, tcp_address
from fmesh.context.store.records import (
    CLOSED,
    EXITED,
    FAILED,
    GONE_STATES,
    LOST,
    MISSING,
    RUNNING,
    SETTING_UP,
    SILENT,
    WAITING,
    Status,
    Verdict,
    options_differ,
    ranks_of,
)
from fmesh.context.store.wait import ABORT_NOTICE_SECONDS, FIRST_LOOK_SECONDS, Waiter
from fmesh.errors import RankLostError, StoreUnresponsiveError

EXIT_POST_TIMEOUT = timedelta(seconds=5)  # the longest a process's exit waits to post that it exited
AGREED_POSTED = 4  # how many of the groups a rank agreed on last it posts when it closes


def store_address(store: dist.Store) -> str:
    """``the store at HOST:PORT; `` for a TCP store (under any prefixes), else nothing.

    >>> store_address(dist.HashStore())
    ''
    """
    address = tcp_address(store)
    return f"the store at {address[0]}:{address[1]}; " if address is not None else ""


def read_list(store: dist.Store, key: str) -> set[int]:
    """The ranks of the list at ``key`` (empty where nobody appended yet), in ONE store operation: a
    ``compare_set`` from nothing to nothing hands back what is there, and creates the empty list otherwise.

    >>> store = dist.HashStore()
    >>> read_list(store, "l"), store.append("l", "4,"), read_list(store, "l")
    (set(), None, {4})
    """
    return ranks_of(store.compare_set(key, "", ""))


def absent(store: dist.Store, ranks: Sequence[int], key_of: Callable[[int], str]) -> list[int]:
    """Those of ``ranks`` whose key (``key_of(rank)``) is not set, found by halving the ranks checked: one
    ``check`` where every key is set, a few per rank whose key is not.

    >>> store = dist.HashStore(); store.set("k/1", "x")
    >>> absent(store, [0, 1, 2], lambda rank: f"k/{rank}")
    [0, 2]
    """
    found: list[int] = []
    pending = [list(ranks)] if ranks else []
    while pending:
        part = pending.pop()
        if store.check([key_of(rank) for rank in part]):
            continue
        if len(part) == 1:
            found += part
        else:
            pending += [part[:len(part) // 2], part[len(part) // 2:]]
    return sorted(found)


def mark_ended(store: dist.Store, rank: int, exitcode: object) -> None:
    """Say, in the launcher's ``store``, that ``rank``'s process ended (:func:`~fmesh.context.store.keys.ended`,
    and the list of them all that a watcher reads in one operation).

    >>> store = dist.HashStore(); mark_ended(store, 3, -9)
    >>> store.get(ended_key(3)), read_list(store, ENDED_LIST)
    (b'-9', {3})
    """
    store.set(ended_key(rank), str(exitcode))
    store.append(ENDED_LIST, f"{rank},")


@attrs.frozen
class Board:
    """One Context's place in the store: this rank's status, its reads of the others', and its blocking waits.

    ``prefix`` is the context's namespace (its name and epoch); ``creation_timeout`` bounds how long a member
    waits for the others to come to a group.
    """

    store: dist.Store
    prefix: str
    rank: int
    creation_timeout: timedelta
    grace: float = FIRST_LOOK_SECONDS  # how long a waiter waits before it looks at what the missing ones do
    # The launcher's store, where it says which ranks' processes ended (keys.ended); None where its ranks are not
    # this world's (a recovered world numbers them anew).
    launcher_store: dist.Store | None = attrs.field(default=None, eq=False, repr=False)
    # The Context's groups' sockets, and whether it was aborted (then every wait ends at its next poll).
    connections: Connections = attrs.field(factory=Connections, eq=False, repr=False)
    # The process this rank is: a child it forks inherits the exit hook, and its exit is not this rank's.
    pid: int = attrs.field(factory=os.getpid, eq=False, repr=False)
    # The last groups this rank agreed on (their descriptions), posted when it closes: a peer that waits for it
    # in a group it never came to can tell that the ranks made different groups.
    agreed: list[str] = attrs.field(factory=list, eq=False, repr=False)
    attempt: int = 0  # which of the context's recoveries its recovery keys are (Keys.attempt)
    # Every rank of the context is known to have come (the start's meeting proved it): a rank that posted no status
    # runs, so none posts that it does as it starts (a store operation per rank).
    present: bool = False
    # This rank's heartbeat (started when the board opens, or handed over beating its key already: the start's;
    # stopped when it leaves), shared by a recovery's ballots.
    pulse: list[Pulse] = attrs.field(factory=list, eq=False, repr=False)
    # How often this rank's heartbeat beats (fmesh.context.store.pulse.pulse_seconds of the world's size): the
    # others' too, so a silence is that many beats' worth (silence).
    beat_every: float = PULSE_SECONDS
    # How long torch's set-up of a group may hold a member after a loss, in all its tries
    # (fmesh.context.set_up.tries_bound): a wait for a member alive inside one goes on that much past the creation
    # timeout (setting_up).
    set_up_seconds: float = 0.0
    # The others' heartbeats as this rank last saw them: rank -> (counter, when it first read that value).
    beats: dict[int, tuple[int, float]] = attrs.field(factory=dict, eq=False, repr=False)
    keys: Keys = attrs.field(init=False, eq=False, repr=False)
    waiter: Waiter = attrs.field(init=False, eq=False, repr=False)

    @keys.default
    def _keys(self) -> Keys:
        return Keys(self.prefix, self.attempt)

    @waiter.default
    def _waiter(self) -> Waiter:
        return Waiter(self.store, self.rank, self.connections.halted, self.grace, unanswered=self.store_silence)

    # ------------------------------------------------------------ this rank's status

    def post(self, state: str, **fields: Any) -> None:
        """Post this rank's status (a :class:`~fmesh.context.store.records.Status` in ``state`` with ``fields``); a
        final one also joins the list of ranks whose status is final (:meth:`finals`)."""
        status = Status(state, **fields)
        self.store.set(self.keys.status(self.rank), status.dumps())
        if status.final:
            self.store.append(self.keys.finals, f"{self.rank},")

    def post_quietly(self, state: str, **fields: Any) -> None:
        """:meth:`post`, on a way out: a store that is gone (its host died) is no reason to raise."""
        # The store may be what failed; the error that brought us here matters more.
        with contextlib.suppress(Exception):
            self.post(state, **fields)

    def failed(self, error: BaseException, refused: bool = False) -> None:
        """Post that this rank failed with ``error`` (others waiting for it report it); ``refused``: it refused a
        collective on itself, before sending any of it (the caller's tensor or arguments). Never raises."""
        self.post_quietly(FAILED, error=f"{type(error).__name__}: {error}"[:2000], kind=type(error).__name__,
                          refused=refused)

    def open(self) -> Board:
        """Post that this rank runs (where its ranks are not :attr:`present`), and have a process that ends without
        closing its context tell its peers so at interpreter exit (:meth:`post_exit`), instead of leaving them to wait
        for it."""
        if not self.present:
            self.post(RUNNING)
        atexit.register(self.post_exit)
        # Where every rank is known to have come, a heartbeat not yet beaten reads as 0 (Board.silent): no first beat.
        if not self.pulse:
            self.pulse.append(Pulse(self.store, self.keys.beat(self.rank), self.beat_every).start(
                first=not self.present))
        elif not self.present:  # a pulse handed over (the start's, beating this board's key): its key exists now
            self.store.add(self.keys.beat(self.rank), 1)
        return self

    def agree_options(self, mine: Mapping[str, str]) -> None:
        """Agree this context's wire-relevant options (:func:`~fmesh.context.options.wire_options`) with its other
        ranks: the first rank to start fixes them (one ``compare_set``); a rank that means others raises ``ValueError``
        naming each field that differs (its caller then ends the context with that error, so the ranks waiting for it
        raise ``RankLostError`` with it at their first look). Without it, ``check_tensors`` on one rank and not on
        another matched one rank's check with the other's data inside gloo, which killed a rank with SIGABRT.

        >>> store = dist.HashStore()
        >>> Board(store, "doc", 0, timedelta(seconds=1)).agree_options({"check_tensors": "True"})
        >>> Board(store, "doc", 1, timedelta(seconds=1)).agree_options({"check_tensors": "False"})
        Traceback (most recent call last):
        ...
        ValueError: on rank 1: this rank's Context options differ from rank 0's, which started first: check_tensors: ...
        """
        posted = json.dumps({"rank": self.rank, "options": dict(mine)})
        first = json.loads(self.store.compare_set(self.keys.options, "", posted))
        differ = options_differ(mine, first["options"])
        if differ:
            raise ValueError(
                f"on rank {self.rank}: this rank's Context options differ from rank {first['rank']}'s, which started "
                f"first: {'; '.join(differ)}. Expected every rank to create its Context with the same options (they "
                "decide which groups a collective runs on and what goes over the wire); pass the same to every rank")

    def leave(self, aborted: bool, error: BaseException | None = None) -> None:
        """The end of this rank's context: the exit hook withdrawn (it also held this board and its store
        connection), and the peers that wait for this rank told why it will not come."""
        atexit.unregister(self.post_exit)
        if error is not None:
            self.failed(error)
        else:
            self.close_quietly(aborted=aborted)
        while self.pulse:
            self.pulse.pop().stop()
        self.waiter.release()  # its second store connection goes with the last wait on it (one per ended context)

    def close_quietly(self, aborted: bool) -> None:
        """Post that this rank closed (or aborted) its context, keeping the error it failed with, if any.

        An abort is never told as a close: ``abort()`` on a watchdog thread and ``close()`` on the main thread
        may both end the context, in either order, and peers should hear the abort.
        """
        with contextlib.suppress(Exception):
            last = self.statuses([self.rank])[self.rank]
            failure = last if last.state == FAILED else Status(CLOSED)
            aborted = aborted or self.connections.halted.is_set()
            if aborted and last.state == WAITING and last.at is not None:
                self.withdraw(last.at)  # before abort() returns, not at the waiting thread's next poll
            self.post(CLOSED, aborted=aborted, error=failure.error, kind=failure.kind, refused=failure.refused,
                      agreed=tuple(self.agreed))

    def withdraw(self, key: str) -> None:
        """Decide the agreement at ``key``, which this rank waits at, lost: it aborted (a verdict already written, the
        group agreed say, stands). Its members are told at once, and none goes on to make the group without it."""
        Meeting(self.store, self.keys.agreement(key), 0).decide(Verdict(
            LOST, f"rank {self.rank} aborted its context while waiting to create this group (a member of it)").dumps())

    def post_exit(self) -> None:
        """Post, at interpreter exit, that this rank's process ended without closing its context (the Context
        registers this with ``atexit`` while it is open), with the uncaught exception that ended it, if any."""
        if os.getpid() != self.pid:
            return
        error = getattr(sys, "last_value", None)  # where the interpreter keeps the exception that ended the program
        with contextlib.suppress(Exception):  # a store that stopped answering must not hold the exit for long
            self.store.set_timeout(EXIT_POST_TIMEOUT)
        self.post_quietly(EXITED, error=f"{type(error).__name__}: {error}"[:2000] if error is not None else None)

    # ------------------------------------------------------------ the others'

    def finals(self) -> set[int]:
        """The ranks whose status is final (failed, closed, exited): one store operation, so that a watcher's look
        costs the same whatever the number of members it waits for."""
        return read_list(self.store, self.keys.finals)

    def statuses(self, ranks: Sequence[int], posted_before: set[int] | None = None) -> dict[int, Status]:
        """The statuses of ``ranks`` (two round trips when all posted one; ranks that never did are ``missing``, or
        ``running`` where the ranks are :attr:`present`, found by halving the ranks checked: a few checks per missing
        rank, then one ``multi_get``).
        ``posted_before``: ranks known to have posted (a status is never taken back), not checked again, and updated
        with those found now: a watcher's later looks read its members' statuses in one round trip."""
        known = posted_before if posted_before is not None else set()
        unknown = [rank for rank in ranks if rank not in known]
        never = set(absent(self.store, unknown, self.keys.status))
        posted = [rank for rank in ranks if rank in known] + [rank for rank in unknown if rank not in never]
        known.update(posted)
        read = (dict(zip(posted, self.store.multi_get([self.keys.status(rank) for rank in posted]), strict=True))
                if posted else {})
        never_posted = Status(RUNNING if self.present else MISSING)
        return {rank: Status.loads(bytes(read[rank])) if rank in read else never_posted for rank in ranks}

    @property
    def silence(self) -> float:
        """How long a member's heartbeat must stand still before this rank calls it gone: :data:`~fmesh.context.
        store.pulse.SILENT_SECONDS` for a beat a second, as many beats' worth for a slower pulse (a large world's).

        >>> Board(dist.HashStore(), "doc", 0, timedelta(seconds=1), beat_every=4.0).silence
        40.0
        """
        return silence_of(self.beat_every)

    def current(self, statuses: dict[int, Status]) -> dict[int, Status]:
        """``statuses`` as they stand now: a rank posts ``running`` once torch has set up the group it agreed on,
        so one still "waiting at K" where K's verdict is written went on past the agreement and is inside torch's
        set-up of the group (:data:`~fmesh.context.store.records.SETTING_UP`). One ``check`` per group named; only
        the slow paths that describe ranks call this.

        >>> store = dist.HashStore(); board = Board(store, "doc", 0, timedelta(seconds=1))
        >>> store.set("doc/agree/k/done", "ok")
        >>> board.current({3: Status("waiting", at="k", what="tp (2, 3)")})[3].describe(3)
        "rank 3 is inside torch's set-up of tp (2, 3), connecting its members (it agreed to create it)"
        """
        waiting_at = {status.at for status in statuses.values() if status.state == WAITING and status.at}
        past = {key for key in waiting_at if self.store.check([self.keys.agreement(key).verdict])}
        return {rank: Status(SETTING_UP, what=status.what or "?")
                if status.state == WAITING and status.at in past else status
                for rank, status in statuses.items()}

    def setting_up(self, statuses: dict[int, Status]) -> list[int]:
        """Those of the ranks whose ``statuses`` were read that are alive inside torch's set-up of a group they agreed
        on (:meth:`current`; a heartbeat not silent): on their way, once the backend's connect has waited out the
        peers that never connect. A few store operations; only a wait past its timeout calls this.

        >>> store = dist.HashStore(); board = Board(store, "doc", 0, timedelta(seconds=1))
        >>> store.set("doc/agree/k/done", "ok"); Board(store, "doc", 3, timedelta(seconds=1)).post("waiting", at="k")
        >>> board.setting_up(board.statuses([3]))
        [3]
        """
        inside = [rank for rank, status in self.current(statuses).items() if status.state == SETTING_UP]
        silent = set(self.silent(inside)) if inside else set()
        return [rank for rank in inside if rank not in silent]

    def silent(self, ranks: Sequence[int], settle: float = 0.0) -> list[int]:
        """Those of ``ranks`` (not this rank, nor one whose status says it is gone already) whose heartbeat this
        rank has seen stand still for :data:`~fmesh.context.store.pulse.SILENT_SECONDS`
        (:mod:`fmesh.context.store.pulse`), each posted ``silent`` on its behalf (a final status: every wait for it
        ends, naming it). Three store operations where every rank has a heartbeat and none failed (a rank that never
        started one is never called silent here, it never came; but where every rank is known to have come,
        :attr:`present`, a heartbeat not beaten yet reads as 0: its rank may have died since).
        A rank is judged on the reads of this rank's earlier calls; ``settle``: where this call reads a rank for
        the first time, read it again after that many seconds (heartbeats of ranks that beat in between are not
        silent) and call silent those that stood still (a caller that did not watch before, on a failure's path).

        Only a board that beats itself (an open one: a Context's) watches the others' heartbeats; any other has
        none to compare (none here).

        >>> store = dist.HashStore(); board = Board(store, "doc", 0, timedelta(seconds=1)).open()
        >>> store.add(board.keys.beat(1), 1); board.silent([0, 1, 2])
        1
        []
        >>> board.leave(aborted=False)
        """
        others = [r for r in ranks if r != self.rank]
        if not others or not self.pulse:
            return []
        if any(pulse.stalled() or pulse.paused for pulse in self.pulse):  # this process did not run: its own pulse
            return []  # says so, or will (a host resumed after a freeze named a peer it had outlived as gone)
        final = self.finals().intersection(others)  # gone already, or failed (alive, maybe: it may catch it)
        if final:
            gone = {r for r, status in self.statuses(sorted(final)).items() if status.state in GONE_STATES}
            others = [r for r in others if r not in gone]
        never = set(absent(self.store, others, self.keys.beat))
        unborn = never if self.present else set()  # came (the start's meeting proved it), not beaten yet: 0
        beating = others if self.present else [r for r in others if r not in never]
        if not beating:
            return []
        quiet, moved = self._still(beating, self.silence, unborn)
        # Those not seen to beat, whose value this rank has not seen stand for ``settle`` yet: watched until it has.
        young = [r for r in beating if r not in quiet and r not in moved
                 and time.monotonic() - self.beats[r][1] < settle]
        if young:
            deadline = max(self.beats[r][1] for r in young) + settle
            while time.monotonic() < deadline:
                self.waiter.check_halted("watching the heartbeats of its peers")
                time.sleep(min(ABORT_NOTICE_SECONDS, max(0.0, deadline - time.monotonic())))
            quiet = sorted({*quiet, *self._still(young, settle, unborn)[0]})
        for rank in quiet:
            stood = time.monotonic() - self.beats[rank][1]
            self.store.set(self.keys.status(rank), Status(SILENT, error=f"{stood:.0f}s").dumps())
            self.store.append(self.keys.finals, f"{rank},")
        return quiet

    def _still(self, ranks: list[int], seconds: float, unborn: set[int]) -> tuple[list[int], set[int]]:
        """Read the heartbeats of ``ranks`` (one ``multi_get``; every key exists but those of ``unborn``, read as 0)
        and note them; those that stood still for ``seconds`` since this rank first read their value, and those seen
        to beat since the last read."""
        now = time.monotonic()
        quiet, moved = [], set()
        born = [r for r in ranks if r not in unborn]
        read = dict(zip(born, self.store.multi_get([self.keys.beat(r) for r in born]) if born else [], strict=True))
        for rank in ranks:
            value = int(bytes(read[rank])) if rank in read else 0
            seen = self.beats.get(rank)
            if seen is None or seen[0] != value:
                self.beats[rank] = (value, now)
                if seen is not None:
                    moved.add(rank)
            elif now - seen[1] >= seconds:
                quiet.append(rank)
        return quiet, moved

    def ended(self, ranks: Sequence[int]) -> list[int]:
        """Those of ``ranks`` whose process the launcher saw end (:func:`mark_ended`): one store operation, however
        many ranks."""
        if self.launcher_store is None or not ranks:
            return []
        marked = read_list(self.launcher_store, ENDED_LIST)
        return [rank for rank in ranks if rank in marked]

    def store_silence(self, doing: str = "waiting on it") -> RankLostError | None:
        """:class:`~fmesh.StoreUnresponsiveError` once this rank's heartbeat saw the store stop answering (its
        connections to it are cut then: :mod:`fmesh.context.store.pulse`), a ``RankLostError`` once it saw this
        process stopped past the bound (its peers called it gone), else None."""
        for pulse in self.pulse:
            if pulse.unanswered:
                host = ("torchrun's agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True) else
                        "rank 0, unless it was made outside the ranks")
                return StoreUnresponsiveError(
                    f"on rank {self.rank}: {store_address(self.store) or 'the store; '}hosted by {host}, stopped "
                    f"answering: no answer to this rank's heartbeat for {time.monotonic() - pulse.unanswered[0]:.0f}s "
                    f"(more than {ANSWER_SECONDS:g}s), nor to a fresh connection, while {doing}. Its host is frozen "
                    "(SIGSTOP, a debugger), starved, or its machine unreachable; this rank's connections to it are "
                    "cut. No group can be made or recovered without it: restart the job (a store hosted outside the "
                    "ranks survives a rank's freeze)")
            if pulse.paused:
                return RankLostError(
                    f"on rank {self.rank}: this process did not run for {pulse.paused[0]:.0f}s (stopped by SIGSTOP or "
                    "a debugger, or starved) while the store answered others: its peers called it gone (a heartbeat "
                    f"silent for {self.silence:g}s) or, where it hosts the store, saw the store stop answering. See "
                    "their errors; recover without this rank, or restart the job")
        return None

    def store_gone(self, doing: str, error: BaseException) -> RankLostError:
        """The error of a rank whose store connection broke (``error``) while ``doing``: its host is gone (or stopped
        answering: :meth:`store_silence`). Names the store's address where it has one."""
        silence = self.store_silence(doing)
        if silence is not None:
            return silence
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return RankLostError(
            f"on rank {self.rank}: the store is unreachable while {doing}: its host is gone (rank 0, unless "
            f"torchrun's agent hosts it; {store_address(self.store)}{type(error).__name__}: {cause}). No group can "
            "be made or recovered without it: see that process's error first, then restart the job (a store hosted "
            "outside the ranks survives any rank's loss)")
