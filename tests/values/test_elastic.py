"""Elastic meshes (fmesh.without, fmesh.resize, fmesh.old_rank, fmesh.new_rank): laws against brute force.

The references here enumerate ranks and read coordinates; the code under test never does.
"""

from __future__ import annotations

import doctest
import pickle
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from laws import COUNTED, Reached
from paths import ROOT
from reference import dropped_coordinates, renumbered, survivors, through_rank_map
from strategies import lost_ranks, meshes
from support import patience

import fmesh

# --------------------------------------------------------------- mesh laws


@given(st.data())
def test_without_keeps_the_survivors_groups_renumbered_in_ascending_order(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    axis = data.draw(st.sampled_from(mesh.axis_names))
    lost = data.draw(lost_ranks(mesh.world_size))
    dropped = dropped_coordinates(mesh, lost, axis)
    assume(len(dropped) < mesh.shape[axis])
    alive = survivors(mesh, lost, axis)
    number = {rank: new for new, rank in enumerate(alive)}

    smaller = fmesh.without(mesh, lost, axis)

    assert smaller.world_size == len(alive)
    assert dict(smaller.shape) == {**mesh.shape, axis: mesh.shape[axis] - len(dropped)}
    for axes in (*mesh.axis_names, None):
        assert smaller.groups(axes) == renumbered(mesh.groups(axes), number), axes
    assert [fmesh.new_rank(smaller, r) for r in range(mesh.world_size)] == [number.get(r) for r in
                                                                             range(mesh.world_size)]
    assert [fmesh.old_rank(smaller, r) for r in range(smaller.world_size)] == alive


@given(st.data())
def test_resize_larger_keeps_the_old_ranks_numbers_and_back_is_the_same_mesh(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    axis = data.draw(st.sampled_from(mesh.axis_names))
    size = mesh.shape[axis]
    larger = fmesh.resize(mesh, axis, size + data.draw(st.integers(1, 3)))
    world = mesh.world_size

    assert larger.world_size == world // size * larger.shape[axis]
    assert [fmesh.new_rank(larger, r) for r in range(world)] == list(range(world))
    assert [fmesh.old_rank(larger, r) for r in range(larger.world_size)] == [
        r if r < world else None for r in range(larger.world_size)
    ]
    for name in mesh.axis_names:  # the old ranks' groups are the new groups' old members
        old_members = tuple(g for g in (tuple(r for r in group if r < world) for group in larger.groups(name)) if g)
        assert old_members == mesh.groups(name), name
    back = fmesh.resize(larger, axis, size)
    assert back == mesh and hash(back) == hash(mesh)
    assert fmesh.without(larger, range(world, larger.world_size), axis) == mesh


def test_old_and_new_rank_are_inverse() -> None:
    reached = Reached()

    @COUNTED
    @given(st.data())
    def law(data: st.DataObject) -> None:
        mesh = data.draw(meshes())
        axis = data.draw(st.sampled_from(mesh.axis_names))
        if data.draw(st.booleans()):
            lost = data.draw(lost_ranks(mesh.world_size))
            assume(len(dropped_coordinates(mesh, lost, axis)) < mesh.shape[axis])
            changed, how = fmesh.without(mesh, lost, axis), "without"
        else:
            size = data.draw(st.integers(1, 6))
            changed = fmesh.resize(mesh, axis, size)
            change = (size > mesh.shape[axis]) - (size < mesh.shape[axis])
            how = {-1: "resize smaller", 0: "same", 1: "resize larger"}[change]
        for old in range(mesh.world_size):
            new = fmesh.new_rank(changed, old)
            assert new is None or fmesh.old_rank(changed, new) == old
        for new in range(changed.world_size):
            old = fmesh.old_rank(changed, new)
            assert old is None or fmesh.new_rank(changed, old) == new
        kept = [r for r in range(mesh.world_size) if fmesh.new_rank(changed, r) is not None]
        assert sorted(fmesh.new_rank(changed, r) for r in kept) == list(range(len(kept)))  # type: ignore[type-var]
        reached.example(how)

    law()
    reached.floor({"without": 0.1, "resize smaller": 0.1, "resize larger": 0.1})


def test_without_on_a_selected_mesh_drops_the_uncovered_ranks_slices_too() -> None:
    mesh = fmesh.make_mesh((2, 3, 2), ("pp", "dp", "tp"))
    stage1 = fmesh.select(mesh, pp=1)
    smaller = fmesh.without(stage1, [8], "dp")  # rank 8 is at dp=1: in both stages, dp=1 goes
    assert smaller == fmesh.select(fmesh.without(mesh, [8], "dp"), pp=1)
    assert smaller.groups("dp") == ((4, 6), (5, 7))


def test_a_grown_size_one_axis_goes_where_make_mesh_puts_it() -> None:
    mesh = fmesh.make_mesh((1, 2, 1, 3, 1), ("pp", "r", "cp", "s", "tp"))
    for axis in mesh.axis_names:
        sizes = dict(mesh.shape)
        sizes[axis] = 2 if sizes[axis] == 1 else sizes[axis] + 1
        larger = fmesh.resize(mesh, axis, sizes[axis])
        expected = fmesh.make_mesh(tuple(sizes.values()), mesh.axis_names)
        for name in mesh.axis_names:
            assert larger.groups(name) == through_rank_map(expected.groups(name), larger.universe), (axis, name)


def test_the_lineage_is_a_value_and_survives_pickling() -> None:
    smaller = fmesh.without(fmesh.make_mesh((4, 2), ("dp", "tp")), [3], "dp")
    lineage = smaller.universe.lineage
    assert lineage == fmesh.mesh.Lineage(fmesh.Universe(8), "dp", stride=2, old_size=4, coordinates=(0, 2, 3))
    copy = pickle.loads(pickle.dumps(smaller))
    assert copy == smaller and fmesh.old_rank(copy, 2) == 4
    twice = fmesh.without(smaller, [0], "tp")
    assert twice.universe.lineage is not None and twice.universe.lineage.parent is smaller.universe


# ------------------------------------------------------------------ errors

ERRORS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("unknown axis", lambda: fmesh.without(fmesh.make_mesh((2, 2), ("dp", "tp")), [0], "pp"), KeyError,
     "unknown axis 'pp': this mesh has axes ('dp', 'tp')"),
    ("rank outside", lambda: fmesh.without(fmesh.make_mesh((2, 2), ("dp", "tp")), [4], "dp"), ValueError,
     "rank 4 is outside the universe: valid ranks are 0..3"),
    ("one int", lambda: fmesh.without(fmesh.make_mesh((2, 2), ("dp", "tp")), 3, "dp"), TypeError,  # type: ignore
     "iterable of ranks such as [5], got 3"),
    ("not covered", lambda: fmesh.without(fmesh.select(fmesh.make_mesh((2, 2), ("pp", "dp")), pp=0), [3], "dp"),
     ValueError, "rank 3 is not covered"),
    ("drops everything", lambda: fmesh.without(fmesh.make_mesh((2, 2), ("dp", "tp")), [0, 3], "dp"), ValueError,
     "would drop every coordinate of axis 'dp' (size 2) and leave no rank"),
    ("size 0", lambda: fmesh.resize(fmesh.make_mesh((2, 2), ("dp", "tp")), "dp", 0), ValueError,
     "expected a positive int size for axis 'dp', got 0"),
    ("strided axis", lambda: fmesh.without(fmesh.flatten(fmesh.make_mesh((2, 2, 2), ("a", "b", "c")), ("c", "a"),
                                                         "x"), [0], "x"),
     ValueError, "its ranks are not one stride apart"),
    ("no lineage", lambda: fmesh.old_rank(fmesh.make_mesh((2,), ("dp",)), 0), ValueError, "has no lineage"),
    ("new rank outside", lambda: fmesh.new_rank(fmesh.resize(fmesh.make_mesh((2,), ("dp",)), "dp", 3), 2),
     ValueError, "rank 2 is outside the universe: valid ranks are 0..1"),
]


@pytest.mark.parametrize(("call", "kind", "fragment"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_is_a_clear_error(call: Callable[[], object], kind: type[Exception], fragment: str) -> None:
    with pytest.raises(kind) as raised:
        call()
    assert fragment in str(raised.value)


# ------------------------------------------------------------ no torch, docs

PURE = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
import fmesh
dims = fmesh.ParallelDims(16, dp_replicate=2, dp_shard=4, tp=2)
smaller = fmesh.plan.rescale.scale_down(dims, [9])
larger = fmesh.resize(dims.world_mesh, "tp", 3)
print(smaller.world_size, fmesh.old_rank(smaller.mesh("fsdp"), 0), fmesh.new_rank(larger, 1))
"""


def test_the_elastic_algebra_runs_without_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PURE], capture_output=True, text=True, timeout=patience(120))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8", "0", "1"]


def test_the_guide_examples_are_true() -> None:
    guide = ROOT / "docs" / "guides" / "elastic.md"
    outcome = doctest.testfile(str(guide), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted >= 10 and outcome.failed == 0
