"""One manual-region program against one process: run it on the simulated (dp=2, tp=2) world
(``tests/spmd/spmd_world.py``), checked or unchecked, and compare every output and every input's gradient with the
single-process reference. The loss is a fixed random weighting of every output (the sum of each member's share:
its block of a split output, its part of a partial one, the whole of a replicated one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from spmd_world import World

import fmesh
from fmesh.errors import SpmdTypeError
from fmesh.spmd import P, Sharding
from fmesh.spmd.region import shard_map

MESH = fmesh.make_mesh((2, 2), ("dp", "tp"))


@attrs.frozen
class Program:
    """A region's body and the same computation on whole tensors, with its inputs (whole) and specs."""

    body: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]
    in_specs: tuple[P, ...]
    out_specs: tuple[P, ...]
    grads: tuple[bool, ...]  # which inputs want a gradient
    names: tuple[str, ...] = ()


@attrs.frozen
class Outcome:
    """What a run gave: a type error's message, another error, or every rank's outputs and gradients."""

    type_error: str | None = None
    other_error: str | None = None
    outputs: tuple[tuple[torch.Tensor, ...], ...] = ()
    grads: tuple[tuple[torch.Tensor | None, ...], ...] = ()
    error: SpmdTypeError | None = attrs.field(default=None, eq=False)  # the type error itself (its fix)


def block(value: torch.Tensor, spec: P, rank: int) -> torch.Tensor:
    """``rank``'s block of ``value`` under ``spec`` (a partial axis: its share, ``(c + 1) / 3`` of the whole for
    coordinate ``c`` of 2, so that the shares differ and sum to the whole)."""
    found = value[tuple(slice(a, b) for a, b in Sharding(MESH, spec).block(rank, value.shape))]
    coordinate = MESH.coordinate(rank)
    assert coordinate is not None
    for axis in spec.partial:
        found = found * (coordinate[MESH.axis_index(axis)] + 1) / 3
    return found


def _weights(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(o.shape, generator=g, dtype=o.dtype) if o.is_floating_point() else torch.zeros(())
            for o in outputs]


def reference(program: Program) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    leaves = [x.clone().requires_grad_(g) for x, g in zip(program.inputs, program.grads, strict=True)]
    out = program.reference(*leaves)
    outputs = [out] if isinstance(out, torch.Tensor) else list(out)
    loss = sum((o * w).sum() for o, w in zip(outputs, _weights(outputs), strict=True) if o.is_floating_point())
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    return [o.detach() for o in outputs], [x.grad for x in leaves]


def run(program: Program, check: bool, weights: list[torch.Tensor]) -> Outcome:
    """The program on the simulated world; each rank backpropagates its share of the weighted loss."""
    world = World(MESH)

    def member(m: Any) -> Any:
        blocks = [block(x, s, m.rank).clone().requires_grad_(g)
                  for x, s, g in zip(program.inputs, program.in_specs, program.grads, strict=True)]
        region = shard_map(program.body, mesh=MESH, in_specs=program.in_specs, out_specs=program.out_specs, ctx=m,
                           check=check, names=program.names)
        out = region.local(*blocks)
        outputs = [out] if isinstance(out, torch.Tensor) else list(out)
        loss = sum((o * (w if s.partial and not s.axes else block(w, P(*s.entries), m.rank))).sum()
                   for o, w, s in zip(outputs, weights, program.out_specs, strict=True) if o.is_floating_point())
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
        return [o.detach() for o in outputs], [b.grad for b in blocks]

    results = world.run(member)
    for result in results:
        if isinstance(result, SpmdTypeError):
            return Outcome(type_error=str(result), error=result)
    for result in results:
        if isinstance(result, BaseException):
            return Outcome(other_error=f"{type(result).__name__}: {result}")
    return Outcome(outputs=tuple(tuple(r[0]) for r in results), grads=tuple(tuple(r[1]) for r in results))


def _close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return (a is None or not a.abs().max() > 0) and (b is None or not b.abs().max() > 0)
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-8, equal_nan=True))


def agrees(program: Program, outcome: Outcome, want: tuple[list[torch.Tensor], list[torch.Tensor | None]]) -> bool:
    """Whether every rank's outputs and input gradients equal its share of the reference's."""
    outputs, grads = want
    for rank in range(MESH.size):
        for k, (spec, whole) in enumerate(zip(program.out_specs, outputs, strict=True)):
            mine = block(whole, P(*spec.entries), rank)
            got = outcome.outputs[rank][k]
            if spec.partial:  # the members' parts summed over the partial axes
                group = MESH.group(rank, spec.partial)
                got = sum((outcome.outputs[r][k] for r in group), torch.zeros_like(got))
            if not _close(got, mine):
                return False
        for j, (spec, whole) in enumerate(zip(program.in_specs, grads, strict=True)):
            if not program.grads[j]:
                continue
            want_grad = None if whole is None else block(whole, P(*spec.entries), rank)
            if not _close(outcome.grads[rank][j], want_grad):
                return False
    return True


def judge(program: Program) -> tuple[str, str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the 4 rank threads each compute; torch's own intra-op pool on top only contends
    try:
        return _judge(program)
    finally:
        torch.set_num_threads(threads)


def _judge(program: Program) -> tuple[str, str]:
    """``(verdict, message)``: ``caught`` (a type error, and the unchecked program is wrong), ``false positive``,
    ``silently wrong`` (no error, wrong), ``right``, or ``loud`` (torch itself refused the unchecked program)."""
    want = reference(program)
    weights = _weights(want[0])
    unchecked = run(program, False, weights)
    if unchecked.other_error is not None:
        return "loud", unchecked.other_error
    correct = agrees(program, unchecked, want)
    checked = run(program, True, weights)
    if checked.type_error is not None:
        return ("caught" if not correct else "false positive"), checked.type_error
    if checked.other_error is not None:
        return "loud", checked.other_error
    if not agrees(program, checked, want):
        return "silently wrong", "checked run differs from the reference"
    return ("right" if correct else "silently wrong"), ""
