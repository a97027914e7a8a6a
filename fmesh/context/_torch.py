"""Every use of torch.distributed's private API in fmesh, in one place, for torch 2.10 to 2.15.

* ``create_group``: a process group with a name fmesh chooses, created by its
  members only. ``dist.new_group`` would either need every rank of the world
  (sequential names) or derive the rendezvous name from how many groups this
  process already holds (``use_local_synchronization``), which differs between
  ranks that create groups lazily; a name derived from the group's content
  makes lazy creation by members alone safe.
* ``export_device_mesh`` / ``dim_layouts`` / ``rank_map_of`` / ``group_grid`` (the last three for
  ``fmesh.context.device_mesh``): ``DeviceMesh`` fields
  ``_layout``, ``_rank_map``, ``_dim_group_names``, ``_root_mesh``,
  ``_flatten_mapping`` and ``_pg_registry``.
* ``local_tensor_mode`` / ``local_values``: torch's ``LocalTensorMode``, every rank in one process
  (``fmesh.simulate``).
* ``dispatch_mode_base`` / ``torch_function_disabled`` (``fmesh.spmd.check``, the typed region's checker):
  ``torch.utils._python_dispatch.TorchDispatchMode`` and ``torch._C.DisableTorchFunction``.
* ``split_groups``: ``dist.split_group`` keeps each split's order from torch 2.14; before, it sorts
  the ranks, so an unsorted partition is made group by group instead (every rank taking part).
* ``detach_group`` / ``attach_group`` / ``abort_group(None)`` (``Context.recover``): c10d's ``_world`` registries
  (``pg_map``, ``pg_names``, ``pg_group_ranks``, ``pg_backend_config``, ``pg_to_tag``, ``tags_to_pg``),
  ``_register_process_group`` / ``_unregister_process_group`` and ``_abort_process_group(None)``: a group
  that lost no member is taken out of torch's registry while every other group and the default group are
  aborted in one call, and put back, renumbered, once the default group is made again over the survivors.
* The per-version layer, where releases differ (each pinned by ``tests/context/test_torch_private.py``):

  ============================  ==========================================  ==========================================
  what                          torch 2.10 - 2.12                           torch 2.13 - 2.15
  ============================  ==========================================  ==========================================
  a DeviceMesh's layout         one ``_MeshLayout(shape, stride)``, a       ``_MeshLayout([_FlatLayout, ...])``, a
                                nested mode per dim; ``_flatten`` makes a   ``_FlatLayout`` per dim
                                bare mode (``4:1``), a slice a tuple
                                (``(4,):(1,)``), and they compare unequal
  ``DeviceMesh._pg_registry``   from 2.11 (2.10 resolves groups by name)    yes
  collective names              ``all_gather_into_tensor``                  ``all_gather_single`` (2.13 warns on the
                                                                            old names)
  ``dist.split_group``          sorts each split's ranks: an unsorted       sorts them on 2.13; keeps their order from
                                partition is made group by group instead    2.14
  the ``fake`` backend's store  raises on every write                       raises on 2.13; a do-nothing store from
                                                                            2.14
  ``LocalTensorMode``           ``dist.get_rank()`` is the rank             the same on 2.13; symbolic from 2.14:
                                (``fmesh.simulate``)                        ``fmesh.simulate`` takes the rank from the
                                                                            Context
  ============================  ==========================================  ==========================================

No other fmesh module names anything private of torch; ``tests/system/test_architecture.py`` checks it.

``tests/context/test_torch_private.py`` pins each assumption made here.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import attrs
import torch

from fmesh.errors import UnsupportedTorchError, UntestedTorchWarning

SUPPORTED = ((2, 10), (2, 15))
"""The torch releases the Context is tested with, oldest and newest (major, minor), both included."""

REFUSE_UNTESTED = "FMESH_REFUSE_UNTESTED_TORCH"
"""Set to ``1``, a torch newer than the tested range is refused at import, as before probes existed."""


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string.

    >>> release("2.11.0+cu130"), release("2.15.0a0+git1234")
    ((2, 11), (2, 15))
    """
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedTorchError(f"cannot read the torch version {version!r}; fmesh expects 'major.minor...'")
    return int(found.group(1)), int(found.group(2))


