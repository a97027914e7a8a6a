"""Check, through the store, that every member of a group means the same group before creating it,
and find out, when a member does not come, why.

torch's ``DeviceMesh`` hangs when ranks disagree about a mesh: each side waits for a rendezvous the
other never joins. Here the members of a group meet (:class:`~fmesh.context.store.meeting.Meeting`) under a key
derived from the group's content (its ordered ranks, backend, options and timeout: ``<prefix>/agree/<digest>``)
and compare a fixed-size digest of what each means by it (the mesh, the axes and the options). Per member that is
a constant number of store operations and bytes, whatever the group size:

1. post ``status/<rank>``: waiting at this key, with the group's short name (about a hundred bytes);
2. ``compare_set(<key>/digest, "", mine)``: the first member's digest (and description) stays, and the store
   hands it back; a member whose digest differs writes a mismatch verdict to ``<key>/done``;
3. ``add(<key>/arrived, 1)``: the member that brings the count to the group size writes ``ok``;
4. read ``<key>/done``, which every outcome writes (the last arrival ``ok``, a mismatch, a failure, an
   abort, a timeout), with ONE blocking store ``get`` as long as the creation timeout
   (:meth:`~fmesh.context.store.wait.Waiter.wait_for`: on a connection of its own and a thread of its own, so
   ``ctx.abort()`` and signal handlers still end it at once; torch logs nothing when the key comes).

Four operations per member (five for the last to arrive). The status is not set back to ``running`` after the
agreement: a status "waiting at K" whose ``K/done`` is written means the rank went on past K, and the slow paths that
read statuses (a watcher's look for a cycle, a timeout's account of the missing members) check ``done`` before
they believe it (:meth:`~fmesh.context.store.board.Board.current`).

Full descriptions are read only to write an error (the first member's comes back with the digest). Past a grace
period, two waiters (the first two to arrive, known from their ``add``: two, so that the watch survives the death
of one, whose final status the other sees) now and then look at the members that have not arrived
(:mod:`fmesh.context.store.diagnosis`): a member whose status is final will never come, and a cycle of ranks
waiting for each other is a disagreement. A member that is simply elsewhere (busy, or gone) is waited for until
the creation timeout, then :class:`~fmesh.GroupTimeoutError` names the missing ranks and what each was last doing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch.distributed as dist

from fmesh.context.store.board import AGREED_POSTED, Board
from fmesh.context.store.diagnosis import Look, diagnose
from fmesh.context.store.keys import digest
from fmesh.context.store.meeting import Meeting, watches
from fmesh.context.store.records import ENDED, FAILING, MISMATCH, OK, TIMEOUT, WAITING, Verdict
from fmesh.context.store.wait import ABORT_NOTICE_SECONDS
from fmesh.errors import ContextClosedError, GroupTimeoutError, MeshMismatchError, RankLostError

# How long a member whose connection to a new group broke reads its peers' statuses again for why: a peer that cut
# the group (it saw a collective fail) posts that just before it cuts.
CUT_NOTICE_SECONDS = 1.0


def agree(board: Board, key: str, members: Sequence[int], description: str, what: str) -> None:
    """Meet the other ``members`` at ``key`` and check they mean ``description`` too.

    ``what`` names the group in errors (axes, mesh, first ranks). Raises
    :class:`~fmesh.MeshMismatchError`, :class:`~fmesh.RankLostError` or
    :class:`~fmesh.GroupTimeoutError`; on success every member has arrived and agrees.

    >>> from datetime import timedelta
    >>> agree(Board(dist.HashStore(), "doc", 0, timedelta(seconds=1)), "k", [0], "Mesh(dp=1)", "dp")  # alone
    """
    try:
        watcher = arrive(board, key, members, description, what)
        settle(board, key, members, description, what, watcher)
        board.agreed[:] = [*board.agreed[-(AGREED_POSTED - 1):], description[:300]]
    except dist.DistNetworkError as error:  # the store's host died: one fmesh error on every member, at once
        raise board.store_gone(f"agreeing to create {what}", error) from None


def arrive(board: Board, key: str, members: Sequence[int], description: str, what: str) -> bool:
    """Steps 1-3: post this rank's status, compare digests, count the arrival (no waiting). Whether this
    member arrived among the first: those that watch the missing members while they all wait. A rank creates one
    group at a time (:class:`~fmesh.context.groups.GroupRegistry`), so its status names the one key it waits at."""
    meeting = Meeting(board.store, board.keys.agreement(key), len(members))
    mine = digest(description)
    # Without the description (it is in ``digest``, and this rank knows its own): a watcher's look reads every
    # member's status, so its size is what a slow wait costs in bytes.
    board.post(WAITING, at=key, what=what)
    # The first member's digest and description stay, and come back to each member with its own compare_set.
    first, _, theirs = meeting.compare(f"{mine}\n{description}").partition("\n")
    if first != mine:
        meeting.decide(Verdict(MISMATCH, f"ranks disagree about {what}. Rank {board.rank} means: {description}; "
                                         f"the first member to arrive means: {theirs}").dumps())
        return False
    return watches(meeting.arrive(OK))


def settle(board: Board, key: str, members: Sequence[int], description: str, what: str,
           watcher: bool = False) -> None:
    """Step 4: wait for the verdict (the ``watcher`` looks into a slow wait), raise it unless it is ``ok``.

    Every member blocks on the verdict key: success, a mismatch, a failure a member posts, an abort, a timeout all
    write it. Only the first watchers to arrive look, past the grace period, at the missing members: a member that
    failed, closed or exited (a watcher too: the other one sees it), or a cycle, is a verdict they write. Any member
    past the creation timeout writes the timeout."""
    meeting = Meeting(board.store, board.keys.agreement(key), len(members))
    started = time.monotonic()
    looking = Look(board, key, members, description)
    try:
        came = meeting.wait(board.waiter, board.creation_timeout.total_seconds(), looking.look if watcher else None,
                            f"waiting to create {what}")
    except ContextClosedError:  # aborted: the group cannot be made; tell the members now (abort() did, mostly)
        with contextlib.suppress(Exception):
            board.withdraw(key)
        raise
    if came is None and board.set_up_seconds > 0:  # a member alive inside torch's set-up of another group is coming
        statuses = board.statuses(members)
        if board.setting_up({m: status for m, status in statuses.items() if not status.waits_at(key)}):
            came = meeting.wait(board.waiter, board.set_up_seconds, looking.look if watcher else None,
                                f"waiting to create {what}")
    if came is None:  # a last look: a member that failed or went to recover since the last one is that, not a timeout
        diagnose(board, key, members, description)
        _write_timeout(board, meeting, key, members, what, started)  # unless an outcome came meanwhile
    verdict = Verdict.loads(came if came is not None else meeting.verdict())
    if verdict.kind == OK:
        return
    error: Exception
    if verdict.kind == MISMATCH:
        error = MeshMismatchError(
            f"on rank {board.rank}: {verdict.message}. Expected every rank to build this mesh from the same sizes, "
            "names and rank_map, and to use its meshes in the same order; check the ranks named here")
    elif verdict.kind == TIMEOUT:
        error = GroupTimeoutError(f"on rank {board.rank}: {verdict.message}")
    elif verdict.kind == ENDED:
        error = RankLostError(f"on rank {board.rank}: {verdict.message}")
    else:
        error = RankLostError(f"on rank {board.rank}: {verdict.message}. See that rank's error first")
    board.failed(error)
    raise error


def _write_timeout(board: Board, meeting: Meeting, key: str, members: Sequence[int], what: str,
                   started: float) -> None:
    statuses = board.statuses(members)
    missing = [m for m in members if not statuses[m].waits_at(key)]
    doing = "; ".join(status.describe(m) for m, status in board.current(
        {m: statuses[m] for m in missing[:8]}).items())
    more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
    meeting.decide(Verdict(TIMEOUT, (
        f"the members of {what} waited {time.monotonic() - started:.0f}s, but ranks "
        f"{missing[:16]}{'...' if len(missing) > 16 else ''} never came: {doing}{more}. Expected every "
        "member to create this group; check that they all build this mesh and run this collective, or raise "
        "creation_timeout if ranks reach it minutes apart")).dumps())


# How a member that learnt of a loss inside torch's set-up of a group says so: the backend's connect told it, which
# for gloo is five connect timeouts after the loss (fmesh.context.set_up.GLOO_SET_UP_WAITS), the set-up's bound.
INSIDE_SET_UP = "told by torch's set-up of it (gloo's raises five connect timeouts after a loss)"


def connect_failed(board: Board, members: Sequence[int], what: str, error: Exception,
                   settle: bool = True) -> Exception:
    """What it means that connecting an agreed group failed with ``error``: a member that failed or closed
    meanwhile (it had arrived, then raised, exited its context or ran out of descriptors) is named with
    what it posted, as is one that saw a collective fail (it cut its groups, this one among them, while this rank
    still connected it) and one whose process the launcher saw end; a member that never connected within the
    creation timeout is a timeout; anything else is the backend's own ``error``. A member that cut the group posts
    why first, but this rank may read before: the statuses are read again for up to :data:`CUT_NOTICE_SECONDS`.
    Where this process did not run past the bound, or its store stopped answering, that is told first: the members
    it sees gone went on without it (:meth:`~fmesh.context.store.board.Board.store_silence`). Where the backend timed
    out and nobody said why, the heartbeats are given a silence to tell (unless not to ``settle``: a try the members
    make again after meeting, whose agreement names the silent)."""
    own = board.store_silence(f"connecting {what}")
    if own is not None:
        return own
    others = [m for m in members if m != board.rank]
    deadline = time.monotonic() + CUT_NOTICE_SECONDS
    try:
        settled = not settle
        while True:
            statuses = board.statuses(others)
            cause = next((m for m in others if statuses[m].final), None)
            cause = cause if cause is not None else next((m for m in others if statuses[m].state == FAILING), None)
            ended = board.ended(others)
            if cause is None and not ended and _timed_out(error) and not settled:
                # Nobody said why: a member that died while connecting posted nothing; its heartbeat tells.
                settled = True
                if board.silent(others, settle=board.silence):
                    continue
            if cause is not None or ended or time.monotonic() >= deadline or _timed_out(error):
                break
            time.sleep(ABORT_NOTICE_SECONDS)
    except Exception:  # the store is gone: its host is what died
        return RankLostError(f"on rank {board.rank}: connecting {what} failed and the store is unreachable "
                             f"(its host is gone): {error}")
    if cause is not None and statuses[cause].final:
        kind = MeshMismatchError if statuses[cause].kind == "MeshMismatchError" else RankLostError
        return kind(f"on rank {board.rank}: {statuses[cause].describe(cause)}, after agreeing to create "
                    f"{what}, a group it is a member of, {INSIDE_SET_UP}. See that rank's error first")
    if ended:
        return RankLostError(f"on rank {board.rank}: connecting {what} failed: the launcher saw the processes of ranks "
                             f"{ended} end after they agreed to create it, {INSIDE_SET_UP} ({error}). See their logs "
                             "first")
    if cause is not None:
        return RankLostError(f"on rank {board.rank}: connecting {what} failed: {statuses[cause].describe(cause)}, "
                             f"so it cut its groups while this rank still connected this one, {INSIDE_SET_UP} (a "
                             f"member of that collective failed or is lost: see rank {cause}'s error first; {error})")
    if _timed_out(error):
        now = board.current({m: statuses[m] for m in others[:8]})
        doing = "; ".join(status.describe(m) for m, status in now.items())
        return GroupTimeoutError(
            f"on rank {board.rank}: the members of {what} agreed, but did not all connect within the creation "
            f"timeout ({board.creation_timeout.total_seconds():g}s): a member died or hangs ({doing}). See the "
            "logs of the ranks named here")
    return error


def _timed_out(error: Exception) -> bool:
    return isinstance(error, dist.DistStoreError) or "imeout" in str(error) or "timed out" in str(error)
