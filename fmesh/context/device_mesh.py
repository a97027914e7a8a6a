"""fmesh meshes from torch ``DeviceMesh`` objects, and the groups a ``DeviceMesh`` stands for.

Public functions over :mod:`fmesh.context._torch`'s readers of a ``DeviceMesh``'s private fields (its layout and
rank map), so that no public name lives in the module of private ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import DeviceMesh

from fmesh.context import _torch
from fmesh.mesh import Mesh, Universe

__all__ = ["device_mesh_groups", "from_device_mesh", "process_group_count"]


def device_mesh_groups(device_mesh: DeviceMesh, dims: Sequence[int]) -> set[tuple[int, ...]]:
    """Every group torch would make along ``dims`` of a DeviceMesh (all instances, every rank).

    >>> import torch.distributed as dist
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> dist.init_process_group("fake", rank=0, world_size=4)
    >>> sorted(device_mesh_groups(init_device_mesh("cpu", (2, 2)), [0]))
    [(0, 2), (1, 3)]
    >>> dist.destroy_process_group()
    """
    layouts = _torch.dim_layouts(device_mesh)
    return {tuple(row) for row in _torch.group_grid(device_mesh, [layouts[d] for d in dims])}


def from_device_mesh(device_mesh: DeviceMesh) -> Mesh:
    """The fmesh value of an existing ``DeviceMesh`` (its whole rank map is the universe).

    >>> import torch.distributed as dist
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> dist.init_process_group("fake", rank=0, world_size=8)
    >>> from_device_mesh(init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))["tp"])
    Mesh(tp=4; world=8)
    >>> dist.destroy_process_group()
    """
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"from_device_mesh takes a torch DeviceMesh, got {type(device_mesh).__name__}")
    rank_map = _torch.rank_map_of(device_mesh)
    world = len(rank_map)
    if sorted(rank_map) != list(range(world)):
        raise ValueError(
            f"this DeviceMesh's rank map {rank_map[:16]}{'...' if world > 16 else ''} is not a permutation of "
            f"range(0, {world}); fmesh needs a mesh over the whole world (build the root with all ranks)"
        )
    layouts = _torch.dim_layouts(device_mesh)
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(len(layouts)))
    universe = Universe(world, rank_map=rank_map, device_type=device_mesh.device_type)
    return Mesh(universe, names, layouts)


def process_group_count() -> int:
    """How many process groups torch holds in this process (the default group included; fmesh's and others').

    >>> import torch.distributed as dist
    >>> dist.init_process_group("fake", rank=0, world_size=2)
    >>> process_group_count()
    1
    >>> dist.destroy_process_group()
    """
    return _torch.group_count()