def check_supported(version: str, refuse_untested: bool = False) -> tuple[int, int]:
    """``release(version)`` unless the Context cannot run on it: :class:`~fmesh.UnsupportedTorchError` for a torch
    older than the tested range, or newer when ``refuse_untested`` (a newer one runs, its private parts probed:
    :data:`MISSING`).

    >>> check_supported("2.13.0+cpu"), check_supported("2.16.0a0+git1234")
    ((2, 13), (2, 16))
    """
    found = release(version)
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    newer = SUPPORTED[1] < found
    if found < SUPPORTED[0] or (refuse_untested and newer):
        refused = f" ({REFUSE_UNTESTED}=1 refuses a newer one; unset it to run with a warning)" if newer else ""
        raise UnsupportedTorchError(
            f"fmesh's Context supports torch {low_major}.{low_minor} to {high_major}.{high_minor}, but torch "
            f"{version} is installed{refused}; install a supported release (pip install 'torch>={low_major}."
            f"{low_minor},<{high_major}.{high_minor + 1}'). Mesh values, recipes and plans work with any torch"
        )
    return found


TORCH = check_supported(torch.__version__, os.environ.get(REFUSE_UNTESTED) == "1")  # before any private name

import torch.distributed as dist  # noqa: E402

# torch's fake backend is registered by its testing module alone (fmesh's DTensor import used to load it)
import torch.testing._internal.distributed.fake_pg  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from fmesh.layout import Layout  # noqa: E402
from fmesh.mesh import Mesh, Universe  # noqa: E402
from fmesh.plan.communicators import can_shrink as shrink_rule  # noqa: E402

try:  # private modules: a torch that moved one loses the features that need it (MISSING), not the import
    from torch.distributed import _functional_collectives as funcol
except ImportError:  # pragma: no cover - a torch newer than the tested range
    funcol = None
try:
    from torch.distributed import _mesh_layout as mesh_layout
except ImportError:  # pragma: no cover - a torch newer than the tested range
    mesh_layout = None


def _parameters(fn: object) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return set()


def _mesh_attributes(*names: str) -> bool:
    """Whether ``DeviceMesh``'s own code still sets or reads each of ``names`` (attributes of an instance, which
    only a built mesh has: the names its functions use stand for them)."""
    used: set[str] = set()
    for value in vars(DeviceMesh).values():
        function = value.fget if isinstance(value, property) else value
        used.update(getattr(getattr(function, "__code__", None), "co_names", ()))
    return set(names) <= used


def _registries(*fields: str) -> bool:
    return all(isinstance(getattr(getattr(c10d, "_world", None), field, None), dict) for field in fields)


GROUPS = "lazy process groups"
RECOVERY = "recovery in place (Context.recover)"
EXPORT = "DeviceMesh export (ctx.device_mesh, FSDP2, DTensor)"
COMPILED = "collectives under torch.compile"
SIMULATE = "simulated ranks (fmesh.simulate)"
PROBES: dict[str, Callable[[], bool]] = {
    # feature: whether this torch has the private parts it needs, as tests/context/test_torch_private.py pins them
    GROUPS: lambda: all(hasattr(c10d, name) for name in (  # _set_pg_timeout: each gloo group's collective timeout
        "_new_process_group_helper", "_get_default_store", "_get_default_group", "_set_pg_timeout")) and (
        TORCH >= (2, 14) or hasattr(c10d, "_new_group_with_tag")) and {  # where a split sorts its ranks
        "backend_options", "timeout", "group_desc"} <= _parameters(getattr(c10d, "_new_process_group_helper", None))
        and _registries("pg_map", "pg_names", "pg_group_ranks"),
    RECOVERY: lambda: all(hasattr(c10d, name) for name in (
        "_register_process_group", "_unregister_process_group", "_abort_process_group")) and _registries(
        "pg_backend_config", "pg_to_tag", "tags_to_pg"),
    EXPORT: lambda: mesh_layout is not None and hasattr(
        mesh_layout, "_MeshLayout") and {"_layout", "_rank_map", "_root_mesh", "_init_backend"} <= _parameters(
        DeviceMesh.__init__) and _mesh_attributes("_flatten_mapping", "_dim_group_names"),
    COMPILED: lambda: funcol is not None and all(hasattr(funcol, name) for name in (
        "all_reduce", "all_to_all_single", "broadcast")),
    SIMULATE: lambda: importlib.util.find_spec("torch.distributed._local_tensor")
        is not None,
}
"""What each feature of the Context needs of torch's private API, checked once at import."""

MISSING: frozenset[str] = frozenset(name for name, probe in PROBES.items() if not probe())
"""The features this torch cannot run (a probe failed): each raises at its use, the rest run."""

