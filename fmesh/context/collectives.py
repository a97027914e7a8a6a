"""Collectives along mesh axes: each takes a :class:`~fmesh.context.groups.Route` (the target, its process
group and the status board), leaves its input alone and returns a new tensor.

The group is ``None`` for a group of one, where every collective is a copy. Arguments are checked
by the ``check_*`` helpers before the Context asks for a group, so a bad call never creates one.

Inside ``torch.compile`` each collective is the functional collective of the same meaning
(:func:`compiling`), which Dynamo traces into the graph; the eager path, with its timing and failure
explanation, is never traced.

A failure in eager is explained before it is raised, on every member (:func:`fmesh.context.failures.failed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.failures import failed
from fmesh.context.groups import Route
from fmesh.context.store.board import Board
from fmesh.layout.int_tuple import is_int

ReduceOp = Literal["sum", "avg", "max", "min", "product"]
"""The reductions of ``all_reduce`` and ``reduce_scatter``, by name (``avg`` divides: floating-point tensors only)."""

REDUCE_OPS: dict[ReduceOp, Any] = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


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
    if not is_int(value) or not 0 <= value < size:
        raise ValueError(f"{what} {name}={value!r} is an index within the group: valid 0..{size - 1}")
    return value


def compiling() -> bool:
    """Whether Dynamo is tracing this call (``torch.compile``): then the functional collective runs.

    >>> compiling()
    False
    """
    return bool(torch.compiler.is_compiling())


def _traced_reduce(tensor: torch.Tensor, op: str, reduce: Callable[[torch.Tensor, str], torch.Tensor],
                   size: int) -> torch.Tensor:
    # avg as a sum and a division on every backend: gloo has no AVG, and the result is the same.
    if op == "avg":
        return reduce(tensor, "sum") / size
    return reduce(tensor, op)


def check_dim(what: str, label: str, tensor: torch.Tensor, dim: object) -> int:
    """``dim`` if it names a dimension of ``tensor`` (negative counts from the end); ``TypeError``/``IndexError``
    naming both otherwise."""
    if not is_int(dim):
        raise TypeError(f"{what}: expected an int {label}, but got {dim!r}")
    if not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(f"{what}: expected {label} in {-tensor.dim()}..{tensor.dim() - 1} for a tensor of shape "
                         f"{tuple(tensor.shape)}, but got {dim}")
    return int(dim)


def check_divisible(what: str, label: str, tensor: torch.Tensor, dim: int, size: int) -> None:
    """``ValueError`` unless ``tensor.shape[dim]`` splits into ``size`` equal chunks."""
    check_dim(what, label, tensor, dim)
    if tensor.shape[dim] % size:
        raise ValueError(f"{what}: {label} {dim} has size {tensor.shape[dim]}, not divisible by group size {size}")


def run(what: str, route: Route, call: Callable[[], object]) -> None:
    """``call()`` on the route's group, with its errors explained by :func:`failed`."""
    started = time.monotonic()
    try:
        call()
    except (RuntimeError, ValueError, TypeError) as error:  # ValueError: also torch's for a group aborted meanwhile
        target = route.target
        failed(what, target, target.ranks, target.spec.timeout, started, error, route.board, route.group)


