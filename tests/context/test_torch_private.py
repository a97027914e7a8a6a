"""Pins every assumption ``fmesh/context/_torch.py`` makes about torch.distributed's private API,
against the installed torch. When torch changes one of them, a test here names it.

Single process on the ``fake`` backend where possible; 2 gloo processes where values matter.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fake_torch import fake_world
from support import launch, succeeded
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import fmesh
from fmesh.context import _torch
from fmesh.layout import Layout


@pytest.fixture
def fake4() -> Iterator[None]:
    """A fake world of 4 seen from rank 1."""
    with fake_world(4, rank=1):
        yield


def _params(fn: Any) -> set[str]:
    return set(inspect.signature(fn).parameters)


# ------------------------------------------------------------------------------------------ create_group


def test_new_process_group_helper_signature() -> None:
    params = _params(c10d._new_process_group_helper)
    positional = list(inspect.signature(c10d._new_process_group_helper).parameters)[:6]
    assert positional == ["group_size", "group_rank", "global_ranks_in_group", "backend", "store", "group_name"]
    assert {"backend_options", "timeout", "group_desc"} <= params


def test_world_registry_fields() -> None:
    for field in ("pg_map", "pg_names", "pg_group_ranks"):
        assert isinstance(getattr(c10d._world, field), dict), field
    assert callable(c10d._get_default_store) and callable(c10d._get_default_group)
    assert {"parent_pg", "split_ranks", "timeout", "pg_options", "group_desc"} <= _params(dist.split_group)


@pytest.mark.usefixtures("fake4")
def test_create_group_registers_our_name_and_order() -> None:
    before = _torch.group_count()
    assert before == len(c10d._world.pg_map) == 1  # the default group only
    assert isinstance(c10d._world.pg_map[c10d._get_default_group()][1], dist.Store)  # the store create_group uses
    group = _torch.create_group([3, 1, 0], "fmesh-test:0:abc", rank=1, backend="fake", timeout=timedelta(seconds=7))
    assert _torch.group_count() == before + 1
    assert group.group_name == "fmesh-test:0:abc"
    assert c10d._world.pg_names[group] == "fmesh-test:0:abc"
    assert c10d._resolve_process_group("fmesh-test:0:abc") is group  # how DeviceMesh.get_group finds it
    assert dist.get_process_group_ranks(group) == [3, 1, 0]  # our order, not sorted
    assert dist.get_group_rank(group, 1) == 1 and dist.get_global_rank(group, 0) == 3
    assert group.size() == 3 and group.rank() == 1
    with pytest.raises(ValueError, match="not a member"):
        _torch.create_group([0, 2], "fmesh-test:0:def", rank=1, backend="fake", timeout=timedelta(seconds=7))
    dist.destroy_process_group(group)  # what Context.close does with each of its groups
    assert _torch.group_count() == before and group not in c10d._world.pg_names


@pytest.mark.usefixtures("fake4")
def test_bound_device_and_fake_store() -> None:
    # Context chooses member-only creation when the default group is bound to no device.
    assert _torch.bound_device() is None
    # The agreement is skipped on the fake backend: its store cannot hold anything. Up to torch 2.13 it
    # raises on a write; from 2.14 it is a do-nothing store (what is written cannot be read back).
    store = _torch.default_store()
    if _torch.TORCH <= (2, 13):
        with pytest.raises(RuntimeError):
            store.set("fmesh/probe", "1")
    else:
        store.set("fmesh/probe", "1")
        assert store.get("fmesh/probe") == b"" and store.add("fmesh/count", 1) == store.add("fmesh/count", 1)


def created_in_our_order(ctx: fmesh.Context) -> dict[str, Any]:
    """On the gloo default group a launched Context made: our group [1, 0], made by its members."""
    rank = ctx.rank
    # Created by its members under a content-derived name; group rank 0 is global rank 1.
    group = _torch.create_group([1, 0], "fmesh-private:reversed", rank=rank, backend="gloo",
                                timeout=timedelta(seconds=30))
    gathered = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(gathered, torch.tensor([float(rank)]), group=group)
    out = torch.zeros(2)
    _torch.all_gather_single(out, torch.tensor([float(rank)]), group=group)
    src0 = torch.tensor([float(rank)])
    dist.broadcast(src0, src=dist.get_global_rank(group, 0), group=group)
    result = {
        "list": [t.item() for t in gathered], "tensor": out.tolist(), "broadcast": src0.item(),
        "group_rank": group.rank(), "ranks": dist.get_process_group_ranks(group),
    }
    dist.destroy_process_group(group)
    return result


@pytest.mark.slow
def test_create_group_order_is_the_collectives_order_on_gloo() -> None:
    for rank, result in enumerate(succeeded(launch(created_in_our_order, 2, timeout=90))):
        assert result["ranks"] == [1, 0]
        assert result["group_rank"] == 1 - rank
        assert result["list"] == [1.0, 0.0] and result["tensor"] == [1.0, 0.0]  # gathered in group-rank order
        assert result["broadcast"] == 1.0


# ------------------------------------------------------------------------------------------ DeviceMesh


def test_device_mesh_private_constructor_arguments() -> None:
    params = _params(DeviceMesh.__init__)
    assert {"_layout", "_rank_map", "_root_mesh", "_init_backend", "mesh_dim_names"} <= params


@pytest.mark.usefixtures("fake4")
def test_our_layouts_are_the_ones_torch_builds_in_this_release() -> None:
    """torch 2.10-2.12: one _MeshLayout, a mode per dim; 2.13+: a _FlatLayout per dim (``_torch.FLAT_LAYOUTS``).
    Ours must equal torch's own, form included: torch compares layouts as values of that form."""
    from torch.distributed import _mesh_layout

    assert _torch.FLAT_LAYOUTS == hasattr(_mesh_layout, "_FlatLayout") == (_torch.TORCH >= (2, 13))
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert _torch._mesh_layout([Layout((2,), (2,)), Layout((2,), (1,))]) == root._layout
    assert _torch._mesh_layout([Layout((2,), (1,))]) == root["tp"]._layout  # a slice
    flat = root._flatten("dp_tp")
    assert _torch._mesh_layout([Layout((4,), (1,))], flattened=True) == flat._layout  # what _flatten makes
    # from_device_mesh reads every form back (a size-1 dim is (1,):(1,), which torch can slice).
    assert [lay.coalesce() for lay in _torch.dim_layouts(root)] == [Layout(2, 2).coalesce(), Layout(2, 1).coalesce()]
    assert [lay.coalesce() for lay in _torch.dim_layouts(flat)] == [Layout(4, 1).coalesce()]
    odd = DeviceMesh("cpu", _layout=_torch._mesh_layout([Layout(1), Layout(4)]), _rank_map=torch.arange(4),
                     _init_backend=False)
    assert [lay.coalesce() for lay in _torch.dim_layouts(odd)] == [Layout(()).coalesce(), Layout(4, 1).coalesce()]
    rows = _torch._mesh_layout([Layout((2,), (2,))]).remap_to_tensor(torch.tensor([3, 0, 2, 1], dtype=torch.int))
    assert rows.tolist() == [[3, 2], [0, 1]]  # a dim's groups over a rank map