if SUPPORTED[1] < TORCH:
    warnings.warn(UntestedTorchWarning(
        f"fmesh's Context is tested with torch {SUPPORTED[0][0]}.{SUPPORTED[0][1]} to {SUPPORTED[1][0]}."
        f"{SUPPORTED[1][1]}, but torch {torch.__version__} is installed: it runs, its private parts probed at "
        f"import ({'features off: ' + ', '.join(sorted(MISSING)) if MISSING else 'every probe passed'}). Set "
        f"{REFUSE_UNTESTED}=1 to refuse it instead"), stacklevel=2)


def require(feature: str) -> None:
    """:class:`~fmesh.UnsupportedTorchError` if ``feature`` (a key of :data:`PROBES`) cannot run on this torch.

    >>> require(GROUPS)
    """
    if feature in MISSING:
        raise UnsupportedTorchError(
            f"{feature} needs private parts of torch.distributed that torch {torch.__version__} lacks or changed "
            f"(fmesh is tested with torch {SUPPORTED[0][0]}.{SUPPORTED[0][1]} to {SUPPORTED[1][0]}."
            f"{SUPPORTED[1][1]}); install a tested torch, or do without {feature}")


# One _FlatLayout per dim from 2.13; before, one _MeshLayout whose top-level modes are the dims.
FLAT_LAYOUTS = hasattr(mesh_layout, "_FlatLayout")
SPLIT_KEEPS_ORDER = TORCH >= (2, 14)


def default_store() -> dist.Store:
    """The default group's store (the one ``init_process_group`` made)."""
    return c10d._get_default_store()


def store_client(store: dist.Store) -> dist.Store:
    """A connection of this Context's own to ``store``: a TCPStore client runs one operation at a time, so
    two contexts connecting groups from two threads over one client would wait for each other's waits."""
    try:
        return store.clone()
    except (AttributeError, RuntimeError):  # a store that cannot be cloned is shared
        return store


# torch 2.13 deprecates the *_into_tensor/*_tensor names in favour of *_single.
all_gather_single: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single: Any = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# Functional collectives: what a compiled region runs (Dynamo traces them into the graph; the in-place
# c10d calls and fmesh's failure explanation around them stay in eager). Names as in 2.10 - 2.15.
_funcol_gather: Any = getattr(funcol, "all_gather_single", None) or getattr(funcol, "all_gather_tensor", None)
_funcol_scatter: Any = getattr(funcol, "reduce_scatter_single", None) or getattr(funcol, "reduce_scatter_tensor",
                                                                                 None)


def traced_all_reduce(tensor: torch.Tensor, op: str, group: dist.ProcessGroup) -> torch.Tensor:
    """A functional ``all_reduce`` (``op`` one of sum, max, min, product) that Dynamo traces."""
    require(COMPILED)
    return funcol.all_reduce(tensor, op, group)


