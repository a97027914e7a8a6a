"""Mesh values against the brute-force reference, and the laws of the pure functions."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import RefMesh
from strategies import factorizations, roots, runs, steps

import fmesh
from fmesh import Layout, Mesh


def assert_agrees(mesh: Mesh, ref: RefMesh) -> None:
    assert mesh.axis_names == ref.names
    assert mesh.axis_sizes == ref.sizes
    axis_sets = [(n,) for n in mesh.axis_names] + list(itertools.permutations(mesh.axis_names, 2))
    for axes in axis_sets:
        assert set(mesh.groups(axes)) == ref.groups(axes), axes
    covered = ref.covered()
    assert mesh.num_covered == len(covered)
    coordinates = ref.coordinates()
    for rank in set(range(mesh.world_size)) - covered:
        assert mesh.coordinate(rank) is None
    for rank in covered:
        assert mesh.coordinate(rank) == coordinates[rank]
    for axes in axis_sets:
        rows = [tuple(int(ref.rank_map[s]) for s in row) for row in ref.lines(axes)]
        for row in rows:
            for rank in row:
                assert mesh.group(rank, axes) == row
    some_rank = min(covered)
    assert np.array_equal(mesh.ranks(some_rank).numpy(), ref.instance_of(some_rank))
    assert np.array_equal(np.array(mesh.rank_grid(some_rank)).reshape(mesh.axis_sizes), ref.instance_of(some_rank))
    for rank in covered:  # the index space is the one the layouts speak: rank_at inverts index_of
        assert mesh.rank_at(mesh.index_of(rank)) == rank


def test_random_op_sequences_match_reference() -> None:
    seen = {"sequences": 0, "framed": 0, "framed at the end": 0}

    # The counts below are a property of the strategy, not of one random run: a fixed seed makes them the
    # same every run (random seeds gave 19% to 54% framed over 18 runs, so a 20% floor failed at random).
    @settings(derandomize=True)
    @given(runs())
    def check(run: tuple[Mesh, RefMesh, bool]) -> None:
        mesh, ref, framed = run
        assert_agrees(mesh, ref)
        seen["sequences"] += 1
        seen["framed"] += framed
        seen["framed at the end"] += bool(mesh.frame)

    check()
    print(f"\nmesh sequences: {seen}")
    assert seen["sequences"] >= 100, seen
    assert seen["framed"] >= 0.2 * seen["sequences"], seen  # frames x every later operation
    assert seen["framed at the end"] >= 0.1 * seen["sequences"], seen


@given(roots(), st.data())
def test_slice_in_any_order_matches_reference(pair: tuple[Mesh, RefMesh], data: st.DataObject) -> None:
    mesh, ref = pair
    kept = data.draw(st.permutations(mesh.axis_names))
    assert_agrees(fmesh.slice(mesh, *kept), ref.slice(*kept))


@given(roots(), st.data())
def test_flatten_non_adjacent_matches_reference(pair: tuple[Mesh, RefMesh], data: st.DataObject) -> None:
    mesh, ref = pair
    merged = data.draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    assert_agrees(fmesh.flatten(mesh, merged, "m"), ref.flatten(merged, "m"))


@given(roots(), st.data())
def test_unflatten_strided_flattened_axes_in_any_factorisation(pair: tuple[Mesh, RefMesh], data: st.DataObject) -> None:
    mesh, ref = pair
    merged = data.draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    flat, flat_ref = fmesh.flatten(mesh, merged, "m"), ref.flatten(merged, "m")
    sizes = dict(zip(("p", "q", "r"), data.draw(st.sampled_from(factorizations(flat.shape["m"]))), strict=False))
    assert_agrees(fmesh.unflatten(flat, "m", sizes), flat_ref.unflatten("m", sizes))


def test_unflatten_where_torch_asserts() -> None:
    # torch 2.13's _unflatten fails an internal assertion on exactly this mesh.
    mesh = fmesh.make_mesh((3, 2, 2), ("a", "b", "c"))
    ref = RefMesh.root((3, 2, 2), "abc")
    flat = fmesh.slice(fmesh.flatten(mesh, ("a", "c"), "ac"), "ac")
    split = fmesh.unflatten(flat, "ac", {"p": 2, "q": 3})
    assert split.frame, "an uneven split needs a frame"
    assert_agrees(split, ref.flatten(("a", "c"), "ac").slice("ac").unflatten("ac", {"p": 2, "q": 3}))
    assert set(split.groups("q")) == {(0, 1, 4), (5, 8, 9), (2, 3, 6), (7, 10, 11)}
    # Undoing the split drops the frame again: the value is canonical.
    assert fmesh.flatten(split, ("p", "q"), "ac") == flat


@given(steps(), st.data())
def test_select_matches_reference(pair: tuple[Mesh, RefMesh], data: st.DataObject) -> None:
    mesh, ref = pair
    picks = data.draw(st.lists(st.sampled_from(mesh.axis_names), unique=True, max_size=mesh.ndim))
    coordinates = {n: data.draw(st.integers(0, mesh.shape[n] - 1)) for n in picks}
    assert_agrees(fmesh.select(mesh, **coordinates), ref.select(**coordinates))


@given(steps())
def test_groups_partition_covered_ranks(pair: tuple[Mesh, RefMesh]) -> None:
    mesh, ref = pair
    for r in range(1, mesh.ndim + 1):
        for axes in itertools.combinations(mesh.axis_names, r):
            groups = mesh.groups(axes)
            size = math.prod(mesh.shape[a] for a in axes)
            assert all(len(g) == size for g in groups)
            members = [rank for g in groups for rank in g]
            assert len(members) == len(set(members)) == mesh.num_covered
            assert set(members) == ref.covered()


@given(steps(), st.data())
def test_unflatten_after_flatten_gives_back_the_mesh(pair: tuple[Mesh, RefMesh], data: st.DataObject) -> None:
    mesh, _ = pair
    merged = data.draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, unique=True))
    flat = fmesh.flatten(mesh, merged, "merged")
    back = fmesh.unflatten(flat, "merged", {n: mesh.shape[n] for n in merged})
    # flatten puts the merged axis where the first of them stood; unflatten expands it in place.
    position = mesh.axis_names.index(merged[0])
    expected_order = [*[n for n in mesh.axis_names[:position] if n not in merged], *merged,
                      *[n for n in mesh.axis_names[position:] if n not in merged]]
    assert back.axis_names == tuple(expected_order)
    same = fmesh.slice(mesh, *expected_order)
    for axes in [(n,) for n in expected_order] + list(itertools.permutations(expected_order, 2)):
        assert set(back.groups(axes)) == set(same.groups(axes)), axes
    assert [back.coordinate(r) for r in range(mesh.world_size)] == [same.coordinate(r) for r in
                                                                     range(mesh.world_size)]
    if not mesh.frame:  # a frame is not canonical yet: see test_a_frame_is_not_yet_one_value_per_set_of_groups
        assert back == same and hash(back) == hash(same)


def test_disjoint_slices_of_a_framed_mesh_concat_back() -> None:
    # Found by the frame runs: a slice dropped its frame although the instances (the complement of its axes)
    # needed it, so the slice tiled the universe with other groups and concat saw the axes overlap.
    universe = fmesh.make_mesh((12,), ("w",)).universe
    mesh = Mesh(universe, ("n2", "b"), [Layout(2, 1), Layout(2, 6)], frame=(Layout((2, 2, 3), (3, 6, 1)),))
    assert mesh.frame
    assert set(mesh["n2"].groups("n2")) == set(mesh.groups("n2"))  # a slice keeps the groups
    joined = fmesh.concat(mesh["n2"], mesh["b"])
    assert set(joined.groups(("n2", "b"))) == set(mesh.groups(("n2", "b")))


@pytest.mark.xfail(strict=True, reason="frames are not canonical: the same groups reached through two histories "
                                       "carry two frames, so the meshes compare unequal (found by the frame runs)")
def test_a_frame_is_not_yet_one_value_per_set_of_groups() -> None:
    mesh = fmesh.slice(fmesh.flatten(fmesh.make_mesh((3, 2, 2), ("a", "b", "c")), ("a", "c"), "ac"), "ac", "b")
    split = fmesh.unflatten(mesh, "ac", {"p": 2, "q": 3})
    assert split.frame
    back = fmesh.unflatten(fmesh.flatten(split, split.axis_names, "all"), "all", dict(split.shape))
    assert set(back.groups("q")) == set(split.groups("q"))
    assert back == split


@given(steps())
def test_rename_round_trip_and_slice_identity(pair: tuple[Mesh, RefMesh]) -> None:
    mesh, _ = pair
    forward = {n: n.upper() for n in mesh.axis_names}
    renamed = fmesh.rename(mesh, forward)
    assert renamed.axis_names == tuple(n.upper() for n in mesh.axis_names)
    assert fmesh.rename(renamed, {v: k for k, v in forward.items()}) == mesh
    assert fmesh.slice(mesh, *mesh.axis_names) == mesh
    assert mesh[mesh.axis_names] == mesh


@given(steps())
def test_pickle_round_trip_keeps_value_and_universe_id(pair: tuple[Mesh, RefMesh]) -> None:
    mesh, _ = pair
    copy = pickle.loads(pickle.dumps(mesh))
    assert copy == mesh and hash(copy) == hash(mesh)
    assert copy.universe.id == mesh.universe.id


def test_equal_meshes_built_differently_compare_equal() -> None:
    direct = fmesh.make_mesh((2, 3), ("a", "b"))
    split = fmesh.unflatten(fmesh.make_mesh((6,), ("w",)), "w", {"a": 2, "b": 3})
    assert direct == split and hash(direct) == hash(split)
    # Two unflattens into the same layout: one value (the Context shares their groups).
    mesh = fmesh.make_mesh((4, 2), ("dp", "tp"))
    once = fmesh.unflatten(mesh, "dp", {"x": 2, "y": 2})
    twice = fmesh.unflatten(mesh, "dp", {"x": 2, "y": 2})
    assert once == twice and once["y"] == twice["y"]
    assert direct != fmesh.make_mesh((3, 2), ("a", "b"))


def test_derived_meshes_share_the_universe() -> None:
    mesh = fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"), rank_map=[7, 6, 5, 4, 3, 2, 1, 0])
    derived = [mesh["tp"], fmesh.flatten(mesh, ("pp", "tp"), "x"), fmesh.select(mesh, pp=1),
               fmesh.unflatten(mesh, "dp", {"u": 1, "v": 2}), fmesh.rename(mesh, {"tp": "t"})]
    assert {m.universe.id for m in derived} == {mesh.universe.id}


def test_repr_is_short() -> None:
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    assert repr(mesh) == "Mesh(dp=2, cp=2, tp=4; world=16)"
    assert repr(mesh["tp"]) == "Mesh(tp=4; world=16)"
    assert repr(fmesh.select(mesh, dp=0)) == "Mesh(cp=2, tp=4; world=16, covers 8)"


def test_shape_is_ordered_and_read_only() -> None:
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    assert list(mesh.shape.items()) == [("dp", 2), ("tp", 4)]
    assert (mesh.size, mesh.ndim) == (8, 2)
    with pytest.raises(TypeError):
        mesh.shape["dp"] = 3  # type: ignore[index]


def test_ranks_of_single_and_many_instances() -> None:
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"), rank_map=list(range(7, -1, -1)))
    assert mesh.ranks().tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert mesh["dp"].ranks(5).tolist() == [5, 1]  # rank 5 sits in slot 2: dp=0, tp=2
    stage = fmesh.select(mesh, dp=1)
    assert stage.ranks().tolist() == [3, 2, 1, 0]