def _export(mesh: fmesh.Mesh, root: DeviceMesh, name: str) -> DeviceMesh:
    groups = [
        _torch.create_group(mesh.group(dist.get_rank(), axis), f"{name}:{axis}", rank=dist.get_rank(), backend="fake",
                            timeout=timedelta(seconds=5))
        for axis in mesh.axis_names
    ]
    return _torch.export_device_mesh(mesh, root, groups)


@pytest.mark.usefixtures("fake4")
def test_device_mesh_without_backend_creates_no_group_and_resolves_our_names() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
    before = _torch.group_count()
    root = _torch.export_root(mesh.universe, "cpu")
    assert _torch.group_count() == before  # _init_backend=False: no group
    assert root.mesh.tolist() == [3, 0, 2, 1] and root._get_root_mesh() is root
    exported = _export(mesh, root, "pin-dm")
    assert _torch.group_count() == before + 2  # only our two groups
    assert exported._get_root_mesh() is root
    assert exported.mesh.tolist() == mesh.ranks(1).tolist() == [[3, 0], [2, 1]]
    assert list(exported.get_coordinate() or ()) == list(mesh.coordinate(1) or ())  # torch computes it from the layout
    for dim, axis in enumerate(("dp", "tp")):
        # get_group uses _dim_group_names, by index and by name
        assert exported.get_group(dim).group_name == f"pin-dm:{axis}"
        assert exported.get_group(axis).group_name == f"pin-dm:{axis}"
        if _torch.TORCH >= (2, 11):  # torch.compile finds groups in the root's registry; 2.10 has none
            assert root._pg_registry[f"pin-dm:{axis}"] is exported.get_group(axis)
        assert exported.get_local_rank(axis) == (mesh.coordinate(1) or ())[dim]
    # Slicing is torch's, with no group created and our group names copied.
    assert exported["tp"].get_group().group_name == "pin-dm:tp" and _torch.group_count() == before + 2


