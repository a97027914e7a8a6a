"""Every use of torch.distributed's private API in fmesh, in one place (checked against torch 2.13).

* ``create_group``: a process group with a name fmesh chooses, created by its
  members only. ``dist.new_group`` would either need every rank of the world
  (sequential names) or derive the rendezvous name from how many groups this
  process already holds (``use_local_synchronization``), which differs between
  ranks that create groups lazily; a name derived from the group's content
  makes lazy creation by members alone safe.
* ``export_device_mesh`` / ``from_device_mesh``: ``DeviceMesh`` fields
  ``_layout``, ``_rank_map``, ``_dim_group_names``, ``_root_mesh``,
  ``_flatten_mapping`` and ``_pg_registry``.
* ``local_tensor_mode``: torch's ``LocalTensorMode``, every rank in one process (``fmesh.simulate``).
* The collectives torch renamed (``all_gather_single``, ``reduce_scatter_single``), by version.

No other fmesh module names anything private of torch; ``tests/test_architecture.py`` checks it.

``tests/test_torch_private.py`` pins each assumption made here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from fmesh.errors import UnsupportedTorchError

SUPPORTED = ((2, 10), (2, 15))
"""The torch releases the Context supports, oldest and newest (major, minor), both included."""


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string.

    >>> release("2.11.0+cu130"), release("2.15.0a0+git1234")
    ((2, 11), (2, 15))
    """
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedTorchError(f"cannot read the torch version {version!r}; fmesh expects 'major.minor...'")
    return int(found.group(1)), int(found.group(2))


def check_supported(version: str) -> tuple[int, int]:
    """``release(version)`` if the Context supports it; :class:`~fmesh.UnsupportedTorchError` otherwise.

    >>> check_supported("2.13.0+cpu")
    (2, 13)
    """
    found = release(version)
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    if not SUPPORTED[0] <= found <= SUPPORTED[1]:
        raise UnsupportedTorchError(
            f"fmesh's Context supports torch {low_major}.{low_minor} to {high_major}.{high_minor}, but torch "
            f"{version} is installed; install a supported release (pip install 'torch>={low_major}.{low_minor},"
            f"<{high_major}.{high_minor + 1}'). Mesh values, recipes and plans work with any torch"
        )
    return found


TORCH = check_supported(torch.__version__)  # before any private name: they differ outside the range

import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from fmesh.layout import Layout  # noqa: E402
from fmesh.mesh import Mesh, Universe  # noqa: E402


def default_store() -> dist.Store:
    """The default group's store (the one ``init_process_group`` made)."""
    return c10d._get_default_store()


# torch 2.13 deprecates the *_into_tensor/*_tensor names in favour of *_single.
all_gather_single: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single: Any = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def local_tensor_mode(world_size: int) -> Any:
    """torch's ``LocalTensorMode``: every rank's tensors and collectives in this process."""
    from torch.distributed._local_tensor import LocalTensorMode

    return LocalTensorMode(world_size)


def bound_device(group: dist.ProcessGroup | None = None) -> torch.device | None:
    """The device the default group was bound to (eager NCCL init), if any."""
    group = group if group is not None else c10d._get_default_group()
    return getattr(group, "bound_device_id", None)


def create_group(
    ranks: Sequence[int],
    name: str,
    *,
    rank: int,
    backend: str,
    timeout: timedelta,
    options: Any = None,
    description: str = "fmesh",
) -> dist.ProcessGroup:
    """A group of ``ranks`` (in this order: group rank i is ``ranks[i]``), created by its members only.

    ``rank`` is this process's global rank, from the Context: inside torch's ``LocalTensorMode``
    (``fmesh.simulate``) ``dist.get_rank()`` is symbolic from torch 2.14.
    """
    me = rank
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of group {list(ranks)}; only members create a group")
    store = c10d._world.pg_map[c10d._get_default_group()][1]
    group, _ = c10d._new_process_group_helper(
        len(ranks),
        list(ranks).index(me),
        list(ranks),
        backend,
        store,
        name,
        backend_options=options,
        timeout=timeout,
        group_desc=description,
    )
    c10d._world.pg_group_ranks[group] = {rank: index for index, rank in enumerate(ranks)}
    return group


