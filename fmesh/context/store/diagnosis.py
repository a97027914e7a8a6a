"""A watcher's look into a slow agreement (:mod:`fmesh.context.store.agreement`): why the members that have not
come do not come.

Past the grace period, the first two members to arrive now and then read the statuses of the members (one
``multi_get``) and follow the members that have not arrived to what each is waiting for. A member whose status is
final (it failed, closed or aborted its context, or its process exited without closing it) will never come: the
wait ends with its error (a mismatch stays a mismatch, anything else is :class:`~fmesh.RankLostError`; one that
ended with no error is a mismatch where it made another group along the same axes). A member that recovers never
comes either: the others are told to recover too. A cycle (rank 0 waits here for rank 1, which waits elsewhere for
rank 0) can never complete: it is a disagreement, reported as :class:`~fmesh.MeshMismatchError` on every rank of
the cycle within seconds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import attrs

from fmesh.context.store.board import Board
from fmesh.context.store.records import ENDED, FAILED, LOST, MISMATCH, RECOVERING, WAITING, Status, Verdict

MAX_GROUPS_FOLLOWED = 64  # bounds the work of one search for a cycle

Seen = dict[int, tuple[str, str | None]]  # what a look saw: each member's state and the key it waits at


def ended_instead(member: int, status: Status, mine: str) -> Verdict:
    """The verdict on a group (``mine`` describes it) whose ``member`` ended (``status``) instead of coming to create
    it. One that ended with no error is never "see its error": where it made a group along the same axes as this one
    (the groups it posted when it closed), the ranks made different groups (a mismatch naming it).

    >>> verdict = ended_instead(3, Status("closed", agreed=("Mesh(tp=2); axes ('tp',); ranks (2, 3)",)),
    ...                         "Mesh(tp=2); axes ('tp',); ranks (1, 3)")
    >>> verdict.kind, verdict.message.split(": ", 1)[1].split(";")[0]
    ('mismatch', 'the ranks made different groups along these axes')
    """
    if status.error or status.aborted or status.state == FAILED:
        kind = MISMATCH if status.kind == "MeshMismatchError" else LOST
        return Verdict(kind, f"{status.describe(member)}, instead of creating this group (a member of it)")
    ended = f"{status.describe(member)}, with no error, never having come to create this group (a member of it)"
    axes = re.search(r"; axes \([^)]*\);", mine)
    other = [d for d in status.agreed if axes and axes.group() in d and d != mine[:300]]
    if other:
        return Verdict(MISMATCH, f"{ended}: the ranks made different groups along these axes; it made {other[-1]}, "
                                 f"and this rank means {mine}")
    return Verdict(ENDED, f"{ended}: it took another path than this rank (check the code each rank ran)")


@attrs.frozen
class Look:
    """A watcher's looks into the slow agreement at ``key`` (``description``: what this rank means by it), and what
    each saw: a cycle never moves, so it is looked for only when the members stand where the previous look saw
    them. While they move (a slow start, where each member works through its agreements), a look costs two reads
    (the members' statuses, and the launcher's list of processes that ended)."""

    board: Board
    key: str
    members: Sequence[int]
    description: str
    looks: list[Seen] = attrs.field(factory=list, eq=False)
    posted: set[int] = attrs.field(factory=set, eq=False)  # members whose status a look found (not checked again)

    def look(self) -> bool:
        """One look (the verdict it finds is written to the store, which ends the wait); never stops the wait
        itself."""
        seen = diagnose(self.board, self.key, self.members, self.description, publish=not self.looks,
                        search=lambda now: bool(self.looks) and now == self.looks[-1], posted=self.posted)
        self.looks.append(seen)
        return False


def diagnose(board: Board, key: str, members: Sequence[int], description: str, publish: bool = True,
             search: Callable[[Seen], bool] | None = None, posted: set[int] | None = None) -> Seen:
    """The slow path: publish this group's members (at the first look), then look for a member that failed
    or a cycle (only where ``search``, given each member's state and key now, says so; always without it).
    Each member's state and key, as read. ``description``: what this rank means by the group; ``posted``: the
    members known to have posted a status (:meth:`~fmesh.context.store.board.Board.statuses`)."""
    meeting = board.keys.agreement(key)
    if publish:
        board.store.set(board.keys.members(key), json.dumps(list(members)))
    board.silent(members)  # a member whose heartbeat stood still is posted gone (no launcher may mark it)
    statuses = board.statuses(members, posted)
    seen = {member: (status.state, status.at) for member, status in statuses.items()}
    for member in members:
        status = statuses[member]
        if status.final and member != board.rank:
            board.store.compare_set(meeting.verdict, "", ended_instead(member, status, description).dumps())
            return seen
        if status.state == RECOVERING and member != board.rank:  # alive, but never comes: it recovers
            board.store.compare_set(meeting.verdict, "", Verdict(ENDED, (
                f"{status.describe(member)}, instead of creating this group (a member of it): ranks "
                f"{status.lost_text} are lost; call ctx.recover({status.lost_text}) on this rank too")).dumps())
            return seen
    ended = [m for m in board.ended(members) if m != board.rank]  # killed: the launcher saw its process end
    if ended:
        board.store.compare_set(meeting.verdict, "", Verdict(LOST, (
            f"the launcher saw the process of rank {ended[0]} end (it was killed, or crashed) instead of creating "
            "this group (a member of it)")).dumps())
        return seen
    if search is not None and not search(seen):
        return seen
    cycle = find_cycle(board, key, members, statuses)
    if cycle and still_stuck(board, cycle):
        # What each group on the cycle means (the first member's description, beside its digest): a status
        # carries the group's short name only.
        meant = {str(status.at): first_meaning(board, str(status.at)) for _, status in cycle}
        lines = [f"{status.describe(rank)} ({meant[str(status.at)]})" for rank, status in cycle]
        verdict = Verdict(MISMATCH, f"ranks disagree about the meshes: they wait for each other in a cycle, each to "
                                    f"create a group the next one does not create: {'; '.join(lines)}").dumps()
        for _, status in cycle:
            board.store.compare_set(board.keys.agreement(str(status.at)).verdict, "", verdict)
    return seen


def first_meaning(board: Board, key: str) -> str:
    """What the first member to come to the group at ``key`` means by it (its description, kept beside the
    digest), or "?" where none came yet."""
    kept = board.keys.agreement(key).compared
    return board.store.get(kept).decode().partition("\n")[2] if board.store.check([kept]) else "?"


def still_stuck(board: Board, cycle: list[tuple[int, Status]]) -> bool:
    """Whether a cycle found in statuses read at different moments is real: no group on it is done, before and
    after each rank on it is read again, and each still waits where it did. A real cycle never moves; a reading
    that a slow look made while the groups completed does (at 1,024 simulated ranks on a loaded machine, such a
    reading once ended a correct start in false mismatches)."""
    done = [board.keys.agreement(str(status.at)).verdict for _, status in cycle]

    def any_done() -> bool:
        return any(board.store.check([key]) for key in done)

    if any_done():
        return False
    now = board.statuses([rank for rank, _ in cycle])
    moved = any(now[rank].state != WAITING or now[rank].at != status.at for rank, status in cycle)
    return not moved and not any_done()


def find_cycle(board: Board, start: str, members: Sequence[int],
               statuses: dict[int, Status]) -> list[tuple[int, Status]]:
    """A cycle of waiting ranks through ``start``, as ``(rank, status)``; empty if none is known."""
    me = statuses[board.rank] if board.rank in statuses else board.statuses([board.rank])[board.rank]
    stack: list[tuple[str, Sequence[int], dict[int, Status], list[tuple[int, Status]]]] = [
        (start, members, statuses, [(board.rank, me)])
    ]
    seen = {start}
    while stack and len(seen) <= MAX_GROUPS_FOLLOWED:
        key, group, known, path = stack.pop()
        for member in group:
            status = known[member]
            if status.state != WAITING or status.at == key:
                continue  # arrived here, or not waiting for any group
            elsewhere = str(status.at)
            if elsewhere == start:
                return [*path, (member, status)]
            if elsewhere in seen:
                continue
            seen.add(elsewhere)
            if board.store.check([board.keys.agreement(elsewhere).verdict]):
                continue  # its verdict is written: the member went on past it (its status stays "waiting at")
            listed = board.keys.members(elsewhere)
            if not board.store.check([listed]):
                continue  # its members have not been published yet: look again next round
            others = [int(r) for r in json.loads(board.store.get(listed).decode())]
            stack.append((elsewhere, others, board.statuses(others), [*path, (member, status)]))
    return []