@pytest.mark.usefixtures("fake4")
def test_get_group_by_name_consults_the_root_flatten_mapping_first() -> None:
    """Why Context publishes a name in _flatten_mapping only while all exports agree on its layout."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    root = _torch.export_root(mesh.universe, "cpu")
    two_d = _export(mesh, root, "pin-first")
    one_d = _export(fmesh.make_mesh((4,), ("tp",)), root, "pin-first-1d")
    _torch.register_flattened(root, "tp", one_d)
    assert two_d.get_group("tp").group_name == "pin-first-1d:tp"  # not the 2-D mesh's own tp group
    assert two_d.get_group(1).group_name == "pin-first:tp"  # by index: its own
    _torch.unregister_flattened(root, "tp")
    assert two_d.get_group("tp").group_name == "pin-first:tp"


@pytest.mark.usefixtures("fake4")
def test_flatten_finds_a_registered_mesh_without_creating_groups() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    root = _torch.export_root(mesh.universe, "cpu")
    two_d = _export(mesh, root, "pin-flat")
    flat = _export(fmesh.flatten(mesh, ("dp", "tp"), "dp_tp"), root, "pin-flat-dp_tp")
    _torch.register_flattened(root, "dp_tp", flat)
    before = _torch.group_count()
    assert two_d._flatten("dp_tp") is flat
    assert two_d["dp", "tp"]._flatten("dp_tp") is flat
    assert _torch.group_count() == before
    # The contrast: a name torch does not know makes new groups (unless it spans the whole world,
    # where torch reuses the default group).
    two_d["tp"]._flatten("unregistered")
    assert _torch.group_count() > before


@pytest.mark.usefixtures("fake4")
def test_concatenate_needs_one_rank_map_not_one_root_object() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
    root = _torch.export_root(mesh.universe, "cpu")
    dp, tp = _export(mesh["dp"], root, "pin-cat-dp"), _export(mesh["tp"], root, "pin-cat-tp")
    before = _torch.group_count()
    joined = DeviceMesh._concatenate([dp, tp])
    assert _torch.group_count() == before
    assert joined._get_root_mesh() is root
    assert joined.mesh.tolist() == mesh.ranks(1).tolist()
    assert [joined.get_group(i).group_name for i in range(2)] == ["pin-cat-dp:dp", "pin-cat-tp:tp"]
    # Another rank map (another universe) cannot be concatenated.
    other = fmesh.make_mesh((4,), ("w",))
    stranger = _export(other, _torch.export_root(other.universe, "cpu"), "pin-cat-other")
    with pytest.raises(RuntimeError, match="different device mesh"):
        DeviceMesh._concatenate([stranger, tp])


@pytest.mark.usefixtures("fake4")
def test_device_mesh_equality_ignores_groups() -> None:
    """Why Context.device_mesh interns one DeviceMesh per mesh value: torch (DTensor's sharding
    cache) treats equal meshes as interchangeable whatever their groups."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    root = _torch.export_root(mesh.universe, "cpu")
    first, second = _export(mesh, root, "pin-eq-a"), _export(mesh, root, "pin-eq-b")
    assert first == second and hash(first) == hash(second)
    assert first.get_group(0) is not second.get_group(0)
