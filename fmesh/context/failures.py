"""What a failed collective means, told on every member: the caller's own error, a peer that refused the same
call, a mesh mismatch passed on, a timeout, ranks gone (named through a roll call), or what each member saw.

What torch or its backend refuses on this rank before any byte is sent (:func:`callers_error`: a bad argument, a
tensor NCCL cannot take, an op the backend lacks) is the caller's error, raised unchanged. When every member refused
the same call (:func:`refused_together`), the group is as healthy as before and the next collective on it works;
when a member refused alone, the others are blocked in the collective: it frees them (cuts and aborts the group)
and posts its error, which they name within seconds, instead of leaving them to wait out the timeout. Any other
failure in eager is explained before it is raised (:func:`failed`): the survivors hold a roll call through
the store (:mod:`fmesh.context.store.roll_call`), and the ranks that do not answer are named. A peer that failed
with an error of fmesh's own passes it on (a mesh mismatch on one rank is a mismatch on all); a backend error after
the group's timeout is :class:`~fmesh.GroupTimeoutError`; one with members gone is
:class:`~fmesh.RankLostError`; with every member present, a ``RuntimeError`` quoting what each member saw
(a bad tensor on one rank is named there; its healthy peers are not blamed). One verdict per failed group: the first
survivor to conclude writes its conclusion to the store (:class:`~fmesh.context.store.records.Conclusion`), and every
other survivor of that group raises it too, however the board looked when it read it. The first survivor to fail
cuts the group's connections (:mod:`fmesh.context.store.connections`), so members still blocked in it fail
at once and answer the roll call. A group that failed is aborted: using it again is
:class:`~fmesh.RankLostError` at once; in a context aborted meanwhile, :class:`~fmesh.ContextClosedError`.
Collectives fmesh did not run (FSDP's, DTensor's, raw ``torch.distributed`` calls) are explained the same way
inside :func:`guarded`.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.groups import Target, usable
from fmesh.context.store.board import Board
from fmesh.context.store.records import FAILED, FAILING, GONE_STATES, RECOVERING, Conclusion, Status
from fmesh.context.store.recovery_vote import recovering as recovering_ranks
from fmesh.context.store.roll_call import answers as roll_answers
from fmesh.context.store.roll_call import roll_call
from fmesh.errors import ContextClosedError, GroupTimeoutError, MeshMismatchError, RankLostError, TensorMismatchError

NO_STATUS = Status("unknown")  # what a rank the store could not be asked about posted, as far as this rank knows
# A backend error raised after this share of the group's timeout is that timeout.
TIMED_OUT_SHARE = 0.9
# How long the survivors of a failed collective wait for each other to answer the roll call.
ROLL_CALL_SECONDS = 5.0
# What torch and its backends raise on this rank when they refuse a collective before sending any byte of it
# (regular expressions, searched in the first line of a RuntimeError's message; TypeError and ValueError are the
# caller's on a live group whatever they say): the caller's error, never a group failure (:func:`callers_error`).
LOCAL_REFUSALS: tuple[str, ...] = (
    # ProcessGroupNCCL.cpp, check_gpu_single_tensor and check_gpu_tensors_same_device, before the NCCL call
    r"Tensors must be CUDA and dense",
    r"Tensors must be contiguous",
    r"Tensor list must be nonempty",
    r"Tensors must have identical type",
    r"Tensors must be non-overlapping and dense",
    r"Expected list of tensors on the same device",
    # ProcessGroupNCCL.cpp, getNcclDataType: a dtype NCCL lacks (torch 2.4 and later's message, then older torch's)
    r"data type is not supported for NCCL process group",
    r"Unsupported data type for NCCL process group",
    # an op the backend or the dtype lacks: ProcessGroupNCCL.cpp getNcclReduceOp ("... with NCCL", "... with boolean
    # inputs"), ProcessGroupGloo.cpp ("... with Gloo", "... with non-integral dtype")
    r"Cannot use ReduceOp\.\w+ with ",
    # ProcessGroup.hpp, getBackend: the group has no backend for the tensor's device (a CPU tensor on an NCCL group)
    r"No backend type associated with device type",
    # ProcessGroupGloo.cpp, invalidArgument: "ProcessGroupGloo::<collective>: " and the check of c10d/Utils.hpp that
    # failed (assertNonEmpty, assertRootRank, assertTypeMatch, assertSizesMatch, assertDense, ...; "unsupported
    # layout", "unsupported reduction operation"), all before the work is queued; and send's single-tensor check.
    r"^ProcessGroupGloo::\w+(: | takes a single tensor)",
    # ProcessGroupGloo.cpp, GENERATE_ALL_TYPES: a dtype gloo cannot reduce (int16), met while the work is made, before
    # it sends: one rank's odd dtype shows so; that rank frees its peers, which name it (refused_together)
    r"^Invalid scalar type",
)
# How long a member that refused a collective on itself waits for the others to refuse it too (they do at once when
# every rank runs the same program on the same kind of tensor) before it takes them for blocked in the collective.
REFUSAL_GRACE_SECONDS = 2.0
# The errors a failed collective's survivors conclude, besides fmesh's RuntimeError that every member answered.
EXPLAINED: tuple[type[Exception], ...] = (RankLostError, GroupTimeoutError, MeshMismatchError, TensorMismatchError)
CONCLUDED = frozenset(kind.__name__ for kind in (*EXPLAINED, RuntimeError))
_REFUSED = re.compile("|".join(f"(?:{pattern})" for pattern in LOCAL_REFUSALS))
# What a backend says when a peer is gone, in a collective fmesh did not run (FSDP's, DTensor's, a raw dist call):
# gloo's transport (gloo/transport/tcp/pair.cc: a closed or reset connection, a read or write error, its timeout),
# and NCCL's (ProcessGroupNCCL: a remote or system error, an aborted communicator, the watchdog's timeout). A
# torch.distributed.DistError is one whatever it says.
PEER_FAILURES: tuple[str, ...] = (
    r"Connection closed by peer",
    r"Connection reset by peer",
    r"\bRead error\b",
    r"\bWrite error\b",
    r"Timed out waiting .* for recv operation",
    r"ncclRemoteError|ncclSystemError|ncclInternalError",
    r"NCCL communicator was aborted",
    r"Watchdog caught collective operation timeout",
)
_PEER_FAILED = re.compile("|".join(f"(?:{pattern})" for pattern in PEER_FAILURES))



def callers_error(error: BaseException, group_is_live: bool) -> bool:
    """Whether a collective's ``error`` is the caller's: torch or its backend refused the call on this rank before any
    byte was sent, so the group is as healthy as before and :func:`failed` raises ``error`` unchanged (no connection
    cut, no abort, no roll call, no failed status).

    That is torch's refusal of the call itself (``NotImplementedError``, no kernel for the tensor), on any group; and
    on a live group (still registered, its context not aborted) a ``TypeError`` or ``ValueError`` (torch's checks of
    the arguments; a group aborted meanwhile raises ``ValueError`` too, so not there), or a ``RuntimeError`` whose
    first line matches one of :data:`LOCAL_REFUSALS`. A ``torch.distributed.DistError`` (the backend's, the store's,
    the network's) is the group's, whatever it says.

    >>> callers_error(RuntimeError("Tensors must be contiguous"), group_is_live=True)
    True
    >>> callers_error(RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:5961"), group_is_live=True)
    False
    >>> callers_error(ValueError("Invalid process group specified"), group_is_live=False)
    False
    """
    if isinstance(error, dist.DistError):
        return False
    if isinstance(error, NotImplementedError):
        return True
    if not group_is_live:
        return False
    if isinstance(error, TypeError | ValueError):
        return True
    return isinstance(error, RuntimeError) and _REFUSED.search(str(error).partition("\n")[0]) is not None


def refused_together(board: Board, process_group: dist.ProcessGroup | None, ranks: tuple[int, ...],
                     error: BaseException) -> bool:
    """Whether every member of the group refused this same call on itself (a roll call, open for
    :data:`REFUSAL_GRACE_SECONDS`, under a label each member counts alike: its n-th refusal on this group). Then
    nothing was sent anywhere and the group is healthy; otherwise the members that did not answer are blocked in
    the collective, waiting for this rank."""
    group = "world" if process_group is None else process_group.group_name
    count = board.store.add(board.keys.refusals(group, board.rank), 1)
    silent = roll_call(board, f"refused-{group}-{count}", ranks, REFUSAL_GRACE_SECONDS,
                       f"{type(error).__name__}: {error}")
    return not silent


def failed(what: str, target: Target | None, ranks: tuple[int, ...], timeout: timedelta, started: float,
           error: Exception, board: Board | None, process_group: dist.ProcessGroup | None = None) -> NoReturn:
    """Raise what a collective's ``error`` means: see the module docstring. ``board`` is ``None`` on the
    fake backend (no store): then only the timeout is told apart. ``group``, broken now, is aborted
    first, so that members still blocked in it fail at once and answer the roll call too."""
    where = "the default group" if target is None else target.label()
    halted = board is not None and board.connections.halted.is_set()
    if callers_error(error, group_is_live=not halted and usable(process_group, board)):
        if board is None or len(ranks) == 1 or refused_together(board, process_group, ranks, error):
            raise error  # refused on this rank before any byte was sent: the group is as healthy as before
        # Refused here alone: the other members are blocked in the collective. Free them now (cut, abort: the group
        # cannot match its next collective anyway) and tell them why; this rank's own error is the caller's.
        board.failed(error, refused=True)
        if process_group is not None:
            board.connections.sever(process_group.group_name)
            _torch.abort_group(process_group)
        raise error
    if board is not None and halted:
        raise ContextClosedError(f"on rank {board.rank}: {what} along {where} ended: this context was aborted "
                                 "(ctx.abort())") from None
    if process_group is not None and not usable(process_group, board):  # used after an earlier failure
        raise RankLostError(f"on rank {'?' if board is None else board.rank}: {where} failed earlier and was "
                            "aborted then; this context cannot use it again: abort the context and restart, or "
                            "recover onto a mesh without the lost ranks") from None
    if board is not None:  # first, so a member still connecting this group, whose connection the cut below breaks,
        board.post_quietly(FAILING, what=what)  # reads why (connect_failed); and not blocked: a recovery that waits
    if process_group is not None and board is not None:  # for this rank does not cut its groups to free it
        # Cut its connections first: torch's abort of a gloo group releases neither a peer blocked in it nor this
        # rank; with them cut, every member still blocked fails now and answers the roll call. A communicator that
        # can shrink (NCCL >= 2.27) is left for a recovery to shrink (SHRINK_ABORT ends its work; pytorch #194775:
        # the parent of a shrink is aborted after it, never destroyed); any other is aborted now.
        board.connections.sever(process_group.group_name)
        if target is None or not _torch.can_shrink(target.spec.backend):
            _torch.abort_group(process_group)
    timed_out = isinstance(error, dist.DistStoreError) or (
        time.monotonic() - started >= TIMED_OUT_SHARE * timeout.total_seconds())
    if board is None:
        if timed_out:
            raise GroupTimeoutError(f"{what} along {where} timed out after {timeout.total_seconds():g}s") from error
        raise error
    # One roll call per group, whatever call each member was caught in (the members' tensor check and the data
    # collective after it, or two calls in a row): a group fails once (it is cut and aborted, or left to a recovery's
    # shrink), so its digest names its roll call. A failure of the world names its own (guarded).
    label = f"group-{target.spec.digest()}" if target is not None else f"{what}-world"
    try:
        missing = roll_call(board, label, ranks, ROLL_CALL_SECONDS, f"{type(error).__name__}: {error}")
        statuses = board.current(board.statuses(missing))
        answers = {} if missing else roll_answers(board, label, ranks)
    except ContextClosedError:
        raise
    except dist.DistError:  # the store is gone too: its host is likely what died; this rank is not what is missing
        missing, statuses, answers = [m for m in ranks if m != board.rank], {}, {}
    mine = conclude(board, missing, statuses, answers, timed_out, timeout, error)
    explained = raised(shared(board, label, mine), board.rank, f"{what} along {where}", error)
    board.failed(explained)
    raise explained from error


def shared(board: Board, label: str, mine: Conclusion) -> Conclusion:
    """The one conclusion of the survivors of the failed group of roll call ``label``: the first written (one
    ``compare_set``), or ``mine`` where this rank is the first, or the store is gone. Each survivor reads the board
    at its own moment (a silent member's status changes, the launcher marks it, one survivor's collective had waited
    out the timeout, another's had not), so each would conclude on its own what the moment showed it: one recovering,
    another closing on a different error, blaming different ranks."""
    try:
        written = Conclusion.loads(board.store.compare_set(board.keys.conclusion(label), "", mine.dumps()))
    except dist.DistError:
        return mine
    return written if written.kind in CONCLUDED else mine


def raised(conclusion: Conclusion, rank: int, call: str, error: Exception) -> Exception:
    """The error ``conclusion`` says rank ``rank`` raises for its ``call`` (what along where), which failed with
    ``error`` on it.

    >>> raised(Conclusion("RankLostError", "failed: ranks [2] of the group are gone", True, 0), 1, "all_reduce along "
    ...        "dp", RuntimeError("Connection closed by peer"))  # doctest: +NORMALIZE_WHITESPACE
    RankLostError('on rank 1: all_reduce along dp failed: ranks [2] of the group are gone (the backend said: Connection
    closed by peer; rank 0 concluded this first, and every member of the group raises it)')
    """
    kind: type[Exception] = next(k for k in (*EXPLAINED, RuntimeError) if k.__name__ == conclusion.kind)
    first = "" if conclusion.by == rank else (f"rank {conclusion.by} concluded this first, and every member of the "
                                              "group raises it")
    said = "; ".join(part for part in (f"the backend said: {error}" if conclusion.quotes else "", first) if part)
    return kind(f"on rank {rank}: {call} {conclusion.text}" + (f" ({said})" if said else ""))


def conclude(board: Board, missing: list[int], statuses: dict[int, Status], answers: dict[int, str],
             timed_out: bool, timeout: timedelta, error: Exception) -> Conclusion:
    """What this rank concludes from its roll call (``missing``: the members that did not answer; ``statuses``:
    theirs; ``answers``: every member's, where all answered): see the module docstring."""
    doing = "; ".join(statuses[m].describe(m) if m in statuses else f"rank {m}: the store is unreachable, "
                      "its host is gone (rank 0, unless torchrun's agent hosts it)" for m in missing[:8])
    ended: list[int] = []
    with contextlib.suppress(Exception):  # the store may be gone: what it would add is a detail
        ended = board.ended(missing)
        if ended:
            doing = f"the launcher saw the processes of ranks {ended} end; {doing}"
    # Gone for sure: the launcher saw the process end, or it closed its context or exited. The others that did not
    # answer are alive as far as anyone knows (blocked in a collective, or slow): named apart, never as lost; one whose
    # status says it failed among them (it raised once, and may have caught it and gone on).
    known_gone = sorted({*ended, *(m for m in missing if statuses.get(m, NO_STATUS).state in GONE_STATES)})
    blocked = [m for m in missing if m not in known_gone and m != board.rank]  # this rank answered, if late
    recovering = [m for m in missing if statuses.get(m, NO_STATUS).state == RECOVERING]
    mismatch = next((m for m in missing if statuses.get(m, NO_STATUS).kind in ("MeshMismatchError",
                                                                            "TensorMismatchError")), None)
    refused = next((m for m in missing if statuses.get(m, NO_STATUS).refused), None)
    by = board.rank
    if refused is not None:
        return Conclusion("TensorMismatchError", (
            f"could not complete: rank {refused} refused it on itself, before sending any of it "
            f"({statuses[refused].error}), while the others' tensors went. Expected every member to pass a tensor the "
            f"backend takes, of the same shape and dtype; see rank {refused}'s error first"), by=by)
    if mismatch is not None:
        about, kind = (("a mesh", "MeshMismatchError") if statuses[mismatch].kind == "MeshMismatchError" else
                       ("the calls made on this group", "TensorMismatchError"))
        return Conclusion(kind, f"could not complete because rank {mismatch} disagrees about {about}: "
                                f"{statuses[mismatch].error}", by=by)
    if recovering:  # alive: they came to recover without ranks lost elsewhere, and wait for this rank to come
        lost = statuses[recovering[0]].lost_text
        together: list[int] = recovering
        with contextlib.suppress(Exception):
            together = [r for r in recovering_ranks(board) if r != board.rank] or recovering
        return Conclusion("RankLostError", (
            f"failed: ranks {lost} are lost, and ranks {together} are recovering without them "
            f"({statuses[recovering[0]].describe(recovering[0])}), so they cut the groups they share with this rank. "
            f"Expected every survivor to recover: call ctx.recover({lost}) on this rank too (they wait for it up to "
            "the creation timeout)"), by=by)
    if timed_out:
        return Conclusion("GroupTimeoutError", (
            f"timed out after {timeout.total_seconds():g}s; ranks {missing} did not answer a roll call: "
            f"{doing or 'all answered, so one is stuck elsewhere'}. Expected every member to run this collective; "
            "check the order of collectives on the ranks named here"), by=by)
    if known_gone:
        alive = (f"; ranks {blocked} did not answer a roll call within {ROLL_CALL_SECONDS:g}s but are not known to be "
                 "gone (still blocked in a collective, or slow)") if blocked else ""
        return Conclusion("RankLostError", (
            f"failed: ranks {known_gone} of the group are gone ({doing}){alive}. Expected every member alive; see the "
            f"logs of ranks {known_gone}, then restart the job or recover without them"), quotes=True, by=by)
    if missing:
        gone = [m for m in missing if statuses.get(m, NO_STATUS).state != FAILED]
        return Conclusion("RankLostError", (
            f"failed: ranks {missing} of the group did not answer a roll call within {ROLL_CALL_SECONDS:g}s: they are "
            f"gone, or still blocked in this collective ({doing}). Expected every member alive; see the logs of ranks "
            f"{gone or missing}, then restart the job"), quotes=True, by=by)
    # every member is there, none is lost: each one's own error, so the one that went wrong shows
    told = "; ".join(f"rank {m}: {answer[:300]}" for m, answer in list(answers.items())[:8])
    return Conclusion("RuntimeError", (
        f"failed on its members, and every member answered a roll call, so none is lost. What each saw: {told}. The "
        "error that is not a closed connection is the cause (check that every member passes a tensor of the same "
        "dtype and shape)"), by=by)


def peer_failed(error: BaseException) -> bool:
    """Whether ``error``, raised by a collective fmesh did not run, says a peer is gone (:data:`PEER_FAILURES`, or a
    ``torch.distributed.DistError``); never for fmesh's own errors, which explain themselves already.

    >>> peer_failed(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:31123")), peer_failed(
    ...     RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    (True, False)
    """
    if type(error).__module__.split(".")[0] == "fmesh":
        return False
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and _PEER_FAILED.search(str(error)) is not None)


@contextlib.contextmanager
def guarded(what: str, world_size: int, timeout: timedelta, board: Board | None) -> Iterator[None]:
    """Explain a peer's loss in collectives fmesh did not run (FSDP's, DTensor's, raw ``torch.distributed`` calls)
    inside the block, as fmesh explains its own: a backend error that says a peer is gone (:func:`peer_failed`)
    becomes, after a roll call of the world (every survivor whose block failed answers it),
    :class:`~fmesh.RankLostError` naming the ranks that did not answer, with the backend's error as its cause. Any
    other error passes unchanged, at once."""
    started = time.monotonic()
    try:
        yield
    except Exception as error:
        if board is None or not peer_failed(error):
            raise
        count = board.store.add(board.keys.guarded(board.rank), 1)  # the n-th on every rank
        failed(f"{what} (#{count})", None, tuple(range(world_size)), timeout, started, error, board)
