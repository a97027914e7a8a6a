"""The members' check of their calls: every member of a group passes a tensor of the same shape and dtype to the
same collective, in the same order. Checked out of band (through the store, never a collective of its own, never a
read of the device), so that in steady state it costs a few dictionary operations per call.

Each member keeps a :class:`Ledger` per group: how many checked calls it made there, the *window* of its last
:data:`WINDOW` calls (each call a signature: the collective, its arguments, the tensor's shape and dtype), a rolling
hash of all of them, and its recent calls, to name them. Then, per call:

* **A window the members agreed on before is known**: every member made these same :data:`WINDOW` calls at this
  place before, so this call is what the program always does here; it goes at once.
* **A new window is agreed before any byte is sent** (:meth:`CallChecks.meet`): the first calls on a group, a new
  shape, a call added, skipped or reordered. The members meet in the store (a
  :class:`~fmesh.context.store.meeting.Meeting`: two operations and one blocking read each, whatever the group
  size). A difference is a :class:`~fmesh.TensorMismatchError` on every member, naming
  the calls that differ; nothing was sent, and the group stays healthy.
* **A member that took the known path while another meets** is blocked in the collective, waiting for a member that
  will not come. After :data:`BLOCKED_SECONDS` this process's watch (:class:`Watch`, a thread) posts the call it is
  blocked in; the meeting members read it, raise :class:`~fmesh.TensorMismatchError` (nothing of theirs was sent)
  and cut the group, which frees the blocked member with the same error (``collectives.failed``).
* **Every** :data:`CHECKPOINT` **calls** each member hands its hashes to its watch, which compares them with the
  first member's (one ``compare_set``, one ``check``) off the caller's thread: what is left, a divergence between two
  histories both agreed before, is found after the fact, within :data:`CHECKPOINT` calls (and the few the caller
  makes while the watch compares); the group is then cut (a mismatched call ran) and every member raises
  :class:`~fmesh.TensorMismatchError`, this one at its next call.

``Context(check_tensors="every-call")`` (or ``FMESH_CHECK_TENSORS=every-call``) meets at every call: nothing is ever
sent after a mismatch, at the price of one meeting per call (the debugging mode). ``check_tensors=False`` turns the
check off. Inside ``torch.compile`` the check does not run (a compiled graph's calls are not counted). Why this
design, and what each path costs: ``docs/guides/gradients-and-compile.md``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.groups import Route, usable
from fmesh.context.store.board import Board
from fmesh.context.store.meeting import Meeting, watches
from fmesh.context.store.records import GONE_STATES, LOST, MISMATCH, OK, TIMEOUT
from fmesh.context.store.recovery_vote import recovering as recovering_ranks
from fmesh.context.tensors import signature
from fmesh.errors import GroupTimeoutError, RankLostError, TensorMismatchError

CheckMode = Literal["off", "steady", "every-call"]
"""``off``: no check; ``steady`` (the default): new windows met, known ones checked every :data:`CHECKPOINT` calls;
``every-call``: every call met before it is sent."""
CheckArg = bool | Literal["every-call"] | None
"""What ``Context(check_tensors=...)`` takes: True (the default), False, ``"every-call"``, or None (the environment)."""
MODES: dict[object, CheckMode] = {True: "steady", False: "off", "every-call": "every-call"}
ENVIRONMENT = "FMESH_CHECK_TENSORS"  # read when check_tensors is left out: on, off, every-call
_FROM_ENVIRONMENT: dict[str, CheckMode] = {"on": "steady", "1": "steady", "off": "off", "0": "off",
                                           "every-call": "every-call"}
WINDOW = 4  # the calls a window holds: a call added, skipped or reordered makes the next WINDOW windows new
CHECKPOINT = 64  # a member compares its rolling hash every this many calls on a group
BLOCK = 8  # a checkpoint carries the rolling hash after each block of this many calls: a difference is named to a block
KNOWN_LIMIT = 4096  # windows remembered per group; past it they are forgotten together (on every member alike)
BLOCKED_SECONDS = 1.0  # how long a call blocked in a collective waits before its watch posts it
WATCH_SECONDS = 0.25  # how often the watch looks
DESCRIPTIONS_SECONDS = 5.0  # how long a member that saw a difference waits for the others' calls, to name them
LOOK_SECONDS = 1.0  # the longest pause between a watcher's looks
BLOCKED = "blocked"  # a meeting's verdict: a member is blocked in the collective, on the known path

Call = tuple[str, torch.dtype, torch.Size, tuple[object, ...]]
"""One call as a member makes it: the collective's name, the tensor's dtype and shape, the arguments."""


def check_mode(check_tensors: object) -> CheckMode:
    """The mode ``Context(check_tensors=...)`` asks for: True (the default), False or ``"every-call"``; ``None``
    reads ``FMESH_CHECK_TENSORS`` (on, off, every-call), and is True without it.

    >>> check_mode(True), check_mode(False), check_mode("every-call")
    ('steady', 'off', 'every-call')
    >>> check_mode("yes")
    Traceback (most recent call last):
    ...
    TypeError: check_tensors: expected True, False or 'every-call', but got 'yes'
    """
    if check_tensors is None:
        raw = os.environ.get(ENVIRONMENT, "on").strip().lower()
        if raw not in _FROM_ENVIRONMENT:
            raise ValueError(f"{ENVIRONMENT}: expected one of {sorted(_FROM_ENVIRONMENT)}, but got {raw!r}")
        return _FROM_ENVIRONMENT[raw]
    if check_tensors.__class__ not in (bool, str) or check_tensors not in MODES:
        raise TypeError(f"check_tensors: expected True, False or 'every-call', but got {check_tensors!r}")
    return MODES[check_tensors]


def describe_call(call: Call) -> str:
    """What members must agree on about one call, as errors name it.

    >>> describe_call(("all_reduce", torch.float32, torch.Size([2, 3]), ("sum",)))
    "shape (2, 3) dtype torch.float32 in all_reduce('sum')"
    """
    what, dtype, shape, arguments = call
    return f"shape {tuple(shape)} dtype {dtype} in {what}({', '.join(map(repr, arguments))})"


class Ledger:
    """One group's calls on this member: see the module docstring. Every member's ledger of a group changes alike
    while the members agree, which is what lets each decide alone whether a window is known."""

    __slots__ = ("count", "digest", "known", "last", "marks", "meetings", "recent", "rolling")

    def __init__(self, digest: str) -> None:
        self.digest = digest  # the group's name in the store
        self.count = 0  # checked calls made
        self.last: tuple[int, ...] = (0,) * (WINDOW - 1)  # the signatures of the calls before this one
        self.rolling = 0  # a hash of every signature, in order
        self.known: set[tuple[int, ...]] = set()  # windows the members agreed on
        self.meetings = 0  # meetings held (each has keys of its own in the store)
        self.recent: collections.deque[Call] = collections.deque(maxlen=CHECKPOINT)
        self.marks: collections.deque[int] = collections.deque(maxlen=CHECKPOINT // BLOCK)  # rolling, every BLOCK


@attrs.frozen
class Checkpoint:
    """What a member compares at a checkpoint: its hashes after each block of calls (``marks``) up to call ``count``
    of a group, and its calls then (to name them)."""

    route: Route
    board: Board
    ledger: Ledger
    count: int
    marks: str
    calls: tuple[Call, ...]


class CallChecks:
    """The members' check of their calls before each eager collective (``Context(check_tensors=...)``), and its
    state: a :class:`Ledger` per group, the signatures computed so far, and the :class:`Watch`."""

    def __init__(self, mode: CheckMode) -> None:
        self.mode = mode
        # The group of the call in flight, from the check to the collective's return (the Context clears it): the
        # watch reads its count, and takes this rank for blocked in that call after BLOCKED_SECONDS.
        self.entered: Ledger | None = None
        self.checkpoints: collections.deque[Checkpoint] = collections.deque()  # for the watch to compare
        self.found: list[tuple[Checkpoint, TensorMismatchError]] = []  # what the watch found, raised at the next call
        self._ledgers: dict[dist.ProcessGroup, Ledger] = {}
        self._signatures: dict[Call, int] = {}
        self._watch: Watch | None = None

    @classmethod
    def of(cls, check_tensors: object) -> CallChecks:
        """The check as ``Context(check_tensors=...)`` asks for it (:func:`check_mode`).

        >>> CallChecks.of("every-call").mode
        'every-call'
        """
        return cls(check_mode(check_tensors))

    @property
    def enabled(self) -> bool:
        """Whether any check runs."""
        return self.mode != "off"

    def check(self, what: str, route: Route, tensor: torch.Tensor, arguments: tuple[object, ...] = ()) -> None:
        """Before the collective ``what`` of ``tensor`` with ``arguments`` along ``route`` (eager, a real group of
        several members): see the module docstring. Raises :class:`~fmesh.TensorMismatchError` on a difference."""
        if self.mode == "off":
            return
        if self.found:
            self._raise_found()
        board, group = route.board, route.group
        if board is None or group is None or torch.compiler.is_compiling():  # None: a group of one
            return
        ledger = self._ledgers.get(group)
        if ledger is None:
            ledger = self._ledgers[group] = Ledger(route.target.spec.digest())
        call: Call = (what, tensor.dtype, tensor.shape, arguments)
        code = self._signatures.get(call)
        if code is None:
            code = self._signature(call)
        window = (*ledger.last, code)
        if self.mode == "every-call" or window not in ledger.known:
            if not usable(group, board):  # cut by an earlier failure: the collective says so at once
                return
            self.meet(route, board, ledger, window, call)
            if self._watch is None:
                self._watch = Watch(self, board)
        ledger.last = window[1:]
        ledger.rolling = hash((ledger.rolling, code))  # a tuple of ints hashes alike in every process
        ledger.recent.append(call)
        ledger.count = count = ledger.count + 1
        if not count % BLOCK:
            ledger.marks.append(ledger.rolling)
            if not count % CHECKPOINT and self._watch is not None and self.mode == "steady":
                marks = ",".join(f"{mark:x}" for mark in ledger.marks)
                self.checkpoints.append(Checkpoint(route, board, ledger, count, marks, tuple(ledger.recent)))
                self._watch.wake.set()  # compared on the watch's thread: this one goes on
        self.entered = ledger

    def _signature(self, call: Call) -> int:
        if len(self._signatures) >= KNOWN_LIMIT:
            self._signatures.clear()
        code = self._signatures[call] = signature(describe_call(call))
        return code

    def close(self) -> None:
        """Stop the watch (the context ends)."""
        if self._watch is not None:
            self._watch.stop()

    # ------------------------------------------------------------------ meeting

    def meet(self, route: Route, board: Board, ledger: Ledger, window: tuple[int, ...], call: Call) -> None:
        """:meth:`_meet`; a member gone (or the store's host: a broken connection) breaks the group, which is cut as
        a failed collective's is, so that using it again says so at once."""
        try:
            self._meet(route, board, ledger, window, call)
        except dist.DistNetworkError as error:  # the store's host died: one fmesh error on every member, at once
            cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            others = [rank for rank in route.target.ranks if rank != board.rank]
            lost = RankLostError(
                f"on rank {board.rank}: {call[0]} along {route.target.label()} failed while this rank checked its "
                f"calls: ranks {others} of the group cannot be reached: the store they meet in is unreachable, its "
                f"host is gone (rank 0, unless torchrun's agent hosts it; {type(error).__name__}: {cause}). See that "
                "process's error first, then restart the job (a store hosted outside the ranks survives any rank's "
                "loss)")
            self._cut(route, board, lost, refused=False)
            raise lost from None
        except RankLostError as error:
            self._cut(route, board, error, refused=False)
            raise

    def _meet(self, route: Route, board: Board, ledger: Ledger, window: tuple[int, ...], call: Call) -> None:
        """Agree on a new ``window`` with every member before any byte is sent: post it (the first member's stays),
        count the arrival, and read the verdict in one blocking read; the last to arrive writes it. A member whose
        window differs writes ``mismatch``; a member found blocked in the collective by the known path (its watch
        posted it), ``blocked``."""
        target, store, keys = route.target, board.store, board.keys
        ledger.meetings += 1
        meeting = Meeting(store, keys.call_meeting(ledger.digest, ledger.meetings), target.size)
        mine = f"{hash(window):x}"  # a tuple of ints hashes alike in every process
        place = 0  # this member's place in the order of arrival (0: it disagreed, and did not count itself in)
        if meeting.compare(mine) != mine:
            meeting.decide(MISMATCH)
        else:
            place = meeting.arrive()
        blocked = keys.blocked(ledger.digest)

        def look() -> bool:  # a member blocked in the collective, or gone, never comes: say so and stop waiting
            if store.check([blocked]):
                count, _, post = bytes(store.get(blocked)).decode().partition("\n")
                # Blocked in this call or a later one (a call that moves nothing forward, sum_gradients, let it on)
                # while this member has not made this one: it took another path. An earlier call: an old post.
                if int(count) > ledger.count:
                    meeting.decide(f"{BLOCKED}\n{post}")
                    return True
            told = self._gone(board, target.ranks)
            if told:
                meeting.decide(f"{LOST}\n{told}")
            return bool(told)

        seconds = target.spec.timeout.total_seconds()
        # The first members to arrive watch, looking every LOOK_SECONDS at most (the others block in one read): the
        # store's cost of a wait is a constant, whatever the group size and however long the wait.
        came = meeting.wait(board.waiter, seconds, look if place and watches(place) else None,
                            f"checking {call[0]} along {target.label()}", longest=LOOK_SECONDS)
        if came is None:
            came = meeting.decide(f"{TIMEOUT}\n{meeting.arrived()}")
        verdict, _, detail = came.decode().partition("\n")
        if verdict == OK:
            if len(ledger.known) >= KNOWN_LIMIT:
                ledger.known.clear()
            ledger.known.add(window)
            return
        what = f"on rank {board.rank}: {call[0]} along {target.label()}"
        if verdict == MISMATCH:
            raise TensorMismatchError(self._named(board, ledger.meetings, target.ranks, ledger, call, what))
        if verdict == BLOCKED:  # that member's data went; this rank's did not: cut the group to free it
            rank, _, theirs = detail.partition("\n")
            error = TensorMismatchError(
                f"{what}: members made different calls: rank {rank} is blocked in {theirs}, a call the members "
                f"made at this place before, while this rank made {describe_call(call)}, which they never made "
                f"here (its calls before it on this group: {self._trail(ledger, WINDOW - 1)}). Nothing of this "
                "rank's tensor was sent, but the group is cut to free rank " + rank + ": check the order of "
                "collectives on the ranks named here")
            self._cut(route, board, error, refused=True)
            raise error
        if verdict == LOST:
            raise RankLostError(f"{what} failed while this rank waited for its members at the members' check of their "
                                f"calls: {detail}")
        raise GroupTimeoutError(
            f"{what}: only {detail} of the {target.size} members came to check their calls within {seconds:g}s "
            "(the group's timeout): the others are slow, stuck elsewhere, or made fewer calls on this group")

    @staticmethod
    def _gone(board: Board, ranks: Sequence[int]) -> str:
        """Why some of ``ranks`` will never come to this call, or empty when none is known not to: the launcher saw
        their processes end, they closed their context or exited (their final status), or they came to recover
        without ranks lost elsewhere (two or three store operations, more when a member's status is read)."""
        others = set(ranks) - {board.rank}
        board.silent(sorted(others))  # a member whose heartbeat stood still is posted gone (a final status)
        ended = sorted(set(board.ended(ranks)) & others)
        final = sorted((board.finals() & others) - set(ended))
        closed = {rank: status for rank, status in board.statuses(final).items()
                  if status.state in GONE_STATES} if final else {}
        if ended or closed:
            why = [f"the launcher saw the processes of ranks {ended} end"] if ended else []
            why += [status.describe(rank) for rank, status in closed.items()]
            return (f"ranks {sorted([*ended, *closed])} of the group are gone: {'; '.join(why)}. Expected every member "
                    "alive; see their logs, then restart the job or recover without them")
        recovering = [rank for rank in recovering_ranks(board) if rank != board.rank]
        if not others & set(recovering):
            return ""
        status = board.statuses(recovering[:1])[recovering[0]]
        return (f"ranks {status.lost_text} are lost, and ranks {recovering} are recovering without them "
                f"({status.describe(recovering[0])}), so they will not come to this call. Expected every survivor to "
                f"recover: call ctx.recover({status.lost_text}) on this rank too (they wait for it up to the creation "
                "timeout)")

    def _named(self, board: Board, meeting: int, ranks: Sequence[int], ledger: Ledger, call: Call,
               what: str) -> str:
        """The message naming the members whose calls differ from most members' (each member posts its last calls
        at the ``meeting`` that found the difference and reads the others'); the first place where they differ is
        named."""
        store = board.store
        mine = [describe_call(made) for made in [*list(ledger.recent)[-(WINDOW - 1):], call]]
        store.set(board.keys.calls_made(ledger.digest, meeting, board.rank), "\n".join(mine))
        keys = [board.keys.calls_made(ledger.digest, meeting, rank) for rank in ranks]
        try:
            store.wait(keys, timedelta(seconds=DESCRIPTIONS_SECONDS))
            held = {rank: raw.decode().split("\n") for rank, raw in zip(ranks, store.multi_get(keys), strict=True)}
        except Exception:  # a member never came: say what this rank knows
            held = {board.rank: mine}

        def made(back: int) -> dict[int, str]:  # each member's call ``back`` calls ago (1: this one)
            return {rank: calls[-back] if len(calls) >= back else "no call" for rank, calls in held.items()}

        back = next((back for back in range(1, WINDOW + 1) if len(set(made(back).values())) > 1), 1)
        at = made(back)
        earlier = "" if back == 1 else f" {back - 1} calls before this one ({mine[-1]}, alike on every member)"
        usual, times = collections.Counter(at.values()).most_common(1)[0]
        if 2 * times <= len(at):  # no majority (two members, say): every member's own, none called odd
            found = "; ".join(f"rank {rank} holds a tensor of {text}" for rank, text in sorted(at.items()))
        else:
            odd = {rank: text for rank, text in at.items() if text != usual}
            others = sorted(rank for rank in at if rank not in odd)
            named = "; ".join(f"rank {rank} holds a tensor of {text}" for rank, text in sorted(odd.items()))
            found = f"{named}, while ranks {others} hold {usual}"
        return (f"{what}: members hold different tensors{earlier}: {found}. Expected every member of the group to "
                "pass a tensor of the same shape and dtype to the same collective, in the same order (nothing was "
                "sent: the group is healthy; Context(check_tensors=False) turns this check off)")

    # ------------------------------------------------------------------ checkpoint

    def compare(self, checkpoint: Checkpoint, store: dist.Store) -> TensorMismatchError | None:
        """Compare this member's hashes at ``checkpoint`` with the first member's (two store operations, on the
        watch's connection): the error to raise when they differ, or when another member found a difference."""
        ledger, board = checkpoint.ledger, checkpoint.board
        broken_key = board.keys.broken(ledger.digest)
        first, _, rank = bytes(store.compare_set(board.keys.checkpoint(ledger.digest, checkpoint.count), "",
                                                 f"{checkpoint.marks}\n{board.rank}")).decode().partition("\n")
        broken = store.check([broken_key])
        if first == checkpoint.marks and not broken:
            return None
        what = f"on rank {board.rank}: {checkpoint.calls[-1][0]} along {checkpoint.route.target.label()}"
        if broken:
            return TensorMismatchError(f"{what}: {bytes(store.get(broken_key)).decode()}")
        # The first block whose hash differs holds the first call that differs.
        block = next(i for i, (a, b) in enumerate(zip(checkpoint.marks.split(","), first.split(","), strict=False))
                     if a != b)
        end = checkpoint.count - CHECKPOINT + (block + 1) * BLOCK
        made = "; ".join(f"#{end - BLOCK + 1 + i} {describe_call(call)}"
                         for i, call in enumerate(checkpoint.calls[len(checkpoint.calls) - (checkpoint.count - end)
                                                                   - BLOCK:len(checkpoint.calls)
                                                                   - (checkpoint.count - end)]))
        told = (f"members made different calls on this group, found after they ran: among calls #{end - BLOCK + 1}-"
                f"#{end} rank {board.rank} made {made}, and rank {rank} made others (its hash of them differs). "
                "The group is cut. Expected every member to make the same collectives in the same order; "
                "Context(check_tensors='every-call') stops before the first call that differs and names both")
        store.compare_set(broken_key, "", told)
        return TensorMismatchError(f"{what}: {told}")

    def _raise_found(self) -> None:
        """Raise what the watch found at a checkpoint, after cutting that group; not where the group was cut since
        (a member that found the difference first cut it, and the collective this rank was blocked in then told it
        why: a group fails once, and a later call, on any group, is not that failure's)."""
        while self.found:
            checkpoint, error = self.found.pop()
            if usable(checkpoint.route.group, checkpoint.board):
                self._cut(checkpoint.route, checkpoint.board, error, refused=False)
                raise error

    # ------------------------------------------------------------------ shared

    @staticmethod
    def _trail(ledger: Ledger, calls: int) -> str:
        """This member's last ``calls`` calls on the group, numbered."""
        recent = list(ledger.recent)[-calls:]
        first = ledger.count - len(recent) + 1
        return "; ".join(f"#{first + i} {describe_call(call)}" for i, call in enumerate(recent))

    def _cut(self, route: Route, board: Board, error: Exception, refused: bool) -> None:
        """Post ``error`` as this rank's failure (a member blocked in the group names it; ``refused``: nothing of
        this rank's was sent) and cut the group."""
        if route.group is not None:
            self._ledgers.pop(route.group, None)
        board.failed(error, refused=refused)
        if route.group is not None:
            board.connections.sever(route.group.group_name)
            # A communicator that can shrink (NCCL >= 2.27) is left for a recovery to shrink, as a failed
            # collective's is (fmesh.context.failures); any other is aborted now.
            if not (isinstance(error, RankLostError) and _torch.can_shrink(route.target.spec.backend)):
                _torch.abort_group(route.group)


class Watch:
    """A thread that posts the call this process has been blocked in, through the known path, for longer than
    :data:`BLOCKED_SECONDS` (once per call), over a store connection of its own: a member meeting for that call
    reads it (:meth:`CallChecks.meet`). It reads one attribute every :data:`WATCH_SECONDS`; it writes to the store
    only for a call blocked that long."""

    def __init__(self, checks: CallChecks, board: Board) -> None:
        self._checks, self._board = checks, board
        self._stopped = False
        self.wake = threading.Event()  # set by the caller's thread when it leaves a checkpoint to compare
        self._store: dist.Store | None = None
        threading.Thread(target=self._run, name=f"fmesh-call-watch-{board.rank}", daemon=True).start()

    def stop(self) -> None:
        """End the thread at its next look."""
        self._stopped = True
        self.wake.set()

    def _run(self) -> None:
        seen: tuple[Ledger | None, int] = (None, 0)
        since, posted = 0.0, seen
        while True:
            self.wake.wait(WATCH_SECONDS)
            self.wake.clear()
            if self._stopped:
                return
            checks = self._checks
            while checks.checkpoints and not checks.found:
                checkpoint = checks.checkpoints.popleft()
                with contextlib.suppress(Exception):  # a store that is gone is the failure path's to explain
                    error = checks.compare(checkpoint, self._connection())
                    if error is not None:
                        checks.found.append((checkpoint, error))
            ledger, now = checks.entered, time.monotonic()
            entered = (ledger, -1 if ledger is None else ledger.count)
            if entered != seen:  # another call, or none in flight
                seen, since = entered, now
            elif ledger is not None and entered != posted and now - since >= BLOCKED_SECONDS:
                posted = entered
                with contextlib.suppress(Exception):
                    self._post(ledger, entered[1], ledger.recent[-1])

    def _connection(self) -> dist.Store:
        """The watch's own store connection (a client serves one call at a time; the caller's thread has its own)."""
        if self._store is None:
            self._store = self._board.store.clone()
        return self._store

    def _post(self, ledger: Ledger, count: int, call: Call) -> None:
        board = self._board
        self._connection().set(board.keys.blocked(ledger.digest),
                               f"{count}\n{board.rank}\n{describe_call(call)} (call #{count} on this group)")
