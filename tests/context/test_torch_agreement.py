"""Differential test: fmesh groups equal torch.distributed.DeviceMesh groups (fake backend, one process).

Random meshes (up to 5 axes, up to 512 ranks, identity and permuted rank maps)
go through random sequences of ``__getitem__``, ``_flatten``, ``_unflatten``
and ``_concatenate`` on a real ``DeviceMesh`` and the same steps on fmesh
values; after every step the set of rank groups along every axis, and the
instance tensor on the fake process's rank, must be identical.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from fake_torch import fake_world, torch_groups
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.device_mesh import DeviceMesh

import fmesh
from fmesh import Mesh


def assert_same(dm: DeviceMesh, mesh: Mesh, rank: int) -> None:
    names = list(dm.mesh_dim_names or ())
    assert mesh.axis_names == tuple(names)
    assert mesh.axis_sizes == tuple(dm.shape)
    for i, name in enumerate(names):
        assert set(mesh.groups(name)) == torch_groups(dm, [i]), name
    assert set(mesh.groups()) == torch_groups(dm, list(range(len(names))))
    assert mesh.ranks(rank).tolist() == dm.mesh.tolist()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int] | None, int]:
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=5).filter(lambda s: 2 <= math.prod(s) <= 512))
    world = math.prod(sizes)
    rank_map = draw(st.one_of(st.none(), st.permutations(range(world))))
    return tuple(sizes), rank_map, draw(st.integers(0, world - 1))


def divisor_pairs(n: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in range(1, n + 1) if n % d == 0]


def renamed(dm: DeviceMesh, names: tuple[str, ...]) -> DeviceMesh:
    """The same DeviceMesh (layout, rank map, root, groups) under other dim names: torch has no rename."""
    copy = DeviceMesh(dm.device_type, _layout=dm._layout, _rank_map=dm._rank_map, mesh_dim_names=names,
                      _root_mesh=dm._get_root_mesh(), _init_backend=False)
    copy._dim_group_names = list(dm._dim_group_names)
    return copy


def test_random_sequences_agree_with_device_mesh() -> None:
    """Counted: sequences that compare a concatenation with torch's (joined, or refused by both as overlapping)
    must be at least half (1 in 200 before concatenations took renamed copies)."""
    seen = {"sequences": 0, "concatenation compared": 0, "joined": 0, "both refused": 0}

    @settings(max_examples=300, derandomize=True)  # the counts are the strategy's: the same every run
    @given(scenarios(), st.data())
    def check(scenario: tuple[tuple[int, ...], list[int] | None, int], data: st.DataObject) -> None:
        seen["sequences"] += 1
        seen["concatenation compared"] += sequence_agrees(scenario, data, seen)

    check()
    print(f"\ntorch agreement: {seen}")
    assert seen["concatenation compared"] >= 0.5 * seen["sequences"], seen
    assert seen["joined"] >= 100 and seen["both refused"] >= 50, seen


def sequence_agrees(scenario: tuple[tuple[int, ...], list[int] | None, int], data: st.DataObject,
                    seen: dict[str, int]) -> bool:
    """One random sequence of operations on both sides; whether it compared a concatenation."""
    compared = False
    sizes, rank_map, rank = scenario
    world = math.prod(sizes)
    names = tuple("abcde"[: len(sizes)])
    with fake_world(world, rank):
        ranks = torch.arange(world) if rank_map is None else torch.tensor(rank_map)
        root = DeviceMesh("cpu", ranks.reshape(sizes), mesh_dim_names=names)
        pool: list[tuple[DeviceMesh, Mesh]] = [(root, fmesh.make_mesh(sizes, names, rank_map=rank_map))]
        assert_same(*pool[0], rank)
        fresh = iter(f"x{i}" for i in range(1000))
        for _ in range(data.draw(st.integers(1, 6))):
            dm, mesh = data.draw(st.sampled_from(pool))
            op = data.draw(st.sampled_from([*["concatenate"] * 3, "getitem", "flatten", "unflatten", "split_concat"]))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if op == "getitem":
                    kept = sorted(data.draw(st.lists(st.sampled_from(range(mesh.ndim)), min_size=1, unique=True)))
                    kept_names = tuple(mesh.axis_names[i] for i in kept)
                    try:
                        new_dm = dm[kept_names]
                    except (KeyError, RuntimeError):
                        continue  # torch's own ordering rules; fmesh accepts any order (tested elsewhere)
                    new_mesh = fmesh.slice(mesh, *kept_names)
                elif op == "flatten":
                    name = next(fresh)
                    new_dm = dm._flatten(name)
                    new_mesh = fmesh.flatten(mesh, mesh.axis_names, name)
                elif op == "unflatten":
                    axis = data.draw(st.sampled_from(mesh.axis_names))
                    split = data.draw(st.sampled_from(divisor_pairs(mesh.shape[axis])))
                    new_names = (next(fresh), next(fresh))
                    try:
                        new_dm = dm._unflatten(mesh.axis_index(axis), split, new_names)  # 2.10 takes no name
                    except AssertionError:
                        continue  # torch cannot split this strided axis; fmesh can (tested in test_mesh)
                    new_mesh = fmesh.unflatten(mesh, axis, dict(zip(new_names, split, strict=True)))
                elif op == "split_concat":  # disjoint slices of one mesh, joined in either order
                    if mesh.ndim < 2:
                        continue
                    left = set(data.draw(st.lists(st.sampled_from(range(mesh.ndim)), min_size=1,
                                                  max_size=mesh.ndim - 1, unique=True)))
                    parts = [tuple(mesh.axis_names[i] for i in range(mesh.ndim) if (i in left) == side)
                             for side in data.draw(st.permutations([True, False]))]
                    try:
                        new_dm = DeviceMesh._concatenate([dm[parts[0]], dm[parts[1]]])
                    except (KeyError, RuntimeError):
                        continue
                    new_mesh = fmesh.concat(fmesh.slice(mesh, *parts[0]), fmesh.slice(mesh, *parts[1]))
                else:  # with a renamed copy: of its other axes (disjoint), or of any mesh of the pool
                    if mesh.ndim >= 2 and data.draw(st.sampled_from(["disjoint", "disjoint", "any"])) == "disjoint":
                        left = set(data.draw(st.lists(st.sampled_from(range(mesh.ndim)), min_size=1,
                                                      max_size=mesh.ndim - 1, unique=True)))
                        parts = [tuple(mesh.axis_names[i] for i in range(mesh.ndim) if (i in left) == side)
                                 for side in (True, False)]
                        try:
                            dm, other_dm = dm[parts[0]], dm[parts[1]]
                        except (KeyError, RuntimeError):
                            continue
                        mesh, other = fmesh.slice(mesh, *parts[0]), fmesh.slice(mesh, *parts[1])
                    else:
                        other_dm, other = data.draw(st.sampled_from(pool))
                    names = tuple(next(fresh) for _ in other.axis_names)
                    other_dm = renamed(other_dm, names)
                    other = fmesh.rename(other, dict(zip(other.axis_names, names, strict=True)))
                    compared = True
                    try:
                        new_dm = DeviceMesh._concatenate([dm, other_dm])
                    except RuntimeError as error:
                        assert "overlapping" in str(error)
                        with pytest.raises(ValueError, match="overlap"):
                            fmesh.concat(mesh, other)
                        seen["both refused"] += 1
                        continue
                    new_mesh = fmesh.concat(mesh, other)
                    seen["joined"] += 1
            assert_same(new_dm, new_mesh, rank)
            pool.append((new_dm, new_mesh))
    return compared


def test_torch_rejects_descending_slices_that_fmesh_accepts() -> None:
    with fake_world(8):
        dm = DeviceMesh("cpu", torch.arange(8).reshape(2, 4), mesh_dim_names=("dp", "tp"))
        with pytest.raises(KeyError):
            dm["tp", "dp"]
        mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
        assert fmesh.slice(mesh, "tp", "dp").ranks(0).tolist() == dm.mesh.t().tolist()