def split_groups(
    partition: Sequence[Sequence[int]],
    *,
    timeout: timedelta,
    options: Any = None,
    description: str = "fmesh",
) -> dist.ProcessGroup | None:
    """One ``ncclCommSplit`` for a whole partition of the world; every rank must call it."""
    return dist.split_group(
        parent_pg=c10d._get_default_group(),
        split_ranks=[list(ranks) for ranks in partition],
        timeout=timeout,
        pg_options=options,
        group_desc=description,
    )


def _registered(group: dist.ProcessGroup | None) -> bool:
    return group is None or group in c10d._world.pg_map


def destroy_group(group: dist.ProcessGroup) -> None:
    """Destroy ``group`` in the orderly way (its pending work finishes); one aborted already is gone."""
    if _registered(group):
        dist.destroy_process_group(group)


def abort_group(group: dist.ProcessGroup | None = None) -> None:
    """Tear ``group`` (``None``: every group, the default one too) down without waiting for peers."""
    if _registered(group):
        c10d._abort_process_group(group)


def release_groups(root: DeviceMesh) -> None:
    """Let go of the groups an exported root mesh keeps alive (its ``_pg_registry`` and names)."""
    registry = getattr(root, "_pg_registry", None)
    if registry is not None:
        registry.clear()
    root._flatten_mapping.clear()


def host_store(port: int, world_size: int, timeout: float) -> dist.Store:
    """A store server on loopback for ``world_size`` clients, as torchrun's agent hosts one."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=True, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)


def group_count() -> int:
    """How many process groups this process holds (the default group included)."""
    return len(c10d._world.pg_map)


def _mesh_layout(layouts: Sequence[Layout]) -> _MeshLayout:
    return _MeshLayout([_FlatLayout(tuple(s for s, _ in lay.modes), tuple(d for _, d in lay.modes)) for lay in layouts])


def rank_map_tensor(universe: Universe) -> torch.Tensor:
    return torch.tensor(list(universe.rank_map), dtype=torch.int)


def export_root(universe: Universe, device_type: str) -> DeviceMesh:
    """A 1-D world DeviceMesh that every mesh exported from ``universe`` shares as its root.

    ``DeviceMesh._concatenate`` (which FSDP2 calls on its dp and tp meshes)
    demands one rank map; sharing a root also shares ``_flatten_mapping``.
    """
    return DeviceMesh(
        device_type,
        _layout=_mesh_layout([Layout(universe.world_size)]),
        _rank_map=rank_map_tensor(universe),
        mesh_dim_names=("fmesh_world",),
        _init_backend=False,
    )


def export_device_mesh(mesh: Mesh, root: DeviceMesh, groups: Sequence[dist.ProcessGroup]) -> DeviceMesh:
    """A DeviceMesh for ``mesh`` whose dims use ``groups`` (one per axis, this rank's)."""
    exported = DeviceMesh(
        root.device_type,
        _layout=_mesh_layout(mesh.layouts),
        _rank_map=root._rank_map,
        mesh_dim_names=mesh.axis_names,
        _root_mesh=root,
        _init_backend=False,
    )
    exported._dim_group_names = [group.group_name for group in groups]
    for group in groups:
        root._pg_registry[group.group_name] = group
    return exported


def register_flattened(root: DeviceMesh, name: str, one_axis: DeviceMesh) -> None:
    """Let ``mesh._flatten(name)`` and DTensor's flattened-collective lookup find our 1-D mesh."""
    if name not in root._flatten_mapping:
        root._flatten_mapping[name] = one_axis


def unregister_flattened(root: DeviceMesh, name: str) -> None:
    """Withdraw ``name`` from the root's ``_flatten_mapping`` (see ``Context._register_names``)."""
    root._flatten_mapping.pop(name, None)


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
    rank_map = device_mesh._rank_map.reshape(-1).tolist()
    world = len(rank_map)
    if sorted(rank_map) != list(range(world)):
        raise ValueError(
            f"this DeviceMesh's rank map {rank_map[:16]}{'...' if world > 16 else ''} is not a permutation of "
            f"range(0, {world}); fmesh needs a mesh over the whole world (build the root with all ranks)"
        )
    layouts = [Layout(tuple(axis.shape), tuple(axis.stride)) for axis in device_mesh._layout]
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(len(layouts)))
    universe = Universe(world, rank_map=rank_map, device_type=device_mesh.device_type)
    return Mesh(universe, names, layouts)
