"""Tensors checked at the door of a collective, before any group is touched: a type check and a device comparison
(:func:`check_tensor`); and what members must agree on about a tensor (:func:`describe`, :func:`signature`), which
the members' check of their calls (:mod:`fmesh.context.call_checks`) compares.
"""

from __future__ import annotations

import hashlib
import sys

import torch

DESCRIPTIONS_SECONDS = 5.0


def _a_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor, without importing DTensor (half a CPU-second a process) where nothing has:
    then it is not one."""
    dtensors = sys.modules.get("torch.distributed.tensor")
    return dtensors is not None and isinstance(tensor, dtensors.DTensor)


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
    if _a_dtensor(tensor):
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
