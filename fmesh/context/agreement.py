"""Check, through the store, that every member of a group means the same group before creating it,
and find out, when a member does not come, why.

torch's ``DeviceMesh`` hangs when ranks disagree about a mesh: each side waits for a rendezvous the
other never joins. Here the members of a group meet under a key derived from the group's content
(its ordered ranks, backend, options and timeout: ``<prefix>/agree/<digest>``) and compare a
fixed-size digest of what each means by it (the mesh, the axes and the options). Per member that is
a constant number of store operations and bytes, whatever the group size:

1. post ``status/<rank>``: waiting at this key, with the group's short name (about a hundred bytes);
2. ``compare_set(<key>/digest, "", mine)``: the first member's digest (and description) stays, and the store
   hands it back; a member whose digest differs writes a mismatch verdict to ``<key>/done``;
3. ``add(<key>/arrived, 1)``: the member that brings the count to the group size writes ``ok``;
4. read ``<key>/done``, which every outcome writes (the last arrival ``ok``, a mismatch, a failure, an
   abort, a timeout), with ONE blocking store ``get`` as long as the creation timeout (:meth:`Agreement.wait_for`:
   on a connection of its own and a thread of its own, so ``ctx.abort()`` and signal handlers still end it at
   once; torch logs nothing when the key comes).

Four operations per member (five for the last to arrive). The status is not set back to ``running`` after the
agreement: a status "waiting at K" whose ``K/done`` is written means the rank went on past K, and the slow paths that
read statuses (a watcher's look for a cycle, a timeout's account of the missing members) check ``done`` before
they believe it (:meth:`Agreement.current`).

Full descriptions are read only to write an error (the first member's comes back with the digest). Past a grace
period, two waiters (the first two to arrive, known from their ``add``: two, so that the watch survives the death
of one, whose final status the other sees) now and then read the statuses of the members (one ``multi_get``) and
follow the members that have not arrived to what each is waiting for. A member whose status is final (it failed,
closed or aborted its context, or its process exited without closing it) will never come: the wait ends with
its error. A cycle
(rank 0 waits here for rank 1, which waits elsewhere for rank 0) can never complete: it is a
disagreement, reported as :class:`~fmesh.MeshMismatchError` on every rank of the cycle within
seconds. A member that failed is reported with its own error (a mismatch stays a mismatch, anything
else is :class:`~fmesh.RankLostError`). A member that is simply elsewhere
(busy, or gone) is waited for until the creation timeout, then :class:`~fmesh.GroupTimeoutError`
names the missing ranks and what each was last doing.

The same statuses let the survivors of a failed collective name the ranks that are gone
(:meth:`Agreement.roll_call`), and the survivors that recover agree on the ranks lost
(:meth:`Agreement.agree_on_loss`).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import attrs
import torch.distributed as dist

from fmesh.context.connections import Connections
from fmesh.errors import ContextClosedError, GroupTimeoutError, MeshMismatchError, RankLostError, RecoveryError

OK = "ok"
MISMATCH = "mismatch"  # a verdict: the members disagree
LOST = "lost"  # a verdict: a member failed instead of coming
TIMEOUT = "timeout"  # a verdict: members never came within the creation timeout
ENDED = "ended"  # a verdict: a member ended with no error instead of coming (it has no error to see)
FAILED = "failed"  # a status: this rank raised
CLOSED = "closed"  # a status: this rank closed (or aborted) its context
EXITED = "exited"  # a status: this rank's process ended (at interpreter exit) without closing its context
FINAL_STATES = (FAILED, CLOSED, EXITED)  # a member in one of these will never come: a wait for it ends at once
# A status: this rank came to recover (ctx.recover) without the lost ranks its status names. It never comes to a
# group, a collective or a roll call of this context again, but it is alive: a peer blocked with it is told to recover
# too, never that it is gone.
RECOVERING = "recovering"
# A status: a collective failed on this rank, which is calling the roll of its group to explain it (it raises then,
# and posts ``failed``): not blocked, so a recovery does not cut its groups to free it.
FAILING = "failing"
# How long a survivor that came to recover waits for the others before it cuts the groups it shares with one that
# has not come and is not on its way (it neither failed nor is failing): that one may be blocked in a collective with
# this rank (:meth:`Agreement.agree_on_loss`).
SEVER_GRACE_SECONDS = 2.0
GRACE_SECONDS = 1.0  # creation normally completes in milliseconds; slower is worth a look
MAX_POLL_SECONDS = 8.0  # the longest pause between two looks at the missing members
POLL_MAX_SECONDS = 0.1  # how late a waiter learns that its context was aborted (no store operation: an event)
EXIT_POST_TIMEOUT = timedelta(seconds=5)  # the longest a process's exit waits to post that it exited
MAX_GROUPS_FOLLOWED = 64  # bounds the work of one diagnosis
AGREED_POSTED = 4  # how many of the groups a rank agreed on last it posts when it closes
SURVIVOR = "survivor"  # a rank's fate in a recovery: it came to recover (it claims this itself)
FENCED = "fenced"  # a rank's fate in a recovery: the survivors recover without it (the last of them fences it out)
# How long the last survivor to agree on a recovery waits for a rank called lost, not known to be gone, to show
# it is alive by coming to recover too (two halves of a world calling each other lost come within milliseconds
# of each other) before fencing it out of the new world.
ALIVE_GRACE_SECONDS = 2.0
# How many of the first members to arrive watch a slow wait for members that will never come. Two, so that the watch
# survives the death of one watcher: each watcher is a member, so the other sees its final status (or the launcher's
# mark) and ends the wait with its error; the other members block once, at a constant cost.
WATCHERS = 2
# How the last survivor to come to a recovery closes the list of groups cut while it waited (``.../cut``): a survivor
# that finds the list closed cuts nothing more (what the survivors renew is read from the closed list).
CLOSED_LIST = "#"
ENDED_LIST = "fmesh/ended/all"  # every rank the launcher saw end, "3,7,": one read tells a watcher about them all


def _ranks(raw: bytes) -> set[int]:
    """The ranks of a list the store appends to (``"3,7,"``).

    >>> sorted(_ranks(b"3,7,3,"))
    [3, 7]
    """
    return {int(r) for r in raw.decode().split(",") if r}


def read_list(store: dist.Store, key: str) -> set[int]:
    """The ranks of the list at ``key`` (empty where nobody appended yet), in ONE store operation: a
    ``compare_set`` from nothing to nothing hands back what is there, and creates the empty list otherwise.

    >>> store = dist.HashStore()
    >>> read_list(store, "l"), store.append("l", "4,"), read_list(store, "l")
    (set(), None, {4})
    """
    return _ranks(store.compare_set(key, "", ""))


def mark_ended(store: dist.Store, rank: int, exitcode: object) -> None:
    """Say, in the launcher's ``store``, that ``rank``'s process ended (:func:`ended_key`, and the list of them all
    that a watcher reads in one operation).

    >>> store = dist.HashStore(); mark_ended(store, 3, -9)
    >>> store.get(ended_key(3)), read_list(store, ENDED_LIST)
    (b'-9', {3})
    """
    store.set(ended_key(rank), str(exitcode))
    store.append(ENDED_LIST, f"{rank},")


def ended_key(rank: int) -> str:
    """Where a launcher that saw ``rank``'s process end says so, in the store it hosts (the key
    :func:`fmesh.launch` writes): a roll call stops waiting for a rank that can never answer. (A process that
    ends on its own posts the status ``exited`` itself, :meth:`Agreement.post_exit`; one killed cannot.)"""
    return f"fmesh/ended/{rank}"


def digest(text: str) -> str:
    """A fixed-size digest of ``text``, the same in every process.

    >>> len(digest("Mesh(dp=2; world=2)"))
    32
    """
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return {"state": "unknown"}
    return value if isinstance(value, dict) else {"state": "unknown"}


def describe_status(rank: int, status: dict[str, Any]) -> str:
    """One line saying what ``rank`` was last doing, from its status.

    >>> describe_status(3, {"state": "running"})
    'rank 3 is not creating a group (busy elsewhere, or it took another path)'
    """
    state = status.get("state")
    if state == "waiting":
        return f"rank {rank} waits to create {status.get('what', '?')}"
    if state == FAILED:
        return f"rank {rank} failed: {status.get('error', '?')}"
    if state == CLOSED:
        failure = f" after it failed: {status['error']}" if status.get("error") else ""
        return f"rank {rank} {'aborted' if status.get('aborted') else 'closed'} its context{failure}"
    if state == EXITED:
        failure = f" after an uncaught {status['error']}" if status.get("error") else ""
        return (f"rank {rank} exited without closing its Context{failure} (its process ended: it returned from "
                "main, called sys.exit or raised; close the Context, or use `with fmesh.Context(...) as ctx:`)")
    if state == RECOVERING:
        lost = status.get("lost", "?")
        return f"rank {rank} is recovering without the lost ranks {lost} (it called ctx.recover({lost}))"
    if state == FAILING:
        return f"rank {rank} saw {status.get('what', 'a collective')} fail and calls the roll of its group"
    if state == "running":
        after = f", having created {status['after']}" if status.get("after") else ""
        return f"rank {rank} is not creating a group{after} (busy elsewhere, or it took another path)"
    return f"rank {rank} never posted a status (its context did not start, or it crashed)"


def _ended_instead(member: int, status: dict[str, Any], mine: str) -> str:
    """The verdict on a group (``mine`` describes it) whose ``member`` ended (``status``) instead of coming to create
    it. One that ended with no error is never "see its error": where it made a group along the same axes as this one
    (the groups it posted when it closed), the ranks made different groups (a mismatch naming it).

    >>> verdict = _ended_instead(3, {"state": "closed", "agreed": ["Mesh(tp=2); axes ('tp',); ranks (2, 3)"]},
    ...                          "Mesh(tp=2); axes ('tp',); ranks (1, 3)")
    >>> verdict.partition(chr(10))[0], verdict.split(": ", 1)[1].split(";")[0]
    ('mismatch', 'the ranks made different groups along these axes')
    """
    if status.get("error") or status.get("aborted") or status.get("state") == FAILED:
        kind = MISMATCH if status.get("kind") == "MeshMismatchError" else LOST
        return f"{kind}\n{describe_status(member, status)}, instead of creating this group (a member of it)"
    ended = f"{describe_status(member, status)}, with no error, never having come to create this group (a member of it)"
    axes = re.search(r"; axes \([^)]*\);", mine)
    other = [str(d) for d in status.get("agreed", ()) if axes and axes.group() in str(d) and str(d) != mine[:300]]
    if other:
        return (f"{MISMATCH}\n{ended}: the ranks made different groups along these axes; it made {other[-1]}, and "
                f"this rank means {mine}")
    return f"{ENDED}\n{ended}: it took another path than this rank (check the code each rank ran)"


@attrs.frozen
class HeldGroup:
    """A group a survivor holds when it comes to recover: its ``digest`` (what the survivors count it by), its
    ``ranks`` (old ranks) and its torch ``name`` (whose connections it cuts to free a member kept away).

    >>> HeldGroup("d", (0, 2), "3").ranks
    (0, 2)
    """

    digest: str
    ranks: tuple[int, ...]
    name: str


@attrs.frozen
class Agreement:
    """One Context's statuses and agreements in the store: this rank's status, and the agreement on each group.

    ``prefix`` is the context's namespace (its name and epoch); ``creation_timeout`` bounds how long
    a member waits for the others to come.
    """

    store: dist.Store
    prefix: str
    rank: int
    creation_timeout: timedelta
    grace: float = GRACE_SECONDS  # how long a waiter waits before it looks at what the missing ones do
    # The launcher's store, where it says which ranks' processes ended (ended_key); None where its ranks are not
    # this world's (a recovered world numbers them anew).
    launcher_store: dist.Store | None = attrs.field(default=None, eq=False, repr=False)
    # The Context's groups' sockets, and whether it was aborted (then every wait ends at its next poll).
    connections: Connections = attrs.field(factory=Connections, eq=False, repr=False)
    # The process this rank is: a child it forks inherits the exit hook, and its exit is not this rank's.
    pid: int = attrs.field(factory=os.getpid, eq=False, repr=False)
    # This rank's second store connection, for blocking waits (waiting_store): made at the first wait.
    waiter: list[dist.Store] = attrs.field(factory=list, eq=False, repr=False)
    # The last groups this rank agreed on (their descriptions), posted when it closes: a peer that waits for it
    # in a group it never came to can tell that the ranks made different groups.
    agreed: list[str] = attrs.field(factory=list, eq=False, repr=False)

    # ------------------------------------------------------------ statuses

    def _status_key(self, rank: int) -> str:
        return f"{self.prefix}/status/{rank}"

    def post(self, state: str, **fields: Any) -> None:
        """Post this rank's status (``running``, ``waiting``, ``failed``, ``closed``, ``exited``); a final one
        also joins the list of ranks whose status is final (:meth:`finals`)."""
        self.store.set(self._status_key(self.rank), json.dumps({"state": state, **fields}))
        if state in FINAL_STATES:
            self.store.append(f"{self.prefix}/finals", f"{self.rank},")

    def finals(self) -> set[int]:
        """The ranks whose status is final (failed, closed, exited): one store operation, so that a watcher's look
        costs the same whatever the number of members it waits for."""
        return read_list(self.store, f"{self.prefix}/finals")

    def statuses(self, ranks: Sequence[int], posted_before: set[int] | None = None) -> dict[int, dict[str, Any]]:
        """The statuses of ``ranks`` (two round trips when all posted one; ranks that never did are ``missing``,
        found by halving the ranks checked: a few checks per missing rank, then one ``multi_get``).
        ``posted_before``: ranks known to have posted (a status is never taken back), not checked again, and updated
        with those found now: a watcher's later looks read its members' statuses in one round trip."""
        keys = {rank: self._status_key(rank) for rank in ranks}
        known = posted_before if posted_before is not None else set()
        posted = [rank for rank in ranks if rank in known]
        unknown = [rank for rank in ranks if rank not in known]
        pending = [unknown] if unknown else []
        while pending:
            part = pending.pop()
            if self.store.check([keys[rank] for rank in part]):
                posted += part
            elif len(part) > 1:
                pending += [part[:len(part) // 2], part[len(part) // 2:]]
        known.update(posted)
        read = dict(zip(posted, self.store.multi_get([keys[rank] for rank in posted]), strict=True)) if posted else {}
        return {rank: _loads(read[rank]) if rank in read else {"state": "missing"} for rank in ranks}

    def current(self, statuses: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """``statuses`` as they stand now: an agreement leaves its members' statuses at "waiting at K" (setting them
        back costs a store operation per member and agreement), so a rank waiting at a group whose verdict is written
        went on past it: ``running``, after it. One ``check`` per group named; only the slow paths that describe
        ranks call this.

        >>> store = dist.HashStore(); agreement = Agreement(store, "doc", 0, timedelta(seconds=1))
        >>> store.set("doc/agree/k/done", "ok")
        >>> agreement.current({3: {"state": "waiting", "at": "k", "what": "tp (2, 3)"}})
        {3: {'state': 'running', 'after': 'tp (2, 3)'}}
        """
        keys = {str(status["at"]) for status in statuses.values()
                if status.get("state") == "waiting" and status.get("at")}
        past = {key for key in keys if self.store.check([f"{self.prefix}/agree/{key}/done"])}
        return {rank: {"state": "running", "after": status.get("what", "?")}
                if status.get("state") == "waiting" and status.get("at") in past else status
                for rank, status in statuses.items()}

    def failed(self, error: BaseException, refused: bool = False) -> None:
        """Post that this rank failed with ``error`` (others waiting for it report it); ``refused``: it refused a
        collective on itself, before sending any of it (the caller's tensor or arguments). Never raises."""
        self.post_quietly(FAILED, error=f"{type(error).__name__}: {error}"[:2000], kind=type(error).__name__,
                          **({"refused": True} if refused else {}))

    def close_quietly(self, aborted: bool) -> None:
        """Post that this rank closed (or aborted) its context, keeping the error it failed with, if any.

        An abort is never told as a close: ``abort()`` on a watchdog thread and ``close()`` on the main thread
        may both end the context, in either order, and peers should hear the abort.
        """
        with contextlib.suppress(Exception):
            last = self.statuses([self.rank])[self.rank]
            kept = ("error", "kind", "refused")
            failure = {k: last[k] for k in kept if k in last} if last.get("state") == FAILED else {}
            aborted = aborted or self.connections.halted.is_set()
            self.post(CLOSED, aborted=aborted, **failure, **({"agreed": self.agreed} if self.agreed else {}))

    def open(self) -> Agreement:
        """Post that this rank runs, and have a process that ends without closing its context tell its peers so at
        interpreter exit (:meth:`post_exit`), instead of leaving them to wait for it."""
        self.post("running")
        atexit.register(self.post_exit)
        return self

    def leave(self, aborted: bool, error: BaseException | None = None) -> None:
        """The end of this rank's context: the exit hook withdrawn (it also held this agreement and its store
        connection), and the peers that wait for this rank told why it will not come."""
        atexit.unregister(self.post_exit)
        if error is not None:
            self.failed(error)
        else:
            self.close_quietly(aborted=aborted)
        self.waiter.clear()  # its second store connection goes with the last wait on it (one per ended context)

    def post_exit(self) -> None:
        """Post, at interpreter exit, that this rank's process ended without closing its context (the Context
        registers this with ``atexit`` while it is open), with the uncaught exception that ended it, if any."""
        if os.getpid() != self.pid:
            return
        error = getattr(sys, "last_value", None)  # where the interpreter keeps the exception that ended the program
        with contextlib.suppress(Exception):  # a store that stopped answering must not hold the exit for long
            self.store.set_timeout(EXIT_POST_TIMEOUT)
        self.post_quietly(EXITED, **({"error": f"{type(error).__name__}: {error}"[:2000]} if error is not None else {}))

    def post_quietly(self, state: str, **fields: Any) -> None:
        """:meth:`post`, on a way out: a store that is gone (its host died) is no reason to raise."""
        # The store may be what failed; the error that brought us here matters more.
        with contextlib.suppress(Exception):
            self.post(state, **fields)

    # ------------------------------------------------------------ agreement

    def agree(self, key: str, members: Sequence[int], description: str, what: str) -> None:
        """Meet the other ``members`` at ``key`` and check they mean ``description`` too.

        ``what`` names the group in errors (axes, mesh, first ranks). Raises
        :class:`~fmesh.MeshMismatchError`, :class:`~fmesh.RankLostError` or
        :class:`~fmesh.GroupTimeoutError`; on success every member has arrived and agrees.
        """
        try:
            watcher = self.arrive(key, members, description, what)
            self.settle(key, members, description, what, watcher)
            self.agreed[:] = [*self.agreed[-(AGREED_POSTED - 1):], description[:300]]
        except dist.DistNetworkError as error:  # the store's host died: one fmesh error on every member, at once
            raise self.store_gone(f"agreeing to create {what}", error) from None

    def store_gone(self, doing: str, error: BaseException) -> RankLostError:
        """The error of a rank whose store connection broke (``error``) while ``doing``: its host is gone."""
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return RankLostError(
            f"on rank {self.rank}: the store is unreachable while {doing}: its host is gone (rank 0, unless "
            f"torchrun's agent hosts it; {type(error).__name__}: {cause}). No group can be made or recovered without "
            "it: see that process's error first, then restart the job (a store hosted outside the ranks survives "
            "any rank's loss)")

    def arrive(self, key: str, members: Sequence[int], description: str, what: str) -> bool:
        """Steps 1-3: post this rank's status, compare digests, count the arrival (no waiting). Whether this
        member arrived first: the one that watches the missing members while they all wait. A rank creates one
        group at a time (:class:`~fmesh.context.groups.GroupRegistry`), so its status names the one key it waits at."""
        base = f"{self.prefix}/agree/{key}"
        mine = digest(description)
        # Without the description (it is in ``digest``, and this rank knows its own): a watcher's look reads every
        # member's status, so its size is what a slow wait costs in bytes.
        self.post("waiting", at=key, what=what)
        # The first member's digest and description stay, and come back to each member with its own compare_set.
        first, _, theirs = self.store.compare_set(f"{base}/digest", "", f"{mine}\n{description}").decode().partition(
            "\n")
        if first != mine:
            verdict = (f"ranks disagree about {what}. Rank {self.rank} means: {description}; the first member "
                       f"to arrive means: {theirs}")
            self.store.compare_set(f"{base}/done", "", f"{MISMATCH}\n{verdict}")
            return False
        arrived = int(self.store.add(f"{base}/arrived", 1))
        if arrived == len(members):
            self.store.compare_set(f"{base}/done", "", OK)
        return arrived <= WATCHERS

    def settle(self, key: str, members: Sequence[int], description: str, what: str, watcher: bool = False) -> None:
        """Step 4: wait for the verdict (the ``watcher`` looks into a slow wait), raise it unless it is ``ok``."""
        self._wait(f"{self.prefix}/agree/{key}", key, members, what, watcher, description)

    def wait_for(self, key: str, seconds: float, look: Callable[[], bool] | None = None,
                 doing: str = "waiting", longest: float = MAX_POLL_SECONDS) -> bytes | None:
        """Wait up to ``seconds`` for ``key`` to be set, and read it, in ONE blocking store operation (a ``get``,
        which waits for its key up to the connection's timeout): a constant number of operations, however long, and
        nothing logged when it comes. Its value, or None where it did not come (then no one wrote it yet: the caller
        may write its own outcome with ``compare_set`` and read whichever came first).

        The wait runs on a thread of its own over a connection of its own (:meth:`waiting_store`: a store
        client serves one call at a time, and this one blocks), while the caller's thread waits on an event,
        so a signal handler and ``ctx.abort()`` still end the wait at once (:meth:`check_halted`; the caller
        writes ``key`` then, which ends the blocked thread). ``look``, when given, is called past the grace
        period, then at doubling intervals up to ``longest`` (``MAX_POLL_SECONDS``), on the caller's thread (the elected
        watcher's look at the missing members); it returns True to stop waiting.

        >>> import torch.distributed as dist
        >>> store = dist.HashStore(); store.set("k", "v")
        >>> Agreement(store, "doc", 0, timedelta(seconds=1)).wait_for("k", 1.0)
        b'v'
        """
        came = threading.Event()
        outcome: list[bytes | None] = []

        def block() -> None:
            try:
                waiting, limit = self.waiting_store(), timedelta(seconds=max(seconds, 0.001))
                if waiting is self.store:  # no connection of its own (an in-process store): its timeout left alone
                    waiting.wait([key], limit)
                else:
                    waiting.set_timeout(limit)  # this connection's own: no store operation
                outcome.append(bytes(waiting.get(key)))
            except Exception:  # the store's timeout (it logs its own warning), or the store is gone
                outcome.append(None)
            finally:
                came.set()

        threading.Thread(target=block, name=f"fmesh-wait-{self.rank}", daemon=True).start()
        started = time.monotonic()
        look_at, look_every = started + self.grace, self.grace
        while not came.wait(min(POLL_MAX_SECONDS, max(0.0, look_at - time.monotonic()))
                            if look is not None else POLL_MAX_SECONDS):
            self.check_halted(doing)
            if look is not None and time.monotonic() >= look_at:
                if look():
                    break
                look_every = min(look_every * 2, longest)
                look_at = time.monotonic() + look_every
        came.wait(POLL_MAX_SECONDS)  # a look that ended the wait wrote the key: the blocked thread returns now
        if outcome and outcome[0] is not None:
            return outcome[0]
        # The blocked thread timed out, or has not returned yet from a key a look wrote: read it here.
        return self.store.get(key) if self.store.check([key]) else None

    def waiting_store(self) -> dist.Store:
        """This rank's second connection to the store, for blocking waits (made at the first, then kept)."""
        if not self.waiter:
            try:
                self.waiter.append(self.store.clone())
            except (RuntimeError, NotImplementedError, AttributeError):  # a store without clone: shared
                self.waiter.append(self.store)
        return self.waiter[0]

    def _wait(self, base: str, key: str, members: Sequence[int], what: str, watcher: bool, description: str) -> None:
        # Every member blocks on the verdict key (wait_for): success, a mismatch, a failure a member posts,
        # an abort, a timeout all write it. Only the first WATCHERS members to arrive look, past the grace period,
        # at the missing members: a member that failed, closed or exited (a watcher too: the other one sees it), or
        # a cycle, is a verdict they write. Any member past the creation timeout writes the timeout.
        started = time.monotonic()
        done = f"{base}/done"

        looks: list[dict[int, tuple[Any, Any]]] = []  # what each look saw: every member's state and key
        posted: set[int] = set()  # the members whose status a look found (later looks need not check them again)

        def look() -> bool:
            # A cycle never moves: it is looked for only when the members stand where the previous look saw them.
            # While they move (a slow start, where each member works through its agreements), a look costs two reads
            # (the members' statuses, and the launcher's list of processes that ended).
            seen = self._diagnose(key, members, description, publish=not looks,
                                  search=lambda now: bool(looks) and now == looks[-1], posted=posted)
            looks.append(seen)
            return False

        try:
            came = self.wait_for(done, self.creation_timeout.total_seconds(), look if watcher else None,
                                 f"waiting to create {what}")
        except ContextClosedError:  # aborted: the group cannot be made; tell the members now
            with contextlib.suppress(Exception):
                self.store.compare_set(done, "", f"{LOST}\nrank {self.rank} aborted its context while waiting "
                                       "to create this group (a member of it)")
            raise
        if came is None:
            self._write_timeout(base, key, members, what, started)  # unless an outcome came meanwhile
        verdict = (came if came is not None else self.store.get(done)).decode()
        if verdict == OK:
            return
        kind, _, message = verdict.partition("\n")
        error: Exception
        if kind == MISMATCH:
            error = MeshMismatchError(
                f"on rank {self.rank}: {message}. Expected every rank to build this mesh from the same sizes, "
                "names and rank_map, and to use its meshes in the same order; check the ranks named here")
        elif kind == TIMEOUT:
            error = GroupTimeoutError(f"on rank {self.rank}: {message}")
        elif kind == ENDED:
            error = RankLostError(f"on rank {self.rank}: {message}")
        else:
            error = RankLostError(f"on rank {self.rank}: {message}. See that rank's error first")
        self.failed(error)
        raise error

    def connect_failed(self, members: Sequence[int], what: str, error: Exception) -> Exception:
        """What it means that connecting an agreed group failed with ``error``: a member that failed or closed
        meanwhile (it had arrived, then raised, exited its context or ran out of descriptors) is named with
        what it posted; a member that never connected within the creation timeout is a timeout; anything else
        is the backend's own ``error``."""
        others = [m for m in members if m != self.rank]
        try:
            statuses = self.statuses(others)
        except Exception:  # the store is gone: its host is what died
            return RankLostError(f"on rank {self.rank}: connecting {what} failed and the store is unreachable "
                                 f"(its host is gone): {error}")
        final = next((m for m in others if statuses[m].get("state") in FINAL_STATES), None)
        if final is not None:
            kind = MeshMismatchError if statuses[final].get("kind") == "MeshMismatchError" else RankLostError
            return kind(f"on rank {self.rank}: {describe_status(final, statuses[final])}, after agreeing to create "
                        f"{what}, a group it is a member of. See that rank's error first")
        if isinstance(error, dist.DistStoreError) or "imeout" in str(error) or "timed out" in str(error):
            now = self.current({m: statuses[m] for m in others[:8]})
            doing = "; ".join(describe_status(m, status) for m, status in now.items())
            return GroupTimeoutError(
                f"on rank {self.rank}: the members of {what} agreed, but did not all connect within the creation "
                f"timeout ({self.creation_timeout.total_seconds():g}s): a member died or hangs ({doing}). See the "
                "logs of the ranks named here")
        return error

    def check_halted(self, doing: str) -> None:
        """``ContextClosedError`` once :meth:`halt` ran (``ctx.abort()``, from any thread or a signal handler)."""
        if self.connections.halted.is_set():
            raise ContextClosedError(f"on rank {self.rank}: this context was aborted (ctx.abort()) while {doing}")

    def _write_timeout(self, base: str, key: str, members: Sequence[int], what: str, started: float) -> None:
        statuses = self.statuses(members)
        missing = [m for m in members if statuses[m].get("at") != key or statuses[m].get("state") != "waiting"]
        doing = "; ".join(describe_status(m, status) for m, status in self.current(
            {m: statuses[m] for m in missing[:8]}).items())
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        self.store.compare_set(f"{base}/done", "", (
            f"{TIMEOUT}\nthe members of {what} waited {time.monotonic() - started:.0f}s, but ranks "
            f"{missing[:16]}{'...' if len(missing) > 16 else ''} never came: {doing}{more}. Expected every "
            "member to create this group; check that they all build this mesh and run this collective, or raise "
            "creation_timeout if ranks reach it minutes apart"))

    # ------------------------------------------------------------- diagnosis

    def _diagnose(self, key: str, members: Sequence[int], description: str, publish: bool = True,
                  search: Callable[[dict[int, tuple[Any, Any]]], bool] | None = None,
                  posted: set[int] | None = None) -> dict[int, tuple[Any, Any]]:
        """The slow path: publish this group's members (at the first look), then look for a member that failed
        or a cycle (only where ``search``, given each member's state and key now, says so; always without it).
        Each member's state and key, as read. ``description``: what this rank means by the group; ``posted``: the
        members known to have posted a status (:meth:`statuses`)."""
        base = f"{self.prefix}/agree/{key}"
        if publish:
            self.store.set(f"{base}/members", json.dumps(list(members)))
        statuses = self.statuses(members, posted)
        seen = {member: (status.get("state"), status.get("at")) for member, status in statuses.items()}
        for member in members:
            status = statuses[member]
            if status.get("state") in FINAL_STATES and member != self.rank:
                self.store.compare_set(f"{base}/done", "", _ended_instead(member, status, description))
                return seen
            if status.get("state") == RECOVERING and member != self.rank:  # alive, but never comes: it recovers
                lost = status.get("lost", "?")
                self.store.compare_set(f"{base}/done", "", (
                    f"{ENDED}\n{describe_status(member, status)}, instead of creating this group (a member of it): "
                    f"ranks {lost} are lost; call ctx.recover({lost}) on this rank too"))
                return seen
        ended = [m for m in self.ended(members) if m != self.rank]  # killed: the launcher saw its process end
        if ended:
            self.store.compare_set(f"{base}/done", "", f"{LOST}\nthe launcher saw the process of rank {ended[0]} end "
                                   "(it was killed, or crashed) instead of creating this group (a member of it)")
            return seen
        if search is not None and not search(seen):
            return seen
        cycle = self._cycle(key, members, statuses)
        if cycle and self._still_stuck(cycle):
            # What each group on the cycle means (the first member's description, beside its digest): a status
            # carries the group's short name only.
            meant = {str(status["at"]): self._meant(str(status["at"])) for _, status in cycle}
            lines = [f"{describe_status(rank, status)} ({meant[str(status['at'])]})" for rank, status in cycle]
            verdict = (f"{MISMATCH}\nranks disagree about the meshes: they wait for each other in a cycle, each to "
                       f"create a group the next one does not create: {'; '.join(lines)}")
            for _, status in cycle:
                self.store.compare_set(f"{self.prefix}/agree/{status['at']}/done", "", verdict)
        return seen

    def _meant(self, key: str) -> str:
        """What the first member to come to the group at ``key`` means by it (its description, kept beside the
        digest), or "?" where none came yet."""
        kept = f"{self.prefix}/agree/{key}/digest"
        return self.store.get(kept).decode().partition("\n")[2] if self.store.check([kept]) else "?"

    def _still_stuck(self, cycle: list[tuple[int, dict[str, Any]]]) -> bool:
        """Whether a cycle found in statuses read at different moments is real: no group on it is done, before and
        after each rank on it is read again, and each still waits where it did. A real cycle never moves; a reading
        that a slow look made while the groups completed does (at 1,024 simulated ranks on a loaded machine, such a
        reading once ended a correct start in false mismatches)."""
        done = [f"{self.prefix}/agree/{status['at']}/done" for _, status in cycle]

        def any_done() -> bool:
            return any(self.store.check([key]) for key in done)

        if any_done():
            return False
        now = self.statuses([rank for rank, _ in cycle])
        moved = any(now[rank].get("state") != "waiting" or now[rank].get("at") != status.get("at")
                    for rank, status in cycle)
        return not moved and not any_done()

    def _cycle(self, start: str, members: Sequence[int],
               statuses: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
        """A cycle of waiting ranks through ``start``, as ``(rank, status)``; empty if none is known."""
        me = statuses[self.rank] if self.rank in statuses else self.statuses([self.rank])[self.rank]
        stack: list[tuple[str, Sequence[int], dict[int, dict[str, Any]], list[tuple[int, dict[str, Any]]]]] = [
            (start, members, statuses, [(self.rank, me)])
        ]
        seen = {start}
        while stack and len(seen) <= MAX_GROUPS_FOLLOWED:
            key, group, known, path = stack.pop()
            for member in group:
                status = known[member]
                if status.get("state") != "waiting" or status.get("at") == key:
                    continue  # arrived here, or not waiting for any group
                elsewhere = str(status.get("at"))
                if elsewhere == start:
                    return [*path, (member, status)]
                if elsewhere in seen:
                    continue
                seen.add(elsewhere)
                if self.store.check([f"{self.prefix}/agree/{elsewhere}/done"]):
                    continue  # its verdict is written: the member went on past it (its status stays "waiting at")
                listed = f"{self.prefix}/agree/{elsewhere}/members"
                if not self.store.check([listed]):
                    continue  # its members have not been published yet: look again next round
                others = [int(r) for r in json.loads(self.store.get(listed).decode())]
                stack.append((elsewhere, others, self.statuses(others), [*path, (member, status)]))
        return []

    # -------------------------------------------------------------- roll call

    def answers(self, label: str, members: Sequence[int]) -> dict[int, str]:
        """What each of ``members`` answered the roll call ``label`` (each has answered)."""
        keys = [f"{self.prefix}/roll/{label}/{m}" for m in members]
        return {m: bytes(raw).decode(errors="replace") for m, raw in zip(members, self.store.multi_get(keys),
                                                                          strict=True)}

    def ended(self, ranks: Sequence[int]) -> list[int]:
        """Those of ``ranks`` whose process the launcher saw end (:func:`mark_ended`): one store operation, however
        many ranks."""
        if self.launcher_store is None or not ranks:
            return []
        marked = read_list(self.launcher_store, ENDED_LIST)
        return [rank for rank in ranks if rank in marked]

    def roll_call(self, label: str, members: Sequence[int], seconds: float, answer: str = "here") -> list[int]:
        """The ``members`` that do not answer within ``seconds`` (the survivors of a failed collective
        each call this with the same ``label``, answering what went wrong for them: :meth:`answers`).

        A constant number of store operations per member: each answers, adds its rank to the list of those who
        answered, counts itself (the last to answer writes the outcome) and blocks once on the outcome key. The
        first two to answer watch, past a second and then at doubling intervals, for members that will never
        answer (their status is final, or the launcher saw their process end: a few store operations a look,
        :meth:`finals`, :meth:`ended`); they write the outcome then, or at ``seconds``: the members that did not
        answer."""
        base = f"{self.prefix}/roll/{label}"
        done = f"{base}/done"
        self.store.set(f"{base}/{self.rank}", answer[:2000])
        self.store.append(f"{base}/answered", f"{self.rank},")
        count = int(self.store.add(f"{base}/count", 1))
        if count >= len(members):
            self.store.compare_set(done, "", "[]")

        def silent() -> list[int]:
            answered = {int(r) for r in self.store.get(f"{base}/answered").decode().split(",") if r}
            return [m for m in members if m not in answered]

        def look() -> bool:  # two or three store operations, whatever the number of members
            quiet = silent()
            final = self.finals() if quiet else set()
            alive = [m for m in quiet if m not in final]
            gone = not alive or len(self.ended(alive)) == len(alive)
            if gone:  # every member that has not answered failed, closed, or its process ended: none ever will
                self.store.compare_set(done, "", json.dumps(quiet))
            return gone

        watcher = count <= WATCHERS
        came = self.wait_for(done, seconds if watcher else seconds + 2 * POLL_MAX_SECONDS,
                             look if watcher else None, f"calling the roll of {label}")
        if came is None:  # the deadline: the watcher writes who is silent (unless an outcome came meanwhile)
            self.store.compare_set(done, "", json.dumps(silent()))
        return [int(m) for m in json.loads((came if came is not None else self.store.get(done)).decode())]

    # -------------------------------------------------------------- recovery

    def post_loss(self, lost: Sequence[int], groups: Sequence[str]) -> int:
        """Post the ranks this survivor recovers without, and the digests of the groups it holds; claim this
        rank's own place (``fate/<rank>``: a survivor); the first survivor to post fixes the lost set. A survivor
        that means another set writes the outcome (a mismatch) at once, and one that the survivors of another set
        already fenced out is refused: both get :class:`~fmesh.RecoveryError`. One that agrees counts itself;
        this returns the count (the last to count fences the lost ranks out and writes ``ok``:
        :meth:`agree_on_loss`)."""
        base = f"{self.prefix}/recovery-agreement"
        mine = sorted(lost)
        # This rank's claim carries the set it recovers without: the last survivor reads it where it fences. It comes
        # before the rank says it came (``called``), so a lost rank that came has claimed its place, or was refused.
        claim = f"{SURVIVOR}\n{json.dumps(mine)}"
        fate = self.store.compare_set(f"{base}/fate/{self.rank}", "", claim).decode()
        # The set and who fixed it, in one value: compare_set hands back the first survivor's, whoever posts later.
        first = _loads(self.store.compare_set(f"{base}/lost", "", json.dumps({"lost": mine, "by": self.rank})))
        if fate != claim:  # the survivors of another set agreed and fenced this rank out before it came
            raise RecoveryError(
                f"on rank {self.rank}: this rank came to recover without {mine}, but the survivors that recover "
                f"without {first.get('lost')} had already fenced it out of their world: they went on without it. "
                "Expected the survivors to agree on the ranks lost; take them from one source (the launcher's, or "
                "the roll call of the failed collective), and end this rank")
        self.store.append(f"{base}/called", f"{self.rank},")
        if first.get("lost") != mine:  # another set is fixed: this rank can never be in its world
            self.store.compare_set(f"{base}/done", "", json.dumps({"rank": self.rank, "lost": mine}))
            self._raise_disagreement(mine)
        for group in groups:  # how many survivors hold each group: one counter per group, a few bytes whatever N
            self.store.add(f"{base}/held/{group}", 1)
        return int(self.store.add(f"{base}/count", 1))

    def agree_on_loss(self, survivors: Sequence[int], lost: Sequence[int],
                      groups: Sequence[str | HeldGroup]) -> dict[str, int]:
        """Post ``lost`` and ``groups`` (:meth:`post_loss`), wait for every one of ``survivors`` to post theirs,
        and return, for each of this rank's ``groups`` (by digest; a :class:`HeldGroup` also says how to cut it), how
        many survivors hold it (a group is kept only where every surviving member holds it; one a survivor cut while
        it waited counts as held by none).

        :class:`~fmesh.RecoveryError` as soon as one posts other lost ranks (naming both sets), or a rank called
        lost shows it is alive (it comes to recover too: the ranks split into two worlds, each calling the other
        lost), or a survivor's process ended or it closed its context (its status, or the launcher's mark), or one
        has not come within the creation timeout. Two survivor sets never both go on: the last survivor to come
        *fences* each lost rank out (``compare_set`` of its ``fate`` key, which the rank itself claims when it comes)
        before writing ``ok``, after giving a lost rank not known to be gone :data:`ALIVE_GRACE_SECONDS` to show it is
        alive; a fenced rank that comes later is refused.

        A survivor that has not come may be blocked in a collective with one that has (on a ``(dp, tp)`` mesh rank 3
        dies, rank 2 recovers, rank 0 waits for rank 2 in a dp all_reduce): past :data:`SEVER_GRACE_SECONDS`, each
        survivor that came cuts the connections of every :class:`HeldGroup` of ``groups`` (with its members and torch
        name) that a missing survivor which neither failed nor is failing belongs to
        (:meth:`~fmesh.context.connections.Connections.sever`), so that survivor's collective fails at once, and it is
        told to recover too (this rank's status says it recovers); the groups cut are made anew (the last to come closes
        the list of them, and writes it with ``ok``).

        A constant number of store operations and bytes per survivor and group it holds, whatever the world size
        (the last one also fences each lost rank): it posts, counts itself in each group's counter, blocks once on
        the outcome key, then reads its groups' counters in one ``multi_get`` (reading every survivor's post
        instead grew as N² bytes through the store: 46 GB at 16,384 ranks, by ``bench/scale.py``). A store that
        cannot be reached (its host was among the lost) is one ``RecoveryError`` saying so and what to do."""
        try:
            return self._agree_on_loss(survivors, lost, [g if isinstance(g, str) else g.digest for g in groups],
                                       [g for g in groups if isinstance(g, HeldGroup)])
        except dist.DistError as error:
            raise RecoveryError(
                f"on rank {self.rank}: the survivors cannot agree to recover without {sorted(lost)}: the store they "
                f"meet in is unreachable, so its host (rank 0 of a tcp:// or env:// start) is lost with them ("
                f"{error}). A lost store host cannot be recovered in place: restart the job from its checkpoint, and "
                "host the store outside the ranks (fmesh.launch, torchrun's agent, or a TCPStore server process of "
                "its own) to recover in place next time") from None

    def _agree_on_loss(self, survivors: Sequence[int], lost: Sequence[int], groups: Sequence[str],
                       held: Sequence[HeldGroup]) -> dict[str, int]:
        count = self.post_loss(lost, groups)
        self.post(RECOVERING, lost=sorted(lost))  # a peer blocked with this rank is told to recover, not that it died
        done = f"{self.prefix}/recovery-agreement/done"
        if count >= len(survivors):
            self._fence(sorted(lost), done)
        cut: set[str] = set()  # the groups this rank cut while it waited
        arrived = time.monotonic()
        looked: list[bool] = []  # whether this watcher looked before (then the list of finals exists)

        def look() -> bool:  # every survivor frees those blocked with it; the first two watch for those that ended
            if held and time.monotonic() - arrived >= SEVER_GRACE_SECONDS:
                self._cut_kept_away(survivors, held, cut)
            if count > WATCHERS:
                return False
            # Two store operations a look (three the first time), whatever the world size.
            came_here, finals = self._came_and_finals(both_exist=bool(looked))
            looked.append(True)
            missing = [m for m in survivors if m not in came_here]
            final = finals.intersection(missing)
            # A survivor that failed (its collective raised) is on its way here, or came since the first read; one
            # that closed or exited will never come.
            statuses = self.statuses(sorted(final)) if final else {}
            final = {m for m in final if statuses[m].get("state") in (CLOSED, EXITED)}
            ended = self.ended([m for m in missing if m not in final])
            gone = sorted({*final, *ended})
            if gone:
                doing = "; ".join(describe_status(m, statuses[m]) if m in final else
                                  f"the launcher saw the process of rank {m} end" for m in gone[:8])
                self.store.compare_set(done, "", json.dumps({"gone": sorted(gone), "doing": doing}))
            return bool(gone)

        came = self.wait_for(done, self.creation_timeout.total_seconds(), look, doing="agreeing on the ranks lost")
        if came is None:  # the timeout, unless an outcome came meanwhile
            missing = self._not_come(survivors)
            doing = "; ".join(describe_status(m, s) for m, s in self.current(self.statuses(missing[:8])).items())
            self.store.compare_set(done, "", json.dumps({"gone": missing, "doing": doing, "timeout": True}))
        # "ok", and the groups cut, if any
        verdict, _, cut_list = (came if came is not None else self.store.get(done)).decode().partition("\n")
        if verdict != OK:
            outcome = json.loads(verdict)
            if "gone" in outcome:
                within = (f"within {self.creation_timeout.total_seconds():g}s" if outcome.get("timeout") else
                          "(their processes ended, or they closed their contexts)")
                raise RecoveryError(
                    f"on rank {self.rank}: survivors {outcome['gone']} did not come to recover without {sorted(lost)} "
                    f"{within} ({outcome['doing']}). Expected every rank not lost to call recover(); if those ranks "
                    "are gone too, recover without them as well")
            self._raise_disagreement(sorted(lost), outcome)
        if not groups:
            return {}
        base = f"{self.prefix}/recovery-agreement"
        counters = self.store.multi_get([f"{base}/held/{group}" for group in groups])
        severed = set(cut_list.split(","))
        return {group: 0 if group in severed else int(raw) for group, raw in zip(groups, counters, strict=True)}

    def _cut_kept_away(self, survivors: Sequence[int], held: Sequence[HeldGroup], cut: set[str]) -> None:
        """Cut the connections of each of ``held`` not cut yet (``cut``, updated) that a survivor which has not come
        belongs to, unless that survivor failed or is failing (it is on its way: a collective failed there) or ended;
        first add them to the recovery's list of groups cut, unless the last survivor to come closed it. A store
        operation per group while every member has come; a few more for a group where one has not."""
        base = f"{self.prefix}/recovery-agreement"
        alive = set(survivors)
        waiting: dict[str, list[int]] = {}
        for group in held:
            others = [m for m in group.ranks if m in alive and m != self.rank]
            if group.digest not in cut and others and not self.store.check([f"{base}/fate/{m}" for m in others]):
                waiting[group.digest] = others
        if not waiting:
            return
        absent = self._absent(sorted({m for others in waiting.values() for m in others}))
        statuses = self.statuses(absent)
        kept_away = {m for m in absent if statuses[m].get("state") not in (*FINAL_STATES, RECOVERING, FAILING)}
        chosen = [digest for digest, others in waiting.items() if kept_away.intersection(others)]
        if not chosen or not self._add_cuts(chosen):
            return
        for group in held:
            if group.digest in chosen:
                self.connections.sever(group.name)
        cut.update(chosen)

    def _absent(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` that have not claimed their place in the recovery (found by halving the ranks checked,
        as :meth:`statuses` finds those that never posted)."""
        base = f"{self.prefix}/recovery-agreement"
        absent: list[int] = []
        pending = [ranks] if ranks else []
        while pending:
            part = pending.pop()
            if self.store.check([f"{base}/fate/{m}" for m in part]):
                continue
            if len(part) == 1:
                absent += part
            else:
                pending += [part[:len(part) // 2], part[len(part) // 2:]]
        return sorted(absent)

    def _add_cuts(self, digests: Sequence[str]) -> bool:
        """Add ``digests`` to the list of groups cut in this recovery; whether it was still open (the last survivor
        to come closes it before writing ``ok``: from then on nothing is cut). A ``compare_set`` loop: what is in
        the list when it closes is what every survivor reads."""
        key = f"{self.prefix}/recovery-agreement/cut"
        seen = self.store.compare_set(key, "", "").decode()
        while not seen.endswith(CLOSED_LIST):
            wanted = seen + "".join(f"{digest}," for digest in digests)
            now = self.store.compare_set(key, seen, wanted).decode()
            if now == wanted:
                return True
            seen = now
        return False

    def _close_cuts(self) -> str:
        """Close the list of groups cut in this recovery (the last survivor to come, before it writes ``ok``), and
        return it (``"d1,d2,"``): one store operation where nobody cut a group."""
        key = f"{self.prefix}/recovery-agreement/cut"
        seen, now = "", self.store.compare_set(key, "", CLOSED_LIST).decode()
        while now != seen + CLOSED_LIST:
            seen = now
            now = self.store.compare_set(key, seen, seen + CLOSED_LIST).decode()
        return seen

    def recovering(self) -> list[int]:
        """The ranks that came to recover, in order (one store operation)."""
        return sorted(read_list(self.store, f"{self.prefix}/recovery-agreement/called"))

    def _fence(self, lost: list[int], done: str) -> None:
        """The last survivor to come: wait up to :data:`ALIVE_GRACE_SECONDS` for a rank in ``lost`` that is not
        known to be gone (no final status, no launcher's mark) to come to recover too, then fence each lost rank
        out, and write the outcome: ``ok``, or the disagreement with a lost rank that came (it is alive)."""
        base = f"{self.prefix}/recovery-agreement"
        deadline = time.monotonic() + ALIVE_GRACE_SECONDS

        def came() -> list[int]:
            return sorted(set(lost).difference(self._not_come(lost)))

        statuses = self.statuses(lost)
        unknown = [r for r in lost if statuses[r].get("state") not in (*FINAL_STATES, "missing")]
        unknown = [r for r in unknown if r not in self.ended(unknown)]
        arrived = came()
        while unknown and not arrived and time.monotonic() < deadline:
            self.check_halted("agreeing on the ranks lost")
            time.sleep(POLL_MAX_SECONDS / 2)
            arrived = came()
        fates = {r: self.store.compare_set(f"{base}/fate/{r}", "", FENCED).decode() for r in lost}
        claims = {r: fate for r, fate in fates.items() if fate != FENCED}  # it claimed its place: it is alive
        alive = sorted({*came(), *claims})
        if alive:
            other = alive[0]
            _, _, theirs_raw = claims.get(other, "").partition("\n")
            theirs = json.loads(theirs_raw) if theirs_raw else "?"
            self.store.compare_set(done, "", json.dumps({"rank": other, "lost": theirs, "alive": True}))
        else:
            cut = self._close_cuts()  # what the survivors cut while they waited, fixed now, goes with the verdict
            self.store.compare_set(done, "", f"{OK}\n{cut}" if cut else OK)

    def _came_and_finals(self, both_exist: bool) -> tuple[set[int], set[int]]:
        """The survivors that came to recover, and the ranks whose status is final (:meth:`finals`): in one store
        operation where ``both_exist`` (a ``multi_get`` waits for a missing key), in two the first time (reading the
        finals makes their list)."""
        came = f"{self.prefix}/recovery-agreement/called"
        if not both_exist:
            return _ranks(self.store.get(came)), self.finals()
        called, finals = self.store.multi_get([came, f"{self.prefix}/finals"])
        return _ranks(called), _ranks(finals)

    def _not_come(self, ranks: Sequence[int]) -> list[int]:
        """Those of ``ranks`` that have not come to recover (one store operation)."""
        called = _ranks(self.store.get(f"{self.prefix}/recovery-agreement/called"))
        return [rank for rank in ranks if rank not in called]

    def _raise_disagreement(self, mine: list[int], outcome: dict[str, Any] | None = None) -> None:
        """:class:`~fmesh.RecoveryError` naming this rank's lost set and another survivor's (from ``outcome``, the
        mismatch written, or the set the first survivor fixed)."""
        first = _loads(self.store.get(f"{self.prefix}/recovery-agreement/lost"))
        other, theirs = (outcome["rank"], outcome["lost"]) if outcome else ("?", first.get("lost"))
        if (outcome is None or other == self.rank or theirs == mine) and first.get("lost") != mine:
            other, theirs = first.get("by", "?"), first.get("lost")  # name the survivor that fixed the other set
        alive = (f" (rank {other} is alive: it came to recover too, so the ranks split into worlds that each call "
                 "the other lost)") if outcome and outcome.get("alive") else ""
        raise RecoveryError(
            f"on rank {self.rank}: the survivors disagree about the ranks lost: rank {self.rank} says {mine}, rank "
            f"{other} says {theirs}{alive}. Expected every survivor to recover without the same ranks; take them "
            "from one source (the launcher's, or the roll call of the failed collective)")
