"""The survivors' vote on a recovery: every survivor posts the ranks it recovers without and the groups it holds,
and they go on together only when they all mean the same lost ranks (:func:`agree_on_loss`).

A constant number of store operations and bytes per survivor and group it holds, whatever the world size (the last
one also fences each lost rank): it claims its place (``fate/<rank>``), compares its lost set with the first
survivor's (a :class:`~fmesh.context.store.meeting.Meeting` on ``lost``), says it came, counts itself in each group's
counter and in the meeting, blocks once on the verdict, then reads its groups' counters in one ``multi_get``
(reading every survivor's post instead grew as N² bytes through the store: 46 GB at 16,384 ranks, by
``bench/scale.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import attrs
import torch.distributed as dist

from fmesh.context.store.board import Board, absent, read_list
from fmesh.context.store.meeting import Meeting, watches
from fmesh.context.store.records import (
    FAILING,
    FINAL_STATES,
    GONE_STATES,
    MISSING,
    OK,
    RECOVERING,
    LossClaim,
    RecoveryOutcome,
    Verdict,
    rank_list,
    ranks_of,
)
from fmesh.context.store.wait import ABORT_NOTICE_SECONDS
from fmesh.errors import RecoveryError

SURVIVOR = "survivor"  # a rank's fate in a recovery: it came to recover (it claims this itself)
FENCED = "fenced"  # a rank's fate in a recovery: the survivors recover without it (the last of them fences it out)
# How long a survivor that came to recover waits for the others before it cuts the groups it shares with one that
# has not come and is not on its way (it neither failed nor is failing): that one may be blocked in a collective with
# this rank (:func:`agree_on_loss`).
SEVER_GRACE_SECONDS = 2.0
# How long the last survivor to agree on a recovery waits for a rank called lost, not known to be gone, to show
# it is alive by coming to recover too (two halves of a world calling each other lost come within milliseconds
# of each other) before fencing it out of the new world.
ALIVE_GRACE_SECONDS = 2.0
# How the last survivor to come to a recovery closes the list of groups cut while it waited (``.../cut``): a survivor
# that finds the list closed cuts nothing more (what the survivors renew is read from the closed list).
CLOSED_LIST = "#"


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


def _meeting(board: Board, survivors: Sequence[int]) -> Meeting:
    return Meeting(board.store, board.keys.recovery, len(survivors))


def post_loss(board: Board, lost: Sequence[int], groups: Sequence[str], survivors: Sequence[int] = ()) -> int:
    """Post the ranks this survivor recovers without, and the digests of the groups it holds; claim this
    rank's own place (``fate/<rank>``: a survivor); the first survivor to post fixes the lost set. A survivor
    that means another set writes the outcome (a mismatch) at once, and one that the survivors of another set
    already fenced out is refused: both get :class:`~fmesh.RecoveryError`. One that agrees counts itself;
    this returns the count (the last to count fences the lost ranks out and writes ``ok``:
    :func:`agree_on_loss`)."""
    keys, meeting = board.keys, _meeting(board, survivors)
    mine = sorted(lost)
    # This rank's claim carries the set it recovers without: the last survivor reads it where it fences. It comes
    # before the rank says it came (``called``), so a lost rank that came has claimed its place, or was refused.
    claim = f"{SURVIVOR}\n{json.dumps(mine)}"
    fate = board.store.compare_set(keys.fate(board.rank), "", claim).decode()
    # The set and who fixed it, in one value: compare_set hands back the first survivor's, whoever posts later.
    first = LossClaim.loads(meeting.compare(LossClaim(tuple(mine), board.rank).dumps()))
    if fate != claim:  # the survivors of another set agreed and fenced this rank out before it came
        raise RecoveryError(
            f"on rank {board.rank}: this rank came to recover without {mine}, but the survivors that recover "
            f"without {first.lost_list()} had already fenced it out of their world: they went on without it. "
            "Expected the survivors to agree on the ranks lost; take them from one source (the launcher's, or "
            "the roll call of the failed collective), and end this rank")
    board.store.append(keys.came_to_recover, rank_list([board.rank]))
    if first.lost_list() != mine:  # another set is fixed: this rank can never be in its world
        meeting.decide(RecoveryOutcome(rank=board.rank, lost=mine).dumps())
        _raise_disagreement(board, mine)
    for group in groups:  # how many survivors hold each group: one counter per group, a few bytes whatever N
        board.store.add(keys.held(group), 1)
    return meeting.arrive(complete=None)


def agree_on_loss(board: Board, survivors: Sequence[int], lost: Sequence[int],
                  groups: Sequence[str | HeldGroup]) -> dict[str, int]:
    """Post ``lost`` and ``groups`` (:func:`post_loss`), wait for every one of ``survivors`` to post theirs,
    and return, for each of this rank's ``groups`` (by digest; a :class:`HeldGroup` also says how to cut it), how
    many survivors hold it (a group is kept only where every surviving member holds it; one a survivor cut while
    it waited counts as held by none).

    :class:`~fmesh.RecoveryError` as soon as one posts other lost ranks (naming both sets), or a rank called
    lost shows it is alive (it comes to recover too: the ranks split into two worlds, each calling the other
    lost), or a survivor's process ended or it closed its context (its status, or the launcher's mark), or one
    has not come within the creation timeout (or, one alive inside torch's set-up of a group then, within
    ``board.set_up_seconds`` more: how long that set-up may take to fail). Two survivor sets never both go
    on: the last survivor to come *fences* each lost rank out (``compare_set`` of its ``fate`` key, which the rank
    itself claims when it comes) before writing ``ok``, after giving a lost rank not known to be gone
    :data:`ALIVE_GRACE_SECONDS` to show it is alive; a fenced rank that comes later is refused.

    A survivor that has not come may be blocked in a collective with one that has (on a ``(dp, tp)`` mesh rank 3
    dies, rank 2 recovers, rank 0 waits for rank 2 in a dp all_reduce): past :data:`SEVER_GRACE_SECONDS`, each
    survivor that came cuts the connections of every :class:`HeldGroup` of ``groups`` (with its members and torch
    name) that a missing survivor which neither failed nor is failing belongs to
    (:meth:`~fmesh.context.store.connections.Connections.sever`), so that survivor's collective fails at once, and it
    is told to recover too (this rank's status says it recovers); the groups cut are made anew (the last to come
    closes the list of them, and writes it with ``ok``).

    A store that cannot be reached (its host was among the lost) is one ``RecoveryError`` saying so and what to do."""
    try:
        return _agree_on_loss(board, survivors, lost, [g if isinstance(g, str) else g.digest for g in groups],
                              [g for g in groups if isinstance(g, HeldGroup)])
    except dist.DistError as error:
        raise RecoveryError(
            f"on rank {board.rank}: the survivors cannot agree to recover without {sorted(lost)}: the store they "
            f"meet in is unreachable, so its host (rank 0 of a tcp:// or env:// start) is lost with them ("
            f"{error}). A lost store host cannot be recovered in place: restart the job from its checkpoint, and "
            "host the store outside the ranks (fmesh.launch, torchrun's agent, or a TCPStore server process of "
            "its own) to recover in place next time") from None


def _agree_on_loss(board: Board, survivors: Sequence[int], lost: Sequence[int], groups: Sequence[str],
                   held: Sequence[HeldGroup]) -> dict[str, int]:
    meeting = _meeting(board, survivors)
    count = post_loss(board, lost, groups, survivors)
    # A peer blocked with this rank is told to recover, not that it died.
    board.post(RECOVERING, lost=tuple(sorted(lost)))
    if count >= len(survivors):
        _fence(board, meeting, sorted(lost))
    cut: set[str] = set()  # the groups this rank cut while it waited
    arrived = time.monotonic()
    looked: list[bool] = []  # whether this watcher looked before (then the list of finals exists)

    def look() -> bool:  # every survivor frees those blocked with it; the first two watch for those that ended
        if held and time.monotonic() - arrived >= SEVER_GRACE_SECONDS:
            _cut_kept_away(board, survivors, held, cut)
        if not watches(count):
            return False
        # Two store operations a look (three the first time), whatever the world size.
        came_here, finals = _came_and_finals(board, both_exist=bool(looked))
        looked.append(True)
        missing = [m for m in survivors if m not in came_here]
        # A survivor whose heartbeat stood still is posted gone (where no launcher marks the dead).
        final = finals.intersection(missing) | set(board.silent(missing))
        # A survivor that failed (its collective raised) is on its way here, or came since the first read; one
        # that closed or exited will never come.
        statuses = board.statuses(sorted(final)) if final else {}
        final = {m for m in final if statuses[m].state in GONE_STATES}
        ended = board.ended([m for m in missing if m not in final])
        gone = sorted({*final, *ended})
        if gone:
            doing = "; ".join(statuses[m].describe(m) if m in final else
                              f"the launcher saw the process of rank {m} end" for m in gone[:8])
            meeting.decide(RecoveryOutcome(gone=tuple(gone), doing=doing).dumps())
        return bool(gone)

    came = meeting.wait(board.waiter, board.creation_timeout.total_seconds(), look,
                        doing="agreeing on the ranks lost")
    if came is None and board.set_up_seconds > 0 and board.setting_up(board.statuses(_not_come(board, survivors))):
        came = meeting.wait(board.waiter, board.set_up_seconds, look, doing="agreeing on the ranks lost")
    if came is None:  # the timeout, unless an outcome came meanwhile
        missing = _not_come(board, survivors)
        doing = "; ".join(s.describe(m) for m, s in board.current(board.statuses(missing[:8])).items())
        meeting.decide(RecoveryOutcome(gone=tuple(missing), doing=doing, timeout=True).dumps())
    raw = came if came is not None else meeting.verdict()
    verdict = Verdict.loads(raw)  # "ok", and the groups cut, if any
    if verdict.kind != OK:
        outcome = RecoveryOutcome.loads(raw)
        if outcome.gone is not None:
            within = (f"within {board.creation_timeout.total_seconds():g}s" if outcome.timeout else
                      "(their processes ended, or they closed their contexts)")
            raise RecoveryError(
                f"on rank {board.rank}: survivors {list(outcome.gone)} did not come to recover without "
                f"{sorted(lost)} {within} ({outcome.doing}). Expected every rank not lost to call recover(); if those "
                "ranks are gone too, recover without them as well")
        _raise_disagreement(board, sorted(lost), outcome)
    if not groups:
        return {}
    counters = board.store.multi_get([board.keys.held(group) for group in groups])
    severed = set(verdict.message.split(","))
    return {group: 0 if group in severed else int(raw) for group, raw in zip(groups, counters, strict=True)}


def _cut_kept_away(board: Board, survivors: Sequence[int], held: Sequence[HeldGroup], cut: set[str]) -> None:
    """Cut the connections of each of ``held`` not cut yet (``cut``, updated) that a survivor which has not come
    belongs to, unless that survivor failed or is failing (it is on its way: a collective failed there) or ended;
    first add them to the recovery's list of groups cut, unless the last survivor to come closed it. A store
    operation per group while every member has come; a few more for a group where one has not."""
    alive = set(survivors)
    waiting: dict[str, list[int]] = {}
    for group in held:
        others = [m for m in group.ranks if m in alive and m != board.rank]
        if group.digest not in cut and others and not board.store.check([board.keys.fate(m) for m in others]):
            waiting[group.digest] = others
    if not waiting:
        return
    missing = absent(board.store, sorted({m for others in waiting.values() for m in others}), board.keys.fate)
    statuses = board.statuses(missing)
    kept_away = {m for m in missing if statuses[m].state not in (*FINAL_STATES, RECOVERING, FAILING)}
    chosen = [digest for digest, others in waiting.items() if kept_away.intersection(others)]
    if not chosen or not _add_cuts(board, chosen):
        return
    for group in held:
        if group.digest in chosen:
            board.connections.sever(group.name)
    cut.update(chosen)


def _add_cuts(board: Board, digests: Sequence[str]) -> bool:
    """Add ``digests`` to the list of groups cut in this recovery; whether it was still open (the last survivor
    to come closes it before writing ``ok``: from then on nothing is cut). A ``compare_set`` loop: what is in
    the list when it closes is what every survivor reads."""
    key = board.keys.cut
    seen = board.store.compare_set(key, "", "").decode()
    while not seen.endswith(CLOSED_LIST):
        wanted = seen + "".join(f"{digest}," for digest in digests)
        now = board.store.compare_set(key, seen, wanted).decode()
        if now == wanted:
            return True
        seen = now
    return False


def _close_cuts(board: Board) -> str:
    """Close the list of groups cut in this recovery (the last survivor to come, before it writes ``ok``), and
    return it (``"d1,d2,"``): one store operation where nobody cut a group."""
    key = board.keys.cut
    seen, now = "", board.store.compare_set(key, "", CLOSED_LIST).decode()
    while now != seen + CLOSED_LIST:
        seen = now
        now = board.store.compare_set(key, seen, seen + CLOSED_LIST).decode()
    return seen


def recovering(board: Board) -> list[int]:
    """The ranks that came to recover, in order (one store operation)."""
    return sorted(read_list(board.store, board.keys.came_to_recover))


def _fence(board: Board, meeting: Meeting, lost: list[int]) -> None:
    """The last survivor to come: wait up to :data:`ALIVE_GRACE_SECONDS` for a rank in ``lost`` that is not
    known to be gone (no final status, no launcher's mark) to come to recover too, then fence each lost rank
    out, and write the outcome: ``ok``, or the disagreement with a lost rank that came (it is alive)."""
    deadline = time.monotonic() + ALIVE_GRACE_SECONDS

    def came() -> list[int]:
        return sorted(set(lost).difference(_not_come(board, lost)))

    statuses = board.statuses(lost)
    unknown = [r for r in lost if statuses[r].state not in (*FINAL_STATES, MISSING)]
    unknown = [r for r in unknown if r not in board.ended(unknown)]
    arrived = came()
    while unknown and not arrived and time.monotonic() < deadline:
        board.waiter.check_halted("agreeing on the ranks lost")
        time.sleep(ABORT_NOTICE_SECONDS / 2)
        arrived = came()
    fates = {r: board.store.compare_set(board.keys.fate(r), "", FENCED).decode() for r in lost}
    claims = {r: fate for r, fate in fates.items() if fate != FENCED}  # it claimed its place: it is alive
    alive = sorted({*came(), *claims})
    if alive:
        other = alive[0]
        _, _, theirs_raw = claims.get(other, "").partition("\n")
        theirs = json.loads(theirs_raw) if theirs_raw else "?"
        meeting.decide(RecoveryOutcome(rank=other, lost=theirs, alive=True).dumps())
    else:
        cut = _close_cuts(board)  # what the survivors cut while they waited, fixed now, goes with the verdict
        meeting.decide(Verdict(OK, cut).dumps())


def _came_and_finals(board: Board, both_exist: bool) -> tuple[set[int], set[int]]:
    """The survivors that came to recover, and the ranks whose status is final
    (:meth:`~fmesh.context.store.board.Board.finals`): in one store operation where ``both_exist`` (a ``multi_get``
    waits for a missing key), in two the first time (reading the finals makes their list)."""
    came = board.keys.came_to_recover
    if not both_exist:
        return ranks_of(board.store.get(came)), board.finals()
    called, finals = board.store.multi_get([came, board.keys.finals])
    return ranks_of(called), ranks_of(finals)


def _not_come(board: Board, ranks: Sequence[int]) -> list[int]:
    """Those of ``ranks`` that have not come to recover (one store operation)."""
    called = ranks_of(board.store.get(board.keys.came_to_recover))
    return [rank for rank in ranks if rank not in called]


def _raise_disagreement(board: Board, mine: list[int], outcome: RecoveryOutcome | None = None) -> None:
    """:class:`~fmesh.RecoveryError` naming this rank's lost set and another survivor's (from ``outcome``, the
    mismatch written, or the set the first survivor fixed)."""
    first = LossClaim.loads(board.store.get(board.keys.recovery.compared))
    other, theirs = (outcome.rank, outcome.lost) if outcome else ("?", first.lost_list())
    if (outcome is None or other == board.rank or theirs == mine) and first.lost_list() != mine:
        other, theirs = first.by if first.by is not None else "?", first.lost_list()  # who fixed the other set
    alive = (f" (rank {other} is alive: it came to recover too, so the ranks split into worlds that each call "
             "the other lost)") if outcome and outcome.alive else ""
    raise RecoveryError(
        f"on rank {board.rank}: the survivors disagree about the ranks lost: rank {board.rank} says {mine}, rank "
        f"{other} says {theirs}{alive}. Expected every survivor to recover without the same ranks; take them "
        "from one source (the launcher's, or the roll call of the failed collective)")