def traced_all_gather(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """A functional ``all_gather`` along ``dim`` that Dynamo traces."""
    require(COMPILED)
    return _funcol_gather(tensor, dim, group)


def traced_reduce_scatter(tensor: torch.Tensor, op: str, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """A functional ``reduce_scatter`` along ``dim`` that Dynamo traces."""
    require(COMPILED)
    return _funcol_scatter(tensor, op, dim, group)


def traced_all_to_all(tensor: torch.Tensor, output_splits: list[int] | None, input_splits: list[int] | None,
                      group: dist.ProcessGroup) -> torch.Tensor:
    """A functional ``all_to_all_single`` along dim 0 (even chunks when the splits are ``None``)."""
    require(COMPILED)
    return funcol.all_to_all_single(tensor, output_splits, input_splits, group)


def traced_broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """A functional ``broadcast`` from member ``src`` (its rank within ``group``: the op's root rank goes to
    the backend as it is, unlike ``dist.broadcast``'s global ``src``) that Dynamo traces."""
    require(COMPILED)
    return funcol.broadcast(tensor, src, group)


def dispatch_mode_base() -> Any:
    """torch's ``TorchDispatchMode`` (``torch.utils._python_dispatch``), the base of a mode that sees every aten
    call: the typed manual region's checker (:mod:`fmesh.spmd.check`) derives from it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def torch_function_disabled() -> Any:
    """A context in which tensors' ``__torch_function__`` overrides are not called (``torch._C.DisableTorchFunction``):
    the typed region's checker makes calls of its own there, which the program's typing must not count."""
    return torch._C.DisableTorchFunction()


def local_tensor_mode(world_size: int) -> Any:
    """torch's ``LocalTensorMode``: every rank's tensors and collectives in this process."""
    require(SIMULATE)
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
    store: dist.Store | None = None,
) -> dist.ProcessGroup:
    """A group of ``ranks`` (in this order: group rank i is ``ranks[i]``), created by its members only,
    meeting in ``store`` (default: the default group's).

    ``rank`` is this process's global rank, from the Context: inside torch's ``LocalTensorMode``
    (``fmesh.simulate``) ``dist.get_rank()`` is symbolic from torch 2.14.
    """
    require(GROUPS)
    me = rank
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of group {list(ranks)}; only members create a group")
    store = store if store is not None else c10d._world.pg_map[c10d._get_default_group()][1]
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
    rank: int,
    timeout: timedelta,
    options: Any = None,
    description: str = "fmesh",
) -> dist.ProcessGroup | None:
    """This rank's group of a whole partition of the world, made from the device-bound default group;
    every rank must call it, with the same partition. One ``ncclCommSplit`` where torch keeps each
    split's order (or the partition's groups ascend); else one group at a time, in order."""
    parent = c10d._get_default_group()
    if SPLIT_KEEPS_ORDER or all(list(ranks) == sorted(ranks) for ranks in partition):
        group = dist.split_group(parent_pg=parent, split_ranks=[list(ranks) for ranks in partition], timeout=timeout,
                                 pg_options=options, group_desc=description)
    else:
        require(GROUPS)
        group = None
        for ranks in partition:  # torch <= 2.13 sorts each split: make every group in its own order
            made = c10d._new_group_with_tag(list(ranks), timeout=timeout, backend_options=options,
                                            group_desc=description, sort_ranks=False)
            if rank in ranks:
                group = made
    if group is None or group is c10d.GroupMember.NON_GROUP_MEMBER:
        return None
    mine = next(list(ranks) for ranks in partition if rank in ranks)
    if dist.get_process_group_ranks(group) != mine:  # never a group whose order is not the mesh's
        raise RuntimeError(f"torch {torch.__version__} made the group {dist.get_process_group_ranks(group)}, "
                           f"not {mine} in that order; fmesh cannot use it (please report this)")
    return group


def registered(group: dist.ProcessGroup | None) -> bool:
    """Whether torch still knows ``group`` (``None``: the default group): not destroyed, not aborted."""
    return group in c10d._world.pg_map if group is not None else dist.is_initialized()


def destroy_group(group: dist.ProcessGroup) -> None:
    """Destroy ``group`` in the orderly way (its pending work finishes); one aborted already is gone."""
    if registered(group):
        dist.destroy_process_group(group)


def abort_group(group: dist.ProcessGroup | None = None) -> None:
    """Tear ``group`` down without waiting for peers; ``None``: every group torch still knows, the default one
    too, in one call (NCCL's aborts then run inside one ``ncclGroupStart``/``End``: aborting communicators one
    at a time can hang, torch issue 173815)."""
    if registered(group):
        c10d._abort_process_group(group)


@attrs.frozen
class Detached:
    """A group taken out of torch's registry (so that ``abort_group(None)`` leaves it alone), with what torch
    knew of it; :func:`attach_group` puts it back under new global ranks."""

    group: dist.ProcessGroup
    entry: Any  # torch's (backend, store) of the group
    name: str
    config: Any
    tag: str | None


def detach_group(group: dist.ProcessGroup) -> Detached:
    """Take ``group`` out of torch's registry (its connections stay open)."""
    require(RECOVERY)
    world = c10d._world
    entry = world.pg_map.pop(group)
    name = world.pg_names.pop(group)
    world.pg_group_ranks.pop(group, None)
    config = world.pg_backend_config.pop(group, None)
    tag = world.pg_to_tag.pop(group, None)
    if tag is not None and group in world.tags_to_pg.get(tag, []):
        world.tags_to_pg[tag].remove(group)
    c10d._unregister_process_group(name)
    return Detached(group, entry, name, config, tag)


def attach_group(detached: Detached, ranks: Sequence[int]) -> dist.ProcessGroup:
    """Register a detached group again, its member ``i`` now global rank ``ranks[i]`` (of the new default
    group): the gloo communicator keeps its own member numbering and connections, which the default group's
    renewal does not touch."""
    world, group = c10d._world, detached.group
    world.pg_map[group] = detached.entry
    world.pg_names[group] = detached.name
    world.pg_group_ranks[group] = {rank: index for index, rank in enumerate(ranks)}
    world.pg_backend_config[group] = detached.config
    if detached.tag is not None:
        world.pg_to_tag[group] = detached.tag
        world.tags_to_pg.setdefault(detached.tag, []).append(group)
    c10d._register_process_group(detached.name, group)
    return group


def can_shrink(backend: str) -> bool:
    """Whether a communicator of ``backend`` can drop lost members in place here:
    :func:`fmesh.plan.communicators.can_shrink`
    (NCCL >= 2.27) with this torch and this NCCL, and a torch build that has ``dist.shrink_group``."""
    if not hasattr(dist, "shrink_group") or not torch.cuda.is_available():
        return False
    return shrink_rule(backend, TORCH, tuple(torch.cuda.nccl.version()))


def shrink_group(group: dist.ProcessGroup, exclude: Sequence[int]) -> dist.ProcessGroup:
    """``group`` without its members ``exclude`` (indices in the group), ongoing work aborted; every
    surviving member calls it."""
    shrunk: dist.ProcessGroup = dist.shrink_group(list(exclude), group, shrink_flags=c10d.SHRINK_ABORT)
    return shrunk


def reconfigurable() -> bool:
    """Whether this torch's ``init_process_group`` can make a default group that is reconfigured in place after a loss
    (``enable_reconfigure``, which issue 38 reports on torch's main branch): where it can, a recovery could reconfigure
    the default group instead of aborting it and making a new one. torch 2.13 has no such parameter (checked by this
    probe), and nothing here uses it yet: :meth:`fmesh.Context.recover` makes the default group anew.

    >>> reconfigurable() in (True, False)
    True
    """
    return "enable_reconfigure" in _parameters(dist.init_process_group)


def timeout_settable() -> bool:
    """Whether a group's collective timeout can be changed once it is made (:func:`set_group_timeout`): where it
    cannot, a group connects under the timeout its collectives keep.

    >>> timeout_settable()
    True
    """
    return GROUPS not in MISSING


def set_group_timeout(group: dist.ProcessGroup | None, timeout: timedelta) -> None:
    """Give ``group``'s collectives ``timeout`` (it was connected under a shorter one); ``None``: the default group."""
    require(GROUPS)
    c10d._set_pg_timeout(timeout, group)


def release_groups(root: DeviceMesh) -> None:
    """Let go of the groups an exported root mesh keeps alive (its ``_pg_registry`` and names)."""
    registry = getattr(root, "_pg_registry", None)
    if registry is not None:
        registry.clear()
    root._flatten_mapping.clear()


def root_store(store: dist.Store) -> dist.Store:
    """The store under every ``PrefixStore`` wrapping ``store`` (the launcher's, for an ``env://`` launch)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def group_count() -> int:
    """How many process groups this process holds (the default group included)."""
    return len(c10d._world.pg_map)


def _modes(layout: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    # A size-1 dim is (1,):(1,): torch slices fail on () or stride 0 (seen on 2.10 - 2.12).
    modes = layout.modes or ((1, 1),)
    return tuple(s for s, _ in modes), tuple(d for _, d in modes)


def _mesh_layout(layouts: Sequence[Layout], *, flattened: bool = False) -> Any:
    """torch's layout of a mesh whose dims are ``layouts``, in the form this release builds.

    torch 2.10 - 2.12 compare forms, not values: a mesh ``_flatten`` makes is a bare mode (``4:1``)
    while a root or slice has a tuple per mesh (``(4,):(1,)``), and ``_flatten(name)`` refuses a
    registered mesh of the other form. ``flattened`` asks for ``_flatten``'s form (fmesh registers
    its 1-D exports under their names).
    """
    dims = [_modes(layout) for layout in layouts]
    if FLAT_LAYOUTS:
        return mesh_layout._MeshLayout([mesh_layout._FlatLayout(shape, stride) for shape, stride in dims])
    one = [(shape[0], stride[0]) if len(shape) == 1 else (shape, stride) for shape, stride in dims]
    if flattened and len(one) == 1:
        shape, stride = one[0]
        return mesh_layout._MeshLayout(shape, stride) if len(dims[0][0]) == 1 else mesh_layout._MeshLayout(
            (shape,), (stride,))
    return mesh_layout._MeshLayout(tuple(shape for shape, _ in one), tuple(stride for _, stride in one))


def dim_layouts(device_mesh: DeviceMesh) -> list[Layout]:
    """Each dim's layout of a DeviceMesh, as fmesh layouts (the inverse of :func:`_mesh_layout`)."""
    layout = device_mesh._layout
    dims = list(layout) if FLAT_LAYOUTS else [layout[i] for i in range(len(layout))]
    return [Layout(dim.shape, dim.stride) for dim in dims]


def rank_map_of(device_mesh: DeviceMesh) -> list[int]:
    """A DeviceMesh's rank map, flat: slot ``i`` holds rank ``rank_map_of(dm)[i]``."""
    ranks: list[int] = device_mesh._rank_map.reshape(-1).tolist()
    return ranks


def group_grid(device_mesh: DeviceMesh, layouts: Sequence[Layout]) -> list[list[int]]:
    """The ranks of every group whose layout is ``layouts`` over a DeviceMesh's rank map, one row each."""
    grid = _mesh_layout(layouts).remap_to_tensor(device_mesh._rank_map)
    rows: list[list[int]] = grid.reshape(grid.shape[0], -1).tolist()
    return rows


def local_values(tensor: torch.Tensor) -> dict[int, torch.Tensor] | None:
    """Each simulated rank's value of a ``LocalTensor`` (``None`` for a plain tensor)."""
    local = getattr(tensor, "_local_tensors", None)
    return None if local is None else dict(local)


def rank_map_tensor(universe: Universe) -> torch.Tensor:
    return torch.tensor(list(universe.rank_map), dtype=torch.int)


def export_root(universe: Universe, device_type: str) -> DeviceMesh:
    """A 1-D world DeviceMesh that every mesh exported from ``universe`` shares as its root.

    ``DeviceMesh._concatenate`` (which FSDP2 calls on its dp and tp meshes)
    demands one rank map; sharing a root also shares ``_flatten_mapping``.
    """
    require(EXPORT)
    root = DeviceMesh(
        device_type,
        _layout=_mesh_layout([Layout(universe.world_size)]),
        _rank_map=rank_map_tensor(universe),
        mesh_dim_names=("fmesh_world",),
        _init_backend=False,
    )
    # Dynamo reads `_dim_group_names` of every DeviceMesh it meets (the root too, through get_group); a root
    # made without a backend has none. The root has no group of its own: an empty list says so.
    root._dim_group_names = []
    return root


def export_device_mesh(mesh: Mesh, root: DeviceMesh, groups: Sequence[dist.ProcessGroup]) -> DeviceMesh:
    """A DeviceMesh for ``mesh`` whose dims use ``groups`` (one per axis, this rank's)."""
    exported = DeviceMesh(
        root.device_type,
        _layout=_mesh_layout(mesh.layouts, flattened=mesh.ndim == 1),
        _rank_map=root._rank_map,
        mesh_dim_names=mesh.axis_names,
        _root_mesh=root,
        _init_backend=False,
    )
    exported._dim_group_names = [group.group_name for group in groups]
    registry = getattr(root, "_pg_registry", None)  # from torch 2.11; 2.10 resolves groups by name
    if registry is not None:
        for group in groups:
            registry[group.group_name] = group
    return exported


ROOT_ABORTS = hasattr(DeviceMesh, "abort")  # torch 2.15: the root aborts its dims' and _flatten_mapping's groups


def register_for_abort(root: DeviceMesh, exported: DeviceMesh) -> None:
    """Let torch 2.15's ``root.abort()`` reach ``exported``'s groups: the root has no group of its own and
    aborts those of the meshes in its ``_flatten_mapping``, where a 1-D export is already (under its axis
    name); a larger one goes under a name no axis can have (``fmesh/abort/<its group names>``)."""
    if ROOT_ABORTS and exported.ndim > 1:
        root._flatten_mapping.setdefault(f"fmesh/abort/{','.join(exported._dim_group_names)}", exported)


def register_flattened(root: DeviceMesh, name: str, one_axis: DeviceMesh) -> None:
    """Let ``mesh._flatten(name)`` and DTensor's flattened-collective lookup find our 1-D mesh."""
    if name not in root._flatten_mapping:
        root._flatten_mapping[name] = one_axis


def unregister_flattened(root: DeviceMesh, name: str) -> None:
    """Withdraw ``name`` from the root's ``_flatten_mapping`` (see ``Context._register_names``)."""
    root._flatten_mapping.pop(name, None)
