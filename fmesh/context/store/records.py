"""What the members of a Context write to the store and read back, as typed records: a rank's :class:`Status` (what it
is doing: running, waiting at a group, failed, closed, ...) and a meeting's :class:`Verdict` (how it ended: ``ok``, a
mismatch, a member lost, a timeout, ...), with the recovery's own outcome (:class:`RecoveryOutcome`) and the lost set
its first survivor fixes (:class:`LossClaim`), and what the survivors of a failed group conclude
(:class:`Conclusion`). Each record is written in the same bytes as the JSON or text it
replaced, so a store's traffic is what it was; an unreadable one reads as an ``unknown`` status (a rank that posts
garbage is not trusted to be waiting anywhere).

>>> Status.loads(Status(WAITING, at="k", what="tp (2, 3)").dumps()) == Status(WAITING, at="k", what="tp (2, 3)")
True
>>> Verdict.loads(Verdict(MISMATCH, "ranks disagree").dumps())
Verdict(kind='mismatch', message='ranks disagree')
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

# A rank's states.
RUNNING = "running"  # it works: not creating a group (``after``: the last group it created)
WAITING = "waiting"  # it waits at an agreement (``at``: its key; ``what``: the group's short name)
FAILED = "failed"  # it raised (``error``, ``kind``; ``refused``: it refused a collective on itself)
CLOSED = "closed"  # it closed (or aborted) its context
EXITED = "exited"  # its process ended (at interpreter exit) without closing its context
# Its heartbeat stood still (``error``: for how long), as a peer's watch saw it: its process was killed (SIGKILL, the
# out-of-memory killer), crashed, or is frozen. Posted by that peer on its behalf (:meth:`~fmesh.context.store.board.
# Board.silent`): a process that dies that way posts nothing itself.
SILENT = "silent"
# It came to recover (ctx.recover) without the lost ranks its status names. It never comes to a group, a collective
# or a roll call of this context again, but it is alive: a peer blocked with it is told to recover too, never that
# it is gone.
RECOVERING = "recovering"
# A collective failed on this rank, which is calling the roll of its group to explain it (it raises then, and posts
# ``failed``): not blocked, so a recovery does not cut its groups to free it.
FAILING = "failing"
# It agreed to create a group (``what``) and is inside torch's set-up of it, connecting its members (read, never
# posted: its status still says it waits at that agreement, whose verdict is written). Alive and busy for as long as
# the backend's connect takes: for gloo, after a loss, five connect timeouts (fmesh.context.set_up.set_up_bound).
SETTING_UP = "setting up"
MISSING = "missing"  # it never posted a status (read, never posted)
UNKNOWN = "unknown"  # what it posted cannot be read (read, never posted)
FINAL_STATES = (FAILED, CLOSED, EXITED, SILENT)  # a member in one of these will never come: a wait for it ends at once
GONE_STATES = (CLOSED, EXITED, SILENT)  # a member in one of these is gone (a failed one may have caught it and gone on)

# A meeting's verdicts.
OK = "ok"
MISMATCH = "mismatch"  # the members disagree
LOST = "lost"  # a member failed instead of coming
TIMEOUT = "timeout"  # members never came within the creation timeout
ENDED = "ended"  # a member ended with no error instead of coming (it has no error to see)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


@attrs.frozen
class Status:
    """What one rank posts about itself; read with :meth:`loads`, told with :meth:`describe`.

    >>> Status(CLOSED, aborted=True).describe(3)
    'rank 3 aborted its context'
    """

    state: str
    at: str | None = None  # waiting: the key of the agreement it waits at
    what: str | None = None  # waiting: the group's short name; failing: the collective that failed
    aborted: bool | None = None  # closed: whether it aborted
    error: str | None = None  # failed, closed after failing, exited on an uncaught exception: the error
    kind: str | None = None  # failed: the error's class name
    refused: bool = False  # failed: it refused a collective on itself, before sending any of it
    agreed: tuple[str, ...] = ()  # closed: the last groups it agreed on (descriptions)
    lost: tuple[int, ...] | None = None  # recovering: the ranks it recovers without
    after: str | None = None  # running (read back, :func:`fmesh.context.store.board.Board.current`): its last group

    @property
    def final(self) -> bool:
        """Whether a rank in this state will never come (it failed, closed or exited)."""
        return self.state in FINAL_STATES

    def waits_at(self, key: str) -> bool:
        """Whether the rank waits at the agreement ``key``."""
        return self.state == WAITING and self.at == key

    @property
    def lost_text(self) -> str:
        """The ranks it recovers without, as a list (``"?"`` where none were posted)."""
        return "?" if self.lost is None else str(list(self.lost))

    def dumps(self) -> str:
        """The JSON posted: the state, then each field it has, in the order of the fields."""
        fields: dict[str, Any] = {"state": self.state}
        for name in ("at", "what", "aborted", "error", "kind"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.refused:
            fields["refused"] = True
        if self.agreed:
            fields["agreed"] = list(self.agreed)
        if self.lost is not None:
            fields["lost"] = list(self.lost)
        if self.after is not None:
            fields["after"] = self.after
        return json.dumps(fields)

    @classmethod
    def loads(cls, raw: bytes | str) -> Status:
        """The status in ``raw``; :data:`UNKNOWN` where it cannot be read.

        >>> Status.loads(b"{not json").state
        'unknown'
        """
        try:
            value = json.loads(raw)
            if not isinstance(value, dict):
                return cls(UNKNOWN)
            lost = value.get("lost")
            return cls(str(value.get("state", UNKNOWN)), _text(value.get("at")), _text(value.get("what")),
                       None if value.get("aborted") is None else bool(value["aborted"]), _text(value.get("error")),
                       _text(value.get("kind")), bool(value.get("refused")),
                       tuple(str(d) for d in value.get("agreed", ())),
                       None if lost is None else tuple(int(r) for r in lost), _text(value.get("after")))
        except (ValueError, TypeError, UnicodeDecodeError):
            return cls(UNKNOWN)

    def describe(self, rank: int) -> str:
        """One line saying what ``rank`` was last doing.

        >>> Status(RUNNING).describe(3)
        'rank 3 is not creating a group (busy elsewhere, or it took another path)'
        """
        if self.state == WAITING:
            return f"rank {rank} waits to create {self.what or '?'}"
        if self.state == FAILED:
            return f"rank {rank} failed: {self.error or '?'}"
        if self.state == CLOSED:
            failure = f" after it failed: {self.error}" if self.error else ""
            return f"rank {rank} {'aborted' if self.aborted else 'closed'} its context{failure}"
        if self.state == EXITED:
            failure = f" after an uncaught {self.error}" if self.error else ""
            return (f"rank {rank} exited without closing its Context{failure} (its process ended: it returned from "
                    "main, called sys.exit or raised; close the Context, or use `with fmesh.Context(...) as ctx:`)")
        if self.state == SILENT:
            return (f"rank {rank} is gone: its heartbeat stood still for {self.error or '?'} (its process was killed, "
                    "crashed, or is frozen)")
        if self.state == RECOVERING:
            return (f"rank {rank} is recovering without the lost ranks {self.lost_text} (it called "
                    f"ctx.recover({self.lost_text}))")
        if self.state == FAILING:
            return f"rank {rank} saw {self.what or 'a collective'} fail and calls the roll of its group"
        if self.state == SETTING_UP:
            return (f"rank {rank} is inside torch's set-up of {self.what or '?'}, connecting its members (it agreed "
                    "to create it)")
        if self.state == RUNNING:
            after = f", having created {self.after}" if self.after else ""
            return f"rank {rank} is not creating a group{after} (busy elsewhere, or it took another path)"
        return f"rank {rank} never posted a status (its context did not start, or it crashed)"


@attrs.frozen
class Verdict:
    """How a meeting ended: :data:`OK`, or another kind with a message (written ``kind`` and the message on the
    next line).

    >>> Verdict.loads(b"ok"), Verdict.loads(b"timeout\\nranks [3] never came").message
    (Verdict(kind='ok', message=''), 'ranks [3] never came')
    """

    kind: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == OK

    def dumps(self) -> str:
        return f"{self.kind}\n{self.message}" if self.message else self.kind

    @classmethod
    def loads(cls, raw: bytes | str) -> Verdict:
        kind, _, message = (raw.decode() if isinstance(raw, bytes) else raw).partition("\n")
        return cls(kind, message)


@attrs.frozen
class LossClaim:
    """The ranks a survivor recovers without, and who it is: the first survivor's claim is the one that stays.

    >>> LossClaim.loads(LossClaim((3,), 0).dumps())
    LossClaim(lost=(3,), by=0)
    """

    lost: tuple[int, ...] | None
    by: int | None

    def dumps(self) -> str:
        return json.dumps({"lost": None if self.lost is None else list(self.lost), "by": self.by})

    @classmethod
    def loads(cls, raw: bytes | str) -> LossClaim:
        try:
            value = json.loads(raw)
            lost = value.get("lost")
            return cls(None if lost is None else tuple(int(r) for r in lost),
                       None if value.get("by") is None else int(value["by"]))
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
            return cls(None, None)

    def lost_list(self) -> list[int] | None:
        return None if self.lost is None else list(self.lost)


@attrs.frozen
class RecoveryOutcome:
    """How a recovery's vote ended, other than ``ok``: survivors ``gone`` (``doing``: what they were last doing;
    ``timeout``: they did not come in time), or a disagreement with ``rank``, which recovers without ``lost``
    (``alive``: it was called lost, and came).

    >>> RecoveryOutcome.loads(RecoveryOutcome(gone=(2,), doing="rank 2 closed its context").dumps()).gone
    (2,)
    """

    gone: tuple[int, ...] | None = None
    doing: str = ""
    timeout: bool = False
    rank: int | str | None = None
    lost: object = None
    alive: bool = False

    def dumps(self) -> str:
        if self.gone is not None:
            return json.dumps({"gone": list(self.gone), "doing": self.doing, **({"timeout": True} if self.timeout
                                                                                else {})})
        return json.dumps({"rank": self.rank, "lost": self.lost, **({"alive": True} if self.alive else {})})

    @classmethod
    def loads(cls, raw: bytes | str) -> RecoveryOutcome:
        value = json.loads(raw)
        if "gone" in value:
            return cls(gone=tuple(int(r) for r in value["gone"]), doing=str(value.get("doing", "")),
                       timeout=bool(value.get("timeout")))
        return cls(rank=value.get("rank"), lost=value.get("lost"), alive=bool(value.get("alive")))


@attrs.frozen
class Conclusion:
    """What the survivors of one failed group conclude, written once by the first to conclude and adopted by every
    other (:func:`fmesh.context.failures.failed`): the error's class name (``kind``), its message past "on rank R:
    WHAT along WHERE" (``text``), whether it quotes each rank's backend error after it (``quotes``), and the rank that
    concluded (``by``). One verdict per failed group: survivors that read the board at different moments (a member's
    status changed, the launcher marked it, one's collective had waited out the timeout) raise the same error.

    >>> Conclusion.loads(Conclusion("RankLostError", "failed: ranks [2] of the group are gone", True, 0).dumps())
    Conclusion(kind='RankLostError', text='failed: ranks [2] of the group are gone', quotes=True, by=0)
    """

    kind: str
    text: str
    quotes: bool = False
    by: int = -1

    def dumps(self) -> str:
        return json.dumps({"kind": self.kind, "text": self.text, "quotes": self.quotes, "by": self.by})

    @classmethod
    def loads(cls, raw: bytes | str) -> Conclusion:
        """The conclusion in ``raw``; ``kind`` empty where it cannot be read (the reader concludes on its own)."""
        try:
            value = json.loads(raw)
            return cls(str(value["kind"]), str(value["text"]), bool(value.get("quotes")), int(value.get("by", -1)))
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
            return cls("", "")


def ranks_of(raw: bytes) -> set[int]:
    """The ranks of a list the store appends to (``"3,7,"``).

    >>> sorted(ranks_of(b"3,7,3,"))
    [3, 7]
    """
    return {int(r) for r in raw.decode().split(",") if r}


def rank_list(ranks: Iterable[int]) -> str:
    """What a rank appends to such a list.

    >>> rank_list([3])
    '3,'
    """
    return "".join(f"{rank}," for rank in ranks)


def options_differ(mine: Mapping[str, str], theirs: Mapping[str, object], here: str = "here",
                   there: str = "there") -> list[str]:
    """The fields of two records of a context's options (:func:`~fmesh.context.options.wire_options`) that differ,
    as ``name: this rank's value here, theirs there`` (``here``, ``there``: how the two ranks are named).

    >>> options_differ({"check_tensors": "True"}, {"check_tensors": "False"})
    ['check_tensors: True here, False there']
    """
    return [f"{name}: {mine.get(name, 'unset')} {here}, {theirs.get(name, 'unset')} {there}"
            for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]

