"""torch's side of the differential tests: a fake world in this process, and torch's own groups."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist

from fmesh.context import device_mesh_groups


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """torch's fake backend for ``world_size`` ranks, seen from ``rank``; torn down afterwards."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def torch_groups(device_mesh: Any, dims: Sequence[int]) -> set[tuple[int, ...]]:
    """Every group torch would create for these dims of a DeviceMesh (what ``_init_process_groups`` uses)."""
    return device_mesh_groups(device_mesh, dims)
