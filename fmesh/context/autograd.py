"""The backward of every tensor collective: one small ``torch.autograd.Function`` per collective.

The meaning is torch's ``torch.distributed.nn.functional``'s: the loss is the sum of every member's
loss, so each collective's backward is the collective that carries each gradient back to where its
input came from:

=========================  ===========================================================
forward                    backward (on the same group)
=========================  ===========================================================
all_reduce sum             all_reduce sum
all_reduce avg             all_reduce avg (the sum, scaled by 1/n)
all_reduce max/min/product raises :class:`~fmesh.NoGradientError`
all_gather along ``dim``   reduce_scatter sum along ``dim``
reduce_scatter sum (avg)   all_gather along ``dim`` (scaled by 1/n)
all_to_all                 all_to_all with ``split_dim`` and ``concat_dim`` swapped
broadcast from ``src``     sum reduce to ``src``; the other members' inputs get zeros
ppermute / shift           the inverse permutation
=========================  ===========================================================

And the tensor-parallel pair, for a loss every member computes alike: :class:`SumGradients`
(identity forward, all_reduce backward) and :class:`SumPartials` (all_reduce forward, identity
backward).

Each backward runs its collective through the Function of that collective (never the bare collective), so a
gradient of a gradient (``torch.autograd.grad(..., create_graph=True)``) is recorded and right.

The Context goes through a Function only when autograd records (``torch.is_grad_enabled()`` and the
input ``requires_grad``); otherwise it calls the collective directly, as before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from fmesh.context import collectives, permute
from fmesh.context.agreement import Agreement
from fmesh.context.groups import Target
from fmesh.errors import NoGradientError


def records(tensor: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensor`` now.

    >>> records(torch.ones(1, requires_grad=True)), records(torch.ones(1))
    (True, False)
    """
    return bool(tensor.requires_grad and torch.is_grad_enabled())


class AllReduce(torch.autograd.Function):  # type: ignore[misc]
    """all_reduce with ``op`` sum or avg; the backward is the same all_reduce of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None, op: str,
                agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, op, agreement)
        return collectives.all_reduce(target, process_group, tensor, op, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, op, agreement = ctx.link
        return AllReduce.apply(grad, target, process_group, op, agreement), None, None, None, None


class NoGradient(torch.autograd.Function):  # type: ignore[misc]
    """A ``result`` computed from ``tensor`` (detached) by a reduction with no gradient in fmesh (max, min,
    product): the forward returns it, the backward raises, naming ``what`` was computed."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, result: torch.Tensor, what: str) -> torch.Tensor:
        ctx.what = what
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        raise NoGradientError(
            f"{ctx.what} has no gradient in fmesh (only op='sum' and op='avg' do); reduce a detached tensor "
            "(tensor.detach()), or write the selection with a sum all_reduce (e.g. of a one-hot mask of the winner)")


class AllGather(torch.autograd.Function):  # type: ignore[misc]
    """all_gather along ``dim``; the backward is a sum reduce_scatter along ``dim``."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None, dim: int,
                agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, dim, agreement)
        return collectives.all_gather(target, process_group, tensor, dim, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, dim, agreement = ctx.link
        return ReduceScatter.apply(grad, target, process_group, dim, "sum", agreement), None, None, None, None


class ReduceScatter(torch.autograd.Function):  # type: ignore[misc]
    """reduce_scatter (sum or avg) along ``dim``; the backward is an all_gather along ``dim`` (1/n for avg)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None, dim: int,
                op: str,
                agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, dim, op, agreement)
        return collectives.reduce_scatter(target, process_group, tensor, dim, op, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, dim, op, agreement = ctx.link
        gathered = AllGather.apply(grad, target, process_group, dim, agreement)
        return gathered / target.size if op == "avg" else gathered, None, None, None, None, None


class AllToAll(torch.autograd.Function):  # type: ignore[misc]
    """all_to_all; the backward is the inverse all_to_all (``split_dim`` and ``concat_dim`` swapped)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None, split_dim: int,
                concat_dim: int, agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, split_dim, concat_dim, agreement)
        return collectives.all_to_all(target, process_group, tensor, split_dim, concat_dim, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, split_dim, concat_dim, agreement = ctx.link
        return (AllToAll.apply(grad, target, process_group, concat_dim, split_dim, agreement),
                None, None, None, None, None)


class Broadcast(torch.autograd.Function):  # type: ignore[misc]
    """broadcast from member ``src``; the backward sums the gradients into ``src`` (zeros elsewhere)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None, src: int,
                agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, src, agreement)
        return collectives.broadcast(target, process_group, tensor, src, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, src, agreement = ctx.link
        summed = AllReduce.apply(grad, target, process_group, "sum", agreement)
        if target.member == src:
            return summed, None, None, None, None
        # Zeros; under create_graph still tied to the sum, so every member runs its backward (the same collective).
        return (summed * 0 if summed.requires_grad else torch.zeros_like(summed)), None, None, None, None


class Permute(torch.autograd.Function):  # type: ignore[misc]
    """ppermute / shift; the backward sends each gradient back to where its value came from."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None,
                send_to: int | None,
                receive_from: int | None, agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, send_to, receive_from, agreement)
        return permute.permute(target, process_group, tensor, send_to, receive_from, agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, send_to, receive_from, agreement = ctx.link
        return (Permute.apply(grad, target, process_group, receive_from, send_to, agreement),
                None, None, None, None, None)


class SumGradients(torch.autograd.Function):  # type: ignore[misc]
    """Identity forward; the backward is a sum all_reduce of the gradients (Megatron's "f")."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None,
                agreement: Agreement | None) -> torch.Tensor:
        ctx.link = (target, process_group, agreement)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target, process_group, agreement = ctx.link
        return AllReduce.apply(grad, target, process_group, "sum", agreement), None, None, None


class SumPartials(torch.autograd.Function):  # type: ignore[misc]
    """Sum all_reduce forward; identity backward (Megatron's "g")."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, target: Target, process_group: dist.ProcessGroup | None,
                agreement: Agreement | None) -> torch.Tensor:
        return collectives.all_reduce(target, process_group, tensor, "sum", agreement)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None, None, None
