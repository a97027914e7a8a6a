"""Tensors checked at the door of a collective, before any group is touched; and the opt-in check
that every member of the group holds a tensor of the same shape and dtype.

The door (:func:`check_tensor`) costs a type check and a device comparison. The cross-rank check
(:func:`agree_on_tensor`, ``Context(check_tensors=True)``) goes through the store, as the agreement
on a group does: a few store round trips per collective, for debugging a program whose ranks
disagree (gloo aborts on such a call, NCCL hangs or returns garbage).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import torch
from torch.distributed.tensor import DTensor

from fmesh.context.agreement import Agreement
from fmesh.context.groups import Route, Target
from fmesh.errors import MeshMismatchError, TensorMismatchError

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


def agree_on_tensor(agreement: Agreement, what: str, target: Target, count: int, tensor: torch.Tensor) -> None:
    """Meet the other members of ``target`` (this is their ``count``-th checked collective on it) and check
    that each holds a tensor like ``tensor``; :class:`~fmesh.TensorMismatchError` names the odd rank."""
    mine = describe(tensor)
    key = f"tensor/{target.spec.digest()}/{count}"
    agreement.store.set(f"{agreement.prefix}/{key}/{agreement.rank}", mine)
    label = f"the tensor of {what} along {target.label()}"
    try:
        agreement.agree(key, target.ranks, mine, label)
    except MeshMismatchError as error:
        raise TensorMismatchError(_odd_ones(agreement, key, target, what, mine)) from error


def _odd_ones(agreement: Agreement, key: str, target: Target, what: str, mine: str) -> str:
    """The message naming the members whose tensor differs from most members' (every member's tensor)."""
    keys = [f"{agreement.prefix}/{key}/{rank}" for rank in target.ranks]
    try:
        agreement.store.wait(keys, timedelta(seconds=DESCRIPTIONS_SECONDS))
        held = dict(zip(target.ranks, (raw.decode() for raw in agreement.store.multi_get(keys)), strict=True))
    except Exception:  # a member never came: say what this rank knows
        held = {agreement.rank: mine}
    usual, _ = Counter(held.values()).most_common(1)[0]
    odd = {rank: text for rank, text in held.items() if text != usual}
    if not odd:
        odd = {rank: text for rank, text in held.items() if text != mine} or held
    others = sorted(rank for rank in held if rank not in odd)
    named = "; ".join(f"rank {rank} holds a tensor of {text}" for rank, text in sorted(odd.items()))
    return (f"on rank {agreement.rank}: {what} along {target.label()}: members hold different tensors: {named}, while "
            f"ranks {others} hold {usual}. Expected every member of the group to pass a tensor of the same shape "
            "and dtype")


class TensorChecks:
    """The opt-in check of every member's tensor (``Context(check_tensors=True)``) and its one piece of state: how
    many checked collectives each group has run, which names each meeting in the store."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._counts: dict[str, int] = {}

    @classmethod
    def of(cls, check_tensors: object) -> TensorChecks:
        """The check as ``Context(check_tensors=...)`` asks for it: ``TypeError`` unless True or False.

        >>> TensorChecks.of(True).enabled
        True
        """
        if not isinstance(check_tensors, bool):
            raise TypeError(f"check_tensors: expected True or False, but got {check_tensors!r}")
        return cls(check_tensors)

    def check(self, what: str, route: Route, tensor: torch.Tensor) -> None:
        """When enabled, the members of ``route`` agree on ``tensor``'s shape and dtype (eager, real backends)."""
        if not self.enabled or route.agreement is None or route.target.size == 1 or torch.compiler.is_compiling():
            return
        key = route.target.spec.digest()
        count = self._counts[key] = self._counts.get(key, 0) + 1
        agree_on_tensor(route.agreement, what, route.target, count, tensor)
