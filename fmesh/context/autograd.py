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

from fmesh.context import collectives, permute
from fmesh.context.collectives import ReduceOp
from fmesh.context.groups import Route
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
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, op: ReduceOp) -> torch.Tensor:
        ctx.link = (route, op)
        return collectives.all_reduce(route, tensor, op)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, op = ctx.link
        return AllReduce.apply(grad, route, op), None, None


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
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, dim: int) -> torch.Tensor:
        ctx.link = (route, dim)
        return collectives.all_gather(route, tensor, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, dim = ctx.link
        return ReduceScatter.apply(grad, route, dim, "sum"), None, None


class ReduceScatter(torch.autograd.Function):  # type: ignore[misc]
    """reduce_scatter (sum or avg) along ``dim``; the backward is an all_gather along ``dim`` (1/n for avg)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, dim: int, op: ReduceOp) -> torch.Tensor:
        ctx.link = (route, dim, op)
        return collectives.reduce_scatter(route, tensor, dim, op)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, dim, op = ctx.link
        gathered = AllGather.apply(grad, route, dim)
        return gathered / route.target.size if op == "avg" else gathered, None, None, None


class AllToAll(torch.autograd.Function):  # type: ignore[misc]
    """all_to_all; the backward is the inverse all_to_all (``split_dim`` and ``concat_dim`` swapped)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, split_dim: int, concat_dim: int) -> torch.Tensor:
        ctx.link = (route, split_dim, concat_dim)
        return collectives.all_to_all(route, tensor, split_dim, concat_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, split_dim, concat_dim = ctx.link
        return AllToAll.apply(grad, route, concat_dim, split_dim), None, None, None


class Broadcast(torch.autograd.Function):  # type: ignore[misc]
    """broadcast from member ``src``; the backward sums the gradients into ``src`` (zeros elsewhere)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, src: int) -> torch.Tensor:
        ctx.link = (route, src)
        return collectives.broadcast(route, tensor, src)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, src = ctx.link
        summed = AllReduce.apply(grad, route, "sum")
        if route.target.member == src:
            return summed, None, None
        # Zeros; under create_graph still tied to the sum, so every member runs its backward (the same collective).
        return (summed * 0 if summed.requires_grad else torch.zeros_like(summed)), None, None


class Permute(torch.autograd.Function):  # type: ignore[misc]
    """ppermute / shift; the backward sends each gradient back to where its value came from."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, send_to: int | None,
                receive_from: int | None) -> torch.Tensor:
        ctx.link = (route, send_to, receive_from)
        return permute.permute(route, tensor, send_to, receive_from)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, send_to, receive_from = ctx.link
        return Permute.apply(grad, route, receive_from, send_to), None, None, None


class SumGradients(torch.autograd.Function):  # type: ignore[misc]
    """Identity forward; the backward is a sum all_reduce of the gradients (Megatron's "f")."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route) -> torch.Tensor:
        ctx.route = route
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return AllReduce.apply(grad, ctx.route, "sum"), None


class SumPartials(torch.autograd.Function):  # type: ignore[misc]
    """Sum all_reduce forward; identity backward (Megatron's "g")."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route) -> torch.Tensor:
        return collectives.all_reduce(route, tensor, "sum")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None
