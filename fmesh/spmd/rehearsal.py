"""What a manual region asks of its context (``Collectives``: the :class:`~fmesh.Context` is one), and the
check's stand-in for it (``Rehearsal``): each collective computed locally at the right shape, no
communication, the axes it names noted; and the random state kept around a rehearsal (``random_state_kept``)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from fmesh.mesh import Mesh


class Collectives(Protocol):
    """What the region asks of its context: :class:`~fmesh.Context` is one; the check's rehearsal and the tests'
    simulated world are others."""

    def index(self, mesh: Mesh, axes: Any = None) -> int: ...
    def sum_partials(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None) -> torch.Tensor: ...
    def sum_gradients(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None) -> torch.Tensor: ...
    def all_gather(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor: ...
    def reduce_scatter(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor: ...
    def all_to_all(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, split_dim: int = 0,
                   concat_dim: int = 0) -> torch.Tensor: ...
    def all_reduce(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, op: Any = "sum") -> torch.Tensor: ...
    def ppermute(self, tensor: torch.Tensor, mesh: Mesh, axis: str, perm: Sequence[tuple[int, int]]) -> torch.Tensor:
        ...
    def materialize(self, *items: Any) -> Any: ...


class Rehearsal:
    """The check's collectives: each computed locally at the right shape (no communication); it notes the axes
    each names, so that the region can make their groups."""

    def __init__(self, ctx: Collectives) -> None:
        self.ctx = ctx
        self.named: set[tuple[str, ...]] = set()

    def _note(self, mesh: Mesh, axes: Any) -> int:
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        self.named.add(names)
        size = 1
        for name in names:
            size *= mesh.shape[name]
        return size

    def index(self, mesh: Mesh, axes: Any = None) -> int:
        return self.ctx.index(mesh, axes)

    def sum_partials(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None) -> torch.Tensor:
        self._note(mesh, axes)
        return tensor.clone()

    def sum_gradients(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None) -> torch.Tensor:
        self._note(mesh, axes)
        return tensor.clone()

    def all_reduce(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, op: Any = "sum") -> torch.Tensor:
        self._note(mesh, axes)
        return tensor.clone()

    def all_gather(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor:
        return torch.cat([tensor] * self._note(mesh, axes), dim)

    def reduce_scatter(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, dim: int = 0) -> torch.Tensor:
        n = self._note(mesh, axes)
        return tensor.chunk(n, dim)[self.ctx.index(mesh, axes)].clone()

    def all_to_all(self, tensor: torch.Tensor, mesh: Mesh, axes: Any = None, split_dim: int = 0,
                   concat_dim: int = 0) -> torch.Tensor:
        return torch.cat(tensor.chunk(self._note(mesh, axes), split_dim), concat_dim)

    def ppermute(self, tensor: torch.Tensor, mesh: Mesh, axis: str, perm: Sequence[tuple[int, int]]) -> torch.Tensor:
        self._note(mesh, axis)
        return tensor.clone()

    def materialize(self, *items: Any) -> None:
        return None




# Why a lock and no collection: torch's get_rng_state locks the generator with the GIL held, then wraps the state in a
# tensor; a collection that runs there may free a tensor and let the GIL go, and a second thread asking for the state
# then holds the GIL while it waits for the generator: both wait for ever (torch 2.10-2.15; a region checked on
# several threads of one process, as the tests' simulated worlds run, hung). One state read or write at a time, with
# no collection inside, cannot deadlock. The lock guards the process's one generator: it is process-wide by nature.
_GENERATOR = threading.Lock()


@contextlib.contextmanager
def _generator_held() -> Iterator[None]:
    with _GENERATOR:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()


@contextlib.contextmanager
def random_state_kept(devices: Sequence[int] = ()) -> Iterator[None]:
    """``torch.random.fork_rng(devices)``, safe beside other threads: what runs inside draws random numbers as it
    would outside, and the CPU's (and the CUDA ``devices``') random state is as it was afterwards.

    >>> with random_state_kept():
    ...     drawn = torch.rand(2)
    >>> bool((torch.rand(2) == drawn).all())
    True
    """
    with _generator_held():
        cpu = torch.get_rng_state()
        cuda = [torch.cuda.get_rng_state(device) for device in devices]
    try:
        yield
    finally:
        with _generator_held():
            torch.set_rng_state(cpu)
            for device, state in zip(devices, cuda, strict=True):
                torch.cuda.set_rng_state(state, device)