def all_reduce(route: Route, tensor: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduce over the group; ``op`` is checked by the caller (:func:`reduce_op`)."""
    target, process_group = route.target, route.group
    if process_group is None:
        return tensor.clone()
    if compiling():
        return _traced_reduce(tensor, op, lambda t, o: _torch.traced_all_reduce(t, o, process_group), target.size)
    result = tensor.clone(memory_format=torch.contiguous_format)  # NCCL refuses a non-contiguous tensor
    # The hot path: no closure, and a string compare rather than ReduceOp's (slower) __eq__.
    started = time.monotonic()
    try:
        if op == "avg" and target.spec.backend == "gloo":  # gloo has no AVG
            dist.all_reduce(result, group=process_group)
            result.div_(target.size)
        else:
            dist.all_reduce(result, op=REDUCE_OPS[op], group=process_group)
    except (RuntimeError, ValueError, TypeError) as error:  # ValueError: also torch's for a group aborted meanwhile
        failed("all_reduce", target, target.ranks, target.spec.timeout, started, error, route.board, process_group)
    return result


def _along_first(route: Route, tensor: torch.Tensor, dim: int, traced: Callable[[torch.Tensor], torch.Tensor],
                 eager: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A collective that works along the first dimension (the single-tensor c10d calls), on ``tensor`` along
    ``dim``: ``dim`` moved first and made contiguous (NCCL refuses anything else), then ``traced(moved)`` under
    ``torch.compile`` or ``eager(moved)``, and the result's first dimension moved back to ``dim``. A group of one
    gets a copy."""
    if route.group is None:
        return tensor.clone()
    moved = tensor.movedim(dim, 0).contiguous()
    return (traced(moved) if compiling() else eager(moved)).movedim(0, dim)


def all_gather(route: Route, tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """Every member's ``tensor``, concatenated along ``dim`` in group order."""
    size, process_group = route.target.size, route.group

    def eager(moved: torch.Tensor) -> torch.Tensor:
        output = moved.new_empty((size * moved.shape[0], *moved.shape[1:]))
        run("all_gather", route, lambda: _torch.all_gather_single(output, moved, group=process_group))
        return output

    return _along_first(route, tensor, dim, lambda moved: _torch.traced_all_gather(moved, 0, process_group), eager)


def reduce_scatter(route: Route, tensor: torch.Tensor, dim: int, op: ReduceOp) -> torch.Tensor:
    """Reduce over the group and keep this member's chunk of ``dim``; divisibility checked by the caller."""
    target, process_group = route.target, route.group
    gloo_avg = op == "avg" and target.spec.backend == "gloo"  # gloo has no AVG: the sum, divided

    def eager(moved: torch.Tensor) -> torch.Tensor:
        output = moved.new_empty((moved.shape[0] // target.size, *moved.shape[1:]))
        how = REDUCE_OPS["sum" if gloo_avg else op]
        run("reduce_scatter", route, lambda: _torch.reduce_scatter_single(output, moved, op=how, group=process_group))
        return output.div_(target.size) if gloo_avg else output

    def traced(moved: torch.Tensor) -> torch.Tensor:
        return _traced_reduce(moved, op, lambda t, o: _torch.traced_reduce_scatter(t, o, 0, process_group), target.size)

    return _along_first(route, tensor, dim, traced, eager)


def broadcast(route: Route, tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Member ``src``'s ``tensor`` on every member; ``src`` checked by the caller."""
    target, process_group = route.target, route.group
    if process_group is not None and compiling():
        return _torch.traced_broadcast(tensor.contiguous(), src, process_group)
    result = tensor.clone(memory_format=torch.contiguous_format)  # NCCL refuses a non-contiguous tensor
    if process_group is not None:
        run("broadcast", route, lambda: dist.broadcast(result, src=target.ranks[src], group=process_group))
    return result


def all_to_all(route: Route, tensor: torch.Tensor, split_dim: int, concat_dim: int) -> torch.Tensor:
    """Chunk ``i`` of ``split_dim`` to member ``i``; what arrives concatenated along ``concat_dim``."""
    size, process_group = route.target.size, route.group

    def eager(moved: torch.Tensor) -> torch.Tensor:
        output = torch.empty_like(moved)
        run("all_to_all", route, lambda: dist.all_to_all_single(output, moved, group=process_group))
        return output

    arrived = _along_first(route, tensor, split_dim,
                           lambda moved: _torch.traced_all_to_all(moved, None, None, process_group), eager)
    return torch.cat(arrived.chunk(size, dim=split_dim), dim=concat_dim)


def barrier(route: Route) -> None:
    """Wait for every member of the group."""
    process_group = route.group
    if process_group is not None:
        run("barrier", route, lambda: dist.barrier(group=process_group))


def world_barrier(world_size: int, timeout: timedelta, board: Board | None) -> None:
    """Wait for every rank of the default group."""
    started = time.monotonic()
    try:
        dist.barrier()
    except (RuntimeError, ValueError, TypeError) as error:  # ValueError: also torch's for a group aborted meanwhile
        failed("barrier", None, tuple(range(world_size)), timeout, started, error, board)
