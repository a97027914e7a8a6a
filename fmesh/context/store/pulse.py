"""Each rank's heartbeat: a counter in the store that a thread of the rank adds to every :data:`PULSE_SECONDS`, so
that a peer kept waiting for it can tell a rank that is slow from one whose process is gone without a word (killed
by SIGKILL or the out-of-memory killer, crashed in C++, its machine lost) where no launcher marks the dead
(torchrun's or Slurm's ranks; :func:`fmesh.launch` and the Ray actors mark them).

A watcher that waits for a member (an agreement, the recovery's vote, the members' check of their calls, a recovered
world's start) reads the members' counters at each of its looks (two store operations, whatever the number of
members: :meth:`~fmesh.context.store.board.Board.silent`); one that stood still for :data:`SILENT_SECONDS` of the
watcher's own clock is gone, and the watcher posts it so (a final status, ``silent``), which ends every wait for it
with an error naming it. The counter is compared with itself, never with a clock, so hosts whose clocks differ agree.

A rank's pulse runs on a store connection of its own (its waits block on another), from its arrival at the start's
meeting (fmesh's ``env://`` rendezvous, where it beats the key of its place of arrival:
:mod:`fmesh.context.store.arrivals`; its context's board then beats on with it), else from the moment its context's
board opens, until the board leaves. A process frozen (SIGSTOP, a debugger) for :data:`SILENT_SECONDS` is called gone
too: its peers cannot tell it from a dead one, and a frozen rank holds every collective of its groups.

The pulse also watches the store: a beat whose answer does not come within :data:`ANSWER_SECONDS` (its connection's
reads are bounded so) means the store's host stopped answering (frozen by SIGSTOP or a debugger, starved, its
machine unreachable), unless a fresh connection is answered within :data:`PROBE_SECONDS` (then the beat's own
connection failed, or this process was the one stopped: the pulse beats on, on a fresh one, and its next wake, late,
says which). A host that stopped answering the pulse notes (:attr:`Pulse.unanswered`) and ends, as it does where its
own process did not run (:attr:`Pulse.paused`: its thread woke :func:`paused_after` its period or later, its beat
included); the first cuts this process's connections to the store, so that every wait on it ends at
once (the waits raise :class:`~fmesh.StoreUnresponsiveError`,
:meth:`fmesh.context.store.board.Board.store_silence`), and no later operation reads an answer meant for an earlier
one once the host is resumed.

>>> import torch.distributed as dist
>>> store = dist.HashStore(); pulse = Pulse(store, "beat/0").start()
>>> int(store.get("beat/0")) >= 1
True
>>> pulse.stop()
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch.distributed as dist

from fmesh.context.store.connections import bound_replies, shut, sockets_to

# How often a rank's pulse beats: the store's cost (one add a second per rank) against how soon a silence shows.
PULSE_SECONDS = 1.0
# How long a member's heartbeat must stand still, as a watcher sees it, before the watcher calls it gone: far above a
# beat's period, so a rank slowed by load (or stopped for a few seconds) is never called gone; with a watcher's looks
# (at most 8 s apart) a death shows within about SILENT_SECONDS + 8 s of the last beat.
SILENT_SECONDS = 10.0
# How long a caller that has not watched a member before (a connection that failed, with nobody's word why) watches
# its heartbeat before it calls it gone: a whole silence (3 s called a living rank gone on a machine with a load
# average of 15 on 2 cores, whose beats came seconds late).
SETTLE_SECONDS = SILENT_SECONDS
# The most beats a second the store takes from all the ranks' heartbeats together: a rank beats every PULSE_SECONDS up
# to this many ranks, then less often (pulse_seconds), so that the heartbeat's load on the store stays under about 4k
# operations a second (a tenth of the capacity bench/scale.py measures), however large the world; the silence that
# calls a rank gone grows with the period (silent_seconds), and so does the time from a death to its error.
BEATS_PER_SECOND = 4096


def pulse_seconds(world_size: int) -> float:
    """How often each rank of a world of ``world_size`` beats: :data:`PULSE_SECONDS`, or less often past
    :data:`BEATS_PER_SECOND` ranks, so that the store takes at most that many beats a second from them all.

    >>> pulse_seconds(8), pulse_seconds(4096), pulse_seconds(16384), pulse_seconds(131072)
    (1.0, 1.0, 4.0, 32.0)
    """
    return max(PULSE_SECONDS, world_size / BEATS_PER_SECOND)


def silent_seconds(world_size: int) -> float:
    """How long a watcher waits for a member's heartbeat to move, in a world of ``world_size``, before it calls the
    member gone: :data:`SILENT_SECONDS` for a beat every second, as many beats' worth for a slower pulse.

    >>> silent_seconds(1024), silent_seconds(16384)
    (10.0, 40.0)
    """
    return silence_of(pulse_seconds(world_size))


def silence_of(every: float) -> float:
    """How long the heartbeat of a pulse beating every ``every`` seconds stands still before a watcher calls its rank
    gone: :data:`SILENT_SECONDS` for a beat a second, as many beats' worth for a slower pulse.

    >>> silence_of(1.0), silence_of(4.0)
    (10.0, 40.0)
    """
    return SILENT_SECONDS * every / PULSE_SECONDS


def paused_after(every: float) -> float:
    """How late a pulse beating every ``every`` seconds may beat before it takes its process for one that did not run
    (:attr:`Pulse.paused`): late enough that its heartbeat stood still for a silence (:func:`silence_of`), so that a
    watching peer may have called it gone; never under :data:`STALL_SECONDS` (a busy machine's lag, not a pause).

    >>> paused_after(1.0), paused_after(4.0), paused_after(0.05)
    (9.0, 36.0, 5.0)
    """
    return max(STALL_SECONDS, silence_of(every) - every)
# How long a beat waits for the store's answer before the pulse asks whether the store's host stopped answering: far
# above any answer of a working store (milliseconds; seconds under the heaviest load measured), and short enough that
# with a beat's period and PROBE_SECONDS a frozen host is named within the death bound (30 s).
ANSWER_SECONDS = 15.0
# How late the pulse's thread may wake before a watcher of this process takes itself for the one that did not run
# (Pulse.stalled): far above a thread's lag on a busy machine, far below a silence.
STALL_SECONDS = 5.0
# How many times the pulse makes its connection again where another thread connected to the store while it did
# (Pulse._connect): two threads of one process rarely connect at the same moment twice in a row.
CONNECT_TRIES = 5
# How long a fresh connection may take to be answered, where a beat was not: answered, this process was stopped (or
# starved), not the store's host.
PROBE_SECONDS = 3.0


def tcp_address(store: dist.Store) -> tuple[str, int] | None:
    """The host and port of a TCP store (under any prefixes), or None.

    >>> tcp_address(dist.HashStore()) is None
    True
    """
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return (str(store.host), int(store.port)) if isinstance(store, dist.TCPStore) else None


def answers(store: dist.Store, seconds: float = PROBE_SECONDS) -> bool:
    """Whether a fresh connection to ``store`` is answered within ``seconds`` (on a daemon thread: a connection to a
    stopped host never returns, and is left behind).

    >>> answers(dist.HashStore())
    True
    """
    answered = threading.Event()

    def probe() -> None:
        with contextlib.suppress(Exception):
            try:
                fresh = store.clone()
            except (NotImplementedError, AttributeError):  # an in-process store: it answers
                fresh = store
            fresh.check(["fmesh/probe"])
            answered.set()

    threading.Thread(target=probe, name="fmesh-store-probe", daemon=True).start()
    return answered.wait(seconds)


class Pulse:
    """The heartbeat of one rank: :meth:`start` beats once (the key exists once it returns; not where ``first`` is
    False), then a daemon thread beats every ``every`` seconds on a clone of ``store`` until :meth:`stop`.

    Each beat adds ``step`` to the counter at ``key``, the first ``step + label``: a counter of a start's meeting,
    keyed by the place of arrival, says whose it is (``label``, the rank, is its value modulo ``step``, the world
    size: :mod:`fmesh.context.store.arrivals`). :meth:`retarget` moves the beats to another key (the start's pulse
    goes on as its context's)."""

    def __init__(self, store: dist.Store, key: str, every: float = PULSE_SECONDS, label: int = 0,
                 step: int = 1) -> None:
        self.every = every
        self.stopped = threading.Event()
        self.origin, self.address = store, tcp_address(store)
        own = self._connect(store)
        # How long a beat went unanswered where the store's host stopped answering (then this process's connections to
        # it were cut), or this process was stopped (a fresh connection was answered): set once, as the pulse ends.
        self.unanswered: list[float] = []
        self.paused: list[float] = []
        # Where the beats go: the connection, the key, what a beat adds (one tuple: the thread reads it whole).
        self.target: tuple[dist.Store, str, int] = (own, key, step)
        self.label = label
        self.woke = time.monotonic()  # when the pulse's thread last woke to beat (Pulse.stalled)
        self.thread = threading.Thread(target=self._run, name="fmesh-pulse", daemon=True)

    @property
    def store(self) -> dist.Store:
        """The pulse's own connection to the store."""
        return self.target[0]

    @property
    def key(self) -> str:
        return self.target[1]

    def start(self, first: bool = True, soon: bool = False) -> Pulse:
        """Start beating: ``first``, once before returning (the key exists then); ``soon``, at once on the pulse's
        thread (the caller does not wait for it: a start's meeting, whose watchers read a key not beaten yet as 0)."""
        if first:  # without it, peers read no key as a heartbeat of 0 where they know this rank came (Board.present)
            self.beat()
        self.thread = threading.Thread(target=self._run, args=(soon and not first,), name="fmesh-pulse", daemon=True)
        self.woke = time.monotonic()  # the thread's lateness counts from its start
        self.thread.start()
        return self

    def _connect(self, store: dist.Store) -> dist.Store:
        """A connection of the pulse's own to ``store`` (its reads bounded by :data:`ANSWER_SECONDS`: a beat
        unanswered fails), or ``store`` itself where it cannot be cloned (an in-process store). Its socket is the
        one that appeared while it was made; where another thread connected to the store meanwhile (two appeared),
        it is made again, so that no other connection's reads are bounded: a wait's blocking read outlasts them."""
        for _ in range(CONNECT_TRIES):
            before = sockets_to(*self.address) if self.address is not None else frozenset()
            try:
                own = store.clone()
            except dist.DistError:  # the store is gone: never the caller's own connection, used from another thread
                raise
            except (RuntimeError, NotImplementedError, AttributeError):  # a store without clone (in-process): shared
                return store
            if self.address is None:
                return own
            appeared = sockets_to(*self.address) - before
            if len(appeared) == 1:
                bound_replies(appeared, ANSWER_SECONDS)
                return own
            del own  # closes its socket
        return store.clone()  # unbounded: its beats wait as long as the store's host does

    def retarget(self, store: dist.Store, key: str, step: int = 1) -> None:
        """Beat ``key`` of ``store`` from the next beat on, ``step`` a beat, on a connection of its own to it (a
        clone: the same namespaces, whatever torch wrapped the store in), which replaces the pulse's."""
        self.origin, self.address = store, tcp_address(store)
        self.target, self.label = (self._connect(store), key, step), 0

    def beat(self) -> None:
        """One beat (what the thread does every ``every`` seconds)."""
        store, key, step = self.target
        store.add(key, step + self.label)
        self.label = 0

    def _run(self, now: bool = False) -> None:
        while True:
            if not now and self.stopped.wait(self.every):
                return
            woke = time.monotonic()
            # Late since the thread last woke, its beat included: a process stopped (SIGSTOP, a debugger) inside a
            # beat finishes it once resumed, and only the next wake shows the stop (its sleep alone was on time).
            late = woke - self.woke - (0.0 if now else self.every)
            now = False
            if late >= paused_after(self.every):  # this process did not run: its peers may have called it gone
                self.paused.append(late)  # before it counts as awake (stalled): a look between reads neither
                return
            self.woke = woke
            began = time.monotonic()
            try:
                self.beat()
            except Exception:
                if self.stopped.is_set() or not self._beats_on(time.monotonic() - began):
                    return

    def _beats_on(self, waited: float) -> bool:
        """After a beat that failed having waited ``waited`` seconds: whether the pulse beats on, on a fresh
        connection (the failed one may read a late answer as the next one's). It does unless the store's host stopped
        answering (a beat unanswered, and a fresh connection too: then every connection of this process to it is cut)
        or the store is gone (no fresh connection): a living rank whose beats stopped for a connection of its own
        (cut, or slow to answer on a starved machine) would be called gone by its peers."""
        if self.address is not None and waited >= ANSWER_SECONDS * 0.9 and not answers(self.origin):
            self.unanswered.append(time.monotonic() - waited)  # when the beat that went unanswered was sent
            shut(sockets_to(*self.address))
            return False
        try:
            self.target = (self._connect(self.origin), *self.target[1:])
        except Exception:  # the store is gone: the peers' own errors name its host
            return False
        return True

    def stalled(self) -> bool:
        """Whether the pulse's thread, still beating, has not woken for a period and :data:`STALL_SECONDS`: this
        process did not run meanwhile (stopped, or starved), so its clock saw silences it may have caused itself.

        >>> Pulse(dist.HashStore(), "beat/0").stalled()
        False
        """
        return (self.thread.is_alive() and not self.stopped.is_set()
                and time.monotonic() - self.woke > self.every + STALL_SECONDS)

    def stop(self) -> None:
        """End the beats (the thread ends at once, unless it is inside a store operation: then within ``every``)."""
        self.stopped.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            with contextlib.suppress(RuntimeError):
                self.thread.join(timeout=self.every)
