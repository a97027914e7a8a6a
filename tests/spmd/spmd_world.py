"""A simulated world for the manual region: every rank a thread of this process, every collective computed on
the members' real tensors (and differentiated: each backward is the collective that carries the gradient back),
so that a region's sharded result and gradients can be compared with one process's, hundreds of programs a
second. The members meet at a barrier for each collective, forward or backward; a member that fails breaks it,
so the others stop instead of waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

import fmesh

PATIENCE = 10.0  # seconds a member waits at a collective for the others


class World:
    """``size`` ranks over ``mesh``; :meth:`run` calls ``fn(member)`` on each, in its own thread."""

    def __init__(self, mesh: fmesh.Mesh) -> None:
        self.mesh = mesh
        self.size = mesh.size
        self.barrier = threading.Barrier(self.size, timeout=PATIENCE)
        self.slots: dict[int, list[Any]] = {}
        self.lock = threading.Lock()

    def run(self, fn: Callable[[Member], Any]) -> list[Any]:
        """Each rank's result (or the exception it raised)."""
        results: list[Any] = [None] * self.size

        def main(rank: int) -> None:
            try:
                results[rank] = fn(Member(self, rank))
            except BaseException as error:
                results[rank] = error
                self.barrier.abort()
        threads = [threading.Thread(target=main, args=(rank,), daemon=True) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(PATIENCE * 4)
        self.barrier.reset()
        self.slots.clear()
        return results


class Member:
    """One rank of a :class:`World`: the region's collectives (:class:`fmesh.spmd.region.Collectives`)."""

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank, self.calls = world, rank, 0

    def members(self, mesh: fmesh.Mesh, axes: Any) -> tuple[int, ...]:
        return mesh.group(self.rank, axes)

    def index(self, mesh: fmesh.Mesh, axes: Any = None) -> int:
        return self.members(mesh, axes).index(self.rank)

    def exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` of this collective (all ranks call each collective, in the same order)."""
        world = self.world
        key = self.calls
        self.calls += 1
        with world.lock:
            world.slots.setdefault(key, [None] * world.size)[self.rank] = tensor.detach()
        world.barrier.wait()
        found = list(world.slots[key])
        world.barrier.wait()
        if self.rank == 0:
            with world.lock:
                world.slots.pop(key, None)
        return found

    def group_values(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any) -> list[torch.Tensor]:
        every = self.exchange(tensor)
        return [every[r] for r in self.members(mesh, axes)]

    # the collectives, each an autograd Function over exchange()

    def sum_partials(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None) -> torch.Tensor:
        return _Apply.apply(tensor, self, lambda t: torch.stack(self.group_values(t, mesh, axes)).sum(0),
                            lambda g: g)

    def sum_gradients(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None) -> torch.Tensor:
        return _Apply.apply(tensor, self, lambda t: t.clone(),
                            lambda g: torch.stack(self.group_values(g, mesh, axes)).sum(0))

    def all_reduce(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None, op: str = "sum") -> torch.Tensor:
        reduce = {"sum": lambda s: s.sum(0), "max": lambda s: s.amax(0), "min": lambda s: s.amin(0)}[op]
        out = reduce(torch.stack(self.group_values(tensor, mesh, axes)))
        if op != "sum":
            return out
        return _Apply.apply(tensor, self, lambda t: out, lambda g: torch.stack(self.group_values(g, mesh, axes)).sum(0))

    def all_gather(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor:
        def back(g: torch.Tensor) -> torch.Tensor:
            return self._scatter(g, mesh, axes, dim)
        return _Apply.apply(tensor, self, lambda t: torch.cat(self.group_values(t, mesh, axes), dim), back)

    def _scatter(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any, dim: int) -> torch.Tensor:
        total = torch.stack(self.group_values(tensor, mesh, axes)).sum(0)
        n = len(self.members(mesh, axes))
        return total.chunk(n, dim)[self.index(mesh, axes)].clone()

    def reduce_scatter(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor:
        return _Apply.apply(tensor, self, lambda t: self._scatter(t, mesh, axes, dim),
                            lambda g: torch.cat(self.group_values(g, mesh, axes), dim))

    def _all_to_all(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any, split: int, concat: int) -> torch.Tensor:
        n, me = len(self.members(mesh, axes)), self.index(mesh, axes)
        return torch.cat([v.chunk(n, split)[me] for v in self.group_values(tensor, mesh, axes)], concat)

    def all_to_all(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axes: Any = None, split_dim: int = 0,
                   concat_dim: int = 0) -> torch.Tensor:
        return _Apply.apply(tensor, self, lambda t: self._all_to_all(t, mesh, axes, split_dim, concat_dim),
                            lambda g: self._all_to_all(g, mesh, axes, concat_dim, split_dim))

    def _permute(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axis: str, perm: Sequence[tuple[int, int]]
                 ) -> torch.Tensor:
        values = self.group_values(tensor, mesh, axis)
        me = self.index(mesh, axis)
        source = next((s for s, d in perm if d == me), None)
        return values[source].clone() if source is not None else torch.zeros_like(tensor)

    def ppermute(self, tensor: torch.Tensor, mesh: fmesh.Mesh, axis: str, perm: Sequence[tuple[int, int]]
                 ) -> torch.Tensor:
        inverse = [(d, s) for s, d in perm]
        return _Apply.apply(tensor, self, lambda t: self._permute(t, mesh, axis, perm),
                            lambda g: self._permute(g, mesh, axis, inverse))

    def materialize(self, *items: Any) -> None:
        return None


class _Apply(torch.autograd.Function):
    """``forward(x)`` forward, ``backward(grad)`` backward: one simulated collective."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, member: Member, forward: Any, backward: Any) -> torch.Tensor:
        ctx.back = backward
        return forward(tensor.detach())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return ctx.back(grad.contiguous()), None, None, None
