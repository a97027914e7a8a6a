"""The roll call: the survivors of a failed collective each answer what went wrong for them, and learn which members
did not answer (:func:`roll_call`), and what each that did answered (:func:`answers`).

A constant number of store operations per member, whatever the number of members: each answers, adds its rank to
the list of those who answered, counts itself (the last to answer writes the outcome, :class:`~fmesh.context.store.
meeting.Meeting`) and blocks once on the outcome key. The first two to answer watch, past a second and then at
doubling intervals, for members that will never answer (their status is final, or the launcher saw their process
end: a few store operations a look, :meth:`~fmesh.context.store.board.Board.finals`,
:meth:`~fmesh.context.store.board.Board.ended`); they write the outcome then, or at the deadline: the members that
did not answer.

>>> from datetime import timedelta
>>> import torch.distributed as dist
>>> board = Board(dist.HashStore(), "doc", 0, timedelta(seconds=1))
>>> roll_call(board, "alone", [0], 1.0), answers(board, "alone", [0])
([], {0: 'here'})
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fmesh.context.store.board import Board
from fmesh.context.store.meeting import Meeting, watches
from fmesh.context.store.records import ranks_of
from fmesh.context.store.wait import ABORT_NOTICE_SECONDS


def roll_call(board: Board, label: str, members: Sequence[int], seconds: float, answer: str = "here") -> list[int]:
    """The ``members`` that do not answer within ``seconds`` (the survivors of a failed collective each call this
    with the same ``label``, answering what went wrong for them: :func:`answers`)."""
    keys = board.keys
    meeting = Meeting(board.store, keys.roll_call(label), len(members))
    board.store.set(keys.answer(label, board.rank), answer[:2000])
    board.store.append(keys.answered(label), f"{board.rank},")
    count = meeting.arrive("[]")

    def silent() -> list[int]:
        answered = ranks_of(board.store.get(keys.answered(label)))
        return [m for m in members if m not in answered]

    def look() -> bool:  # two or three store operations, whatever the number of members
        quiet = silent()
        final = board.finals() if quiet else set()
        alive = [m for m in quiet if m not in final]
        gone = not alive or len(board.ended(alive)) == len(alive)
        if gone:  # every member that has not answered failed, closed, or its process ended: none ever will
            meeting.decide(json.dumps(quiet))
        return gone

    watcher = watches(count)
    came = meeting.wait(board.waiter, seconds if watcher else seconds + 2 * ABORT_NOTICE_SECONDS,
                        look if watcher else None, f"calling the roll of {label}")
    if came is None:  # the deadline: the watcher writes who is silent (unless an outcome came meanwhile)
        meeting.decide(json.dumps(silent()))
    return [int(m) for m in json.loads((came if came is not None else meeting.verdict()).decode())]


def answers(board: Board, label: str, members: Sequence[int]) -> dict[int, str]:
    """What each of ``members`` answered the roll call ``label`` (each has answered)."""
    keys = [board.keys.answer(label, m) for m in members]
    return {m: bytes(raw).decode(errors="replace") for m, raw in zip(members, board.store.multi_get(keys),
                                                                      strict=True)}
