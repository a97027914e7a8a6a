"""Collectives along mesh axes: each takes a :class:`~fmesh.context.groups.Target` and its process
group, leaves its input alone and returns a new tensor.

The group is ``None`` for a group of one, where every collective is a copy. Arguments are checked
by the ``check_*`` helpers before the Context asks for a group, so a bad call never creates one.
A backend error after the group's timeout has passed is reported as
:class:`~fmesh.GroupTimeoutError` naming the mesh, the axes and the ranks; any other is re-raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.groups import Target
from fmesh.errors import GroupTimeoutError

REDUCE_OPS: dict[str, Any] = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}
# A backend error raised after this share of the group's timeout is that timeout.
_TIMED_OUT = 0.9


def reduce_op(op: object) -> Any:
    """The ``ReduceOp`` named ``op``; ``ValueError`` naming the choices otherwise.

    >>> reduce_op("max") == dist.ReduceOp.MAX
    True
    """
    try:
        return REDUCE_OPS[op]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; choose one of {sorted(REDUCE_OPS)}") from None


def check_index(what: str, name: str, value: object, size: int) -> int:
    """``value`` if it is an index within a group of ``size``; ``ValueError`` otherwise.

    >>> check_index("broadcast", "src", 1, 2)
    1
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
        raise ValueError(f"{what} {name}={value!r} is an index within the group: valid 0..{size - 1}")
    return value


def check_divisible(what: str, label: str, tensor: torch.Tensor, dim: int, size: int) -> None:
    """``ValueError`` unless ``tensor.shape[dim]`` splits into ``size`` equal chunks."""
    if tensor.shape[dim] % size:
        raise ValueError(f"{what}: {label} {dim} has size {tensor.shape[dim]}, not divisible by group size {size}")


def failed(what: str, target: Target | None, ranks: tuple[int, ...], timeout: timedelta, started: float,
           error: Exception) -> NoReturn:
    """Re-raise a collective's ``error``: as ``GroupTimeoutError`` when it came after the timeout."""
    if isinstance(error, dist.DistStoreError) or time.monotonic() - started >= _TIMED_OUT * timeout.total_seconds():
        where = "the default group" if target is None else f"axes {target.axes} of {target.mesh!r}"
        raise GroupTimeoutError(
            f"{what} along {where} timed out after {timeout.total_seconds():g}s waiting for ranks {list(ranks)}: "
            "a rank never arrived (it crashed, or its program took another path)"
        ) from error
    raise error


def run(what: str, target: Target, call: Callable[[], object]) -> None:
    """``call()``, with its errors translated by :func:`failed`."""
    started = time.monotonic()
    try:
        call()
    except RuntimeError as error:
        failed(what, target, target.ranks, target.spec.timeout, started, error)


def all_reduce(target: Target, group: dist.ProcessGroup | None, tensor: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce over the group; ``op`` is checked by the caller (:func:`reduce_op`)."""
    result = tensor.clone()
    if group is None:
        return result
    # The hot path: no closure, and a string compare rather than ReduceOp's (slower) __eq__.
    started = time.monotonic()
    try:
        if op == "avg" and target.spec.backend == "gloo":  # gloo has no AVG
            dist.all_reduce(result, group=group)
            result.div_(target.size)
        else:
            dist.all_reduce(result, op=REDUCE_OPS[op], group=group)
    except RuntimeError as error:
        failed("all_reduce", target, target.ranks, target.spec.timeout, started, error)
    return result


def all_gather(target: Target, group: dist.ProcessGroup | None, tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """Every member's ``tensor``, concatenated along ``dim`` in group order."""
    if group is None:
        return tensor.clone()
    moved = tensor.movedim(dim, 0).contiguous()
    output = torch.empty((target.size * moved.shape[0], *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    run("all_gather", target, lambda: _torch.all_gather_single(output, moved, group=group))
    return output.movedim(0, dim)


def reduce_scatter(target: Target, group: dist.ProcessGroup | None, tensor: torch.Tensor, dim: int,
                   op: str) -> torch.Tensor:
    """Reduce over the group and keep this member's chunk of ``dim``; divisibility checked by the caller."""
    if group is None:
        return tensor.clone()
    moved = tensor.movedim(dim, 0).contiguous()
    output = torch.empty((moved.shape[0] // target.size, *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    gloo_avg = op == "avg" and target.spec.backend == "gloo"
    op_now = REDUCE_OPS["sum" if gloo_avg else op]
    run("reduce_scatter", target, lambda: _torch.reduce_scatter_single(output, moved, op=op_now, group=group))
    if gloo_avg:
        output.div_(target.size)
    return output.movedim(0, dim)


def broadcast(target: Target, group: dist.ProcessGroup | None, tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Member ``src``'s ``tensor`` on every member; ``src`` checked by the caller."""
    result = tensor.clone()
    if group is not None:
        run("broadcast", target, lambda: dist.broadcast(result, src=target.ranks[src], group=group))
    return result


def all_to_all(target: Target, group: dist.ProcessGroup | None, tensor: torch.Tensor, split_dim: int,
               concat_dim: int) -> torch.Tensor:
    """Chunk ``i`` of ``split_dim`` to member ``i``; what arrives concatenated along ``concat_dim``."""
    if group is None:
        return tensor.clone()
    moved = tensor.movedim(split_dim, 0).contiguous()
    output = torch.empty_like(moved)
    run("all_to_all", target, lambda: dist.all_to_all_single(output, moved, group=group))
    chunks = output.movedim(0, split_dim).chunk(target.size, dim=split_dim)
    return torch.cat(chunks, dim=concat_dim)


def barrier(target: Target, group: dist.ProcessGroup | None) -> None:
    """Wait for every member of the group."""
    if group is not None:
        run("barrier", target, lambda: dist.barrier(group=group))


def world_barrier(world_size: int, timeout: timedelta) -> None:
    """Wait for every rank of the default group."""
    started = time.monotonic()
    try:
        dist.barrier()
    except RuntimeError as error:
        failed("barrier", None, tuple(range(world_size)), timeout, started, error)
