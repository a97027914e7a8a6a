"""Tensors checked at the door of a collective, before any group is touched; and the check, on by default,
that every member of the group passes a tensor of the same shape and dtype to the same call.

The door (:func:`check_tensor`) costs a type check and a device comparison. The members' check
(:class:`TensorChecks`, ``Context(check_tensors=True)``, the default) runs on the collective's own group just
before it: one all_reduce (max) of two 64-bit integers, a signature of the call (:func:`signature`: the collective,
its arguments, the tensor's shape and dtype) and its negation, so every member learns the largest and the smallest
signature in one step, and they are equal exactly when every member made the same call. Only then does the
collective send any of the caller's data: a mismatch (gloo aborts such a call, NCCL hangs or returns garbage, and
an all_gather of unequal sizes returned another rank's bytes on gloo) is a
:class:`~fmesh.TensorMismatchError` on every member, naming the odd rank and its tensor, and the group stays
healthy. It costs one small collective per eager collective (``bench/collectives.py``); ``check_tensors=False``
turns it off, and then it costs nothing. Inside ``torch.compile`` it does not run (the check reads its result on
the host, which would break the graph): check a compiled program eagerly once.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fmesh.context import collectives
from fmesh.context.groups import Route, Target
from fmesh.context.options import GroupSpec
from fmesh.context.store.board import Board
from fmesh.errors import TensorMismatchError

# How long a member that saw a mismatch waits for the others' descriptions, to name the odd one.
DESCRIPTIONS_SECONDS = 5.0


def check_tensor(what: str, tensor: object, device: torch.device, op: str | None = None) -> torch.Tensor:
    """``tensor`` if a collective can take it on ``device``; ``TypeError`` or ``ValueError`` otherwise.

    >>> check_tensor("all_reduce", torch.ones(2), torch.device("cpu")).shape
    torch.Size([2])
    >>> check_tensor("all_reduce", torch.ones(2, device="meta"), torch.device("cpu"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: all_reduce: expected a tensor on the context's device cpu, but got one on meta; ...
    """
    if not isinstance(tensor, torch.Tensor):
        hint = "; make one with torch.tensor(...)" if isinstance(tensor, list | tuple | int | float) else ""
        raise TypeError(f"{what}: expected a torch.Tensor, but got {type(tensor).__name__}: {_short(tensor)}{hint}")
    if isinstance(tensor, DTensor):
        raise TypeError(
            f"{what}: expected a plain torch.Tensor (this rank's data), but got a DTensor with placements "
            f"{tensor.placements}; pass dtensor.to_local() for this rank's shard, or dtensor.full_tensor() for the "
            "whole")
    if tensor.layout != torch.strided:
        raise TypeError(
            f"{what}: expected a dense tensor, but got a {str(tensor.layout).removeprefix('torch.')} one of shape "
            f"{tuple(tensor.shape)}; collectives move dense data (NCCL refuses sparse tensors): pass "
            "tensor.to_dense(), or send its indices and values as dense tensors of their own")
    if tensor.device != device:
        raise ValueError(
            f"{what}: expected a tensor on the context's device {device}, but got one on {tensor.device}; "
            f"move it first (tensor.to({str(device)!r}))")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(
            f"{what}: op='avg' divides, so it needs a floating-point tensor, but got {tensor.dtype}; convert it "
            "(tensor.float()) or use op='sum'")
    return tensor


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe(tensor: torch.Tensor) -> str:
    """What members must agree on about ``tensor``.

    >>> describe(torch.ones(2, 3))
    'shape (2, 3) dtype torch.float32'
    """
    return f"shape {tuple(tensor.shape)} dtype {tensor.dtype}"


def signature(call: str) -> int:
    """A 56-bit integer for ``call`` (what the members must agree on), the same in every process; its negation fits
    in 64 bits, which the members' all_reduce needs.

    >>> call = "shape (2,) dtype torch.float32 in all_reduce('sum')"
    >>> signature(call) == signature(call), signature(call) == signature(call.replace("32", "64"))
    (True, False)
    >>> 0 <= signature(call) < 2**56
    True
    """
    return int.from_bytes(hashlib.blake2b(call.encode(), digest_size=7).digest(), "big")


def _odd_ones(board: Board, group: str, count: int, target: Target, what: str, mine: str) -> str:
    """The message naming the members whose call differs from most members' (each member posts its own under
    the ``count``-th checked collective on ``group`` and reads the others')."""
    board.store.set(board.keys.tensor(group, count, board.rank), mine)
    keys = [board.keys.tensor(group, count, rank) for rank in target.ranks]
    try:
        board.store.wait(keys, timedelta(seconds=DESCRIPTIONS_SECONDS))
        held = dict(zip(target.ranks, (raw.decode() for raw in board.store.multi_get(keys)), strict=True))
    except Exception:  # a member never came: say what this rank knows
        held = {board.rank: mine}
    usual, times = Counter(held.values()).most_common(1)[0]
    if 2 * times <= len(held):  # no majority (two members, say): every member's own, none called odd
        found = "; ".join(f"rank {rank} holds a tensor of {text}" for rank, text in sorted(held.items()))
    else:
        odd = {rank: text for rank, text in held.items() if text != usual}
        others = sorted(rank for rank in held if rank not in odd)
        named = "; ".join(f"rank {rank} holds a tensor of {text}" for rank, text in sorted(odd.items()))
        found = f"{named}, while ranks {others} hold {usual}"
    return (f"on rank {board.rank}: {what} along {target.label()}: members hold different tensors: {found}. "
            "Expected every member of the group to pass a tensor of the same shape and dtype to the same collective "
            "(nothing was sent: the group is healthy; Context(check_tensors=False) turns this check off)")


class TensorChecks:
    """The members' check of their tensors before each eager collective (``Context(check_tensors=...)``, on by
    default) and its one piece of state: how many checked collectives each group has run, which names the place
    in the store where the members describe their tensors when the check fails."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._counts: dict[GroupSpec, int] = {}

    @classmethod
    def of(cls, check_tensors: object) -> TensorChecks:
        """The check as ``Context(check_tensors=...)`` asks for it: ``TypeError`` unless True or False.

        >>> TensorChecks.of(True).enabled
        True
        """
        if not isinstance(check_tensors, bool):
            raise TypeError(f"check_tensors: expected True or False, but got {check_tensors!r}")
        return cls(check_tensors)

    def check(self, what: str, route: Route, tensor: torch.Tensor, arguments: tuple[object, ...] = ()) -> None:
        """When enabled (eager, a real group of several members), the members of ``route`` compare their call
        (``what`` with ``arguments``, the tensor's shape and dtype) in one small all_reduce on the group, before
        any of the tensor is sent: :class:`~fmesh.TensorMismatchError` on every member when one differs."""
        process_group = route.group
        if (not self.enabled or route.board is None or process_group is None or route.target.size == 1
                or torch.compiler.is_compiling()):
            return
        spec = route.target.spec  # hashed once (cache_hash); its digest, O(group size), only on a mismatch
        count = self._counts[spec] = self._counts.get(spec, 0) + 1
        mine = f"{describe(tensor)} in {what}({', '.join(map(repr, arguments))})"
        code = signature(mine)
        bounds = torch.tensor([code, -code], dtype=torch.int64, device=tensor.device)
        collectives.run(f"{what} (the members' check of their tensors)", route,
                        lambda: dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=process_group))
        highest, negated_lowest = bounds.tolist()
        if highest == code == -negated_lowest:
            return
        raise TensorMismatchError(_odd_ones(route.board, spec.digest(), count, route.target, what,
                                            mine))
