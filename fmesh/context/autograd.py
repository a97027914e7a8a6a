"""The backward of every tensor collective: one ``torch.autograd.Function`` whose backward is this table.

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
broadcast from ``src``     all_reduce sum, kept by ``src``; the other members' inputs get zeros
ppermute / shift           the inverse permutation
=========================  ===========================================================

And the tensor-parallel pair, for a loss every member computes alike: ``sum_gradients``
(identity forward, all_reduce backward) and ``sum_partials`` (all_reduce forward, identity
backward).

:class:`Collective` runs the forward column (:func:`forward`) and the backward column (:func:`backward`), for
every collective by its name. Each backward runs its collective through :class:`Collective` again (never the
bare collective), so a gradient of a gradient (``torch.autograd.grad(..., create_graph=True)``) is recorded and
right.

The Context goes through a Function only when autograd records (``torch.is_grad_enabled()`` and the
input ``requires_grad``); otherwise it calls the collective directly, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from fmesh.context import collectives, permute
from fmesh.context.groups import Route
from fmesh.errors import NoGradientError

Kind = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "permute",
               "sum_gradients", "sum_partials"]
"""The collectives :class:`Collective` differentiates, by name (a permute is ppermute's and shift's)."""


def records(tensor: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensor`` now.

    >>> records(torch.ones(1, requires_grad=True)), records(torch.ones(1))
    (True, False)
    """
    return bool(tensor.requires_grad and torch.is_grad_enabled())


def _sum_partials(route: Route, tensor: torch.Tensor) -> torch.Tensor:
    return collectives.all_reduce(route, tensor, "sum")


def _sum_gradients(route: Route, tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view_as(tensor)  # the identity, as a new autograd node


# The table's left column: each collective by its name (one dictionary lookup on the hot path).
FORWARD: dict[str, Callable[..., torch.Tensor]] = {
    "all_reduce": collectives.all_reduce, "all_gather": collectives.all_gather,
    "reduce_scatter": collectives.reduce_scatter, "broadcast": collectives.broadcast,
    "all_to_all": collectives.all_to_all, "permute": permute.permute, "sum_partials": _sum_partials,
    "sum_gradients": _sum_gradients,
}


def forward(kind: Kind, route: Route, tensor: torch.Tensor, args: tuple[Any, ...]) -> torch.Tensor:
    """The collective ``kind`` of ``tensor`` with its arguments ``args`` (the table's left column)."""
    return FORWARD[kind](route, tensor, *args)


def backward(kind: Kind, route: Route, grad: torch.Tensor, args: tuple[Any, ...]) -> torch.Tensor:
    """The gradient of the input of the collective ``kind`` from the gradient of its output (the table's right
    column), through :class:`Collective`, so that it is itself differentiable."""
    if kind == "all_reduce":
        return Collective.apply(grad, route, "all_reduce", args)
    if kind == "all_gather":
        return Collective.apply(grad, route, "reduce_scatter", (*args, "sum"))
    if kind == "reduce_scatter":
        dim, op = args
        gathered = Collective.apply(grad, route, "all_gather", (dim,))
        return gathered / route.target.size if op == "avg" else gathered
    if kind == "broadcast":
        summed = Collective.apply(grad, route, "all_reduce", ("sum",))
        if route.target.member == args[0]:
            return summed
        # Zeros; under create_graph still tied to the sum, so every member runs its backward (the same collective).
        return summed * 0 if summed.requires_grad else torch.zeros_like(summed)
    if kind in ("all_to_all", "permute"):  # the exchange back: split/concat dims, or destination/source, swapped
        first, second = args
        return Collective.apply(grad, route, kind, (second, first))
    if kind == "sum_gradients":
        return Collective.apply(grad, route, "all_reduce", ("sum",))
    return grad  # sum_partials: every member's loss is the same one, counted once


class Collective(torch.autograd.Function):  # type: ignore[misc]
    """The collective ``kind`` along ``route`` with its arguments ``args`` (``op``, ``dim``, ``src``, ...), recorded by
    autograd; its backward is the table's (:func:`backward`)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, route: Route, kind: Kind, args: tuple[Any, ...]) -> torch.Tensor:
        ctx.link = (route, kind, args)
        return forward(kind, route, tensor, args)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        route, kind, args = ctx.link
        return backward(kind, route, grad, args), None, None, None


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
