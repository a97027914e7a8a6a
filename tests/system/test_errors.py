"""Bad input gets a clear error naming the offending value and what would be valid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fmesh
from fmesh import Layout, Universe

MESH = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
OTHER_WORLD = fmesh.make_mesh((4, 4), ("dp", "tp"), rank_map=list(range(15, -1, -1)))

# (id, call, exception type, fragments that must all appear in the message)
CASES: list[tuple[str, Callable[[], Any], type[Exception], tuple[str, ...]]] = [
    ("zero size", lambda: fmesh.make_mesh((2, 0), ("a", "b")), ValueError, ("0", "positive")),
    ("negative size", lambda: fmesh.make_mesh((-2, 4), ("a", "b")), ValueError, ("-2", "positive")),
    ("float size", lambda: fmesh.make_mesh((2.0, 4), ("a", "b")), TypeError, ("2.0", "ints")),
    ("bool size", lambda: fmesh.make_mesh((True, 4), ("a", "b")), TypeError, ("True", "ints")),
    ("sizes not a sequence", lambda: fmesh.make_mesh(8, ("a",)), TypeError, ("8", "sequence of ints")),
    ("names a string", lambda: fmesh.make_mesh((8,), "dp"), TypeError, ("'dp'", "sequence of strings")),
    ("too few names", lambda: fmesh.make_mesh((2, 4), ("dp",)), ValueError,
     ("(2, 4)", "('dp',)", "one name per axis")),
    ("duplicate names", lambda: fmesh.make_mesh((2, 4), ("dp", "dp")), ValueError, ("'dp'", "unique")),
    ("empty name", lambda: fmesh.make_mesh((2, 4), ("dp", "")), ValueError, ("''", "non-empty")),
    ("non-str name", lambda: fmesh.make_mesh((2, 4), ("dp", 3)), TypeError, ("3", "strings")),
    ("rank map too short", lambda: fmesh.make_mesh((2, 2), ("a", "b"), rank_map=[0, 1, 2]),
     ValueError, ("3 entries", "world_size is 4")),
    ("rank map duplicate", lambda: fmesh.make_mesh((2, 2), ("a", "b"), rank_map=[0, 1, 1, 3]),
     ValueError, ("rank 1 twice", "permutation of range(0, 4)")),
    ("rank map out of range", lambda: fmesh.make_mesh((2, 2), ("a", "b"), rank_map=[0, 1, 2, 9]),
     ValueError, ("9", "range(0, 4)")),
    ("rank map non-int", lambda: fmesh.make_mesh((2,), ("a",), rank_map=[0, "1"]), TypeError, ("'1'", "ints")),
    ("bad device type", lambda: fmesh.make_mesh((2,), ("a",), device_type=""), TypeError, ("''", "'cuda'")),
    ("a device, not a type", lambda: fmesh.make_mesh((2,), ("a",), device_type="cuda:1"), ValueError,
     ("'cuda:1'", "without an index", "Context(device='cuda:1')", "device_type='cuda'")),
    ("world size zero", lambda: Universe(0), ValueError, ("0", "positive integer")),
    ("a dry run past torch's ranks", lambda: fmesh.Context.fake(2**40), ValueError,
     ("1099511627776", "0..2**31 - 1", "32-bit")),
    ("unknown axis in slice", lambda: fmesh.slice(MESH, "pp"), KeyError, ("'pp'", "('dp', 'cp', 'tp')")),
    ("slice nothing", lambda: fmesh.slice(MESH), ValueError, ("at least one", "('dp', 'cp', 'tp')")),
    ("slice twice the same axis", lambda: fmesh.slice(MESH, "tp", "tp"), ValueError, ("'tp'", "more than once")),
    ("unknown axis in group", lambda: MESH.group(0, "ep"), KeyError, ("'ep'", "('dp', 'cp', 'tp')")),
    ("a typo of an axis", lambda: MESH.group(0, "tpp"), KeyError, ("'tpp'", "did you mean 'tp'?")),
    ("an axis in the wrong case", lambda: fmesh.slice(MESH, "DP"), KeyError, ("'DP'", "did you mean 'dp'?")),
    ("rank outside universe", lambda: MESH.group(16, "tp"), ValueError, ("16", "0..15")),
    ("negative rank", lambda: MESH.coordinate(-1), ValueError, ("-1", "0..15")),
    ("non-int rank", lambda: MESH.group("0", "tp"), TypeError, ("'0'", "int")),
    ("flatten unknown axis", lambda: fmesh.flatten(MESH, ("dp", "xx"), "d"), KeyError, ("'xx'", "('dp', 'cp', 'tp')")),
    ("flatten a string", lambda: fmesh.flatten(MESH, "dp", "d"), TypeError, ("'dp'", "sequence of axis names")),
    ("flatten onto kept name", lambda: fmesh.flatten(MESH, ("dp", "cp"), "tp"), ValueError, ("'tp'", "kept")),
    ("unflatten wrong product", lambda: fmesh.unflatten(MESH, "tp", {"a": 2, "b": 3}),
     ValueError, ("multiply to 6", "size 4")),
    ("unflatten zero size", lambda: fmesh.unflatten(MESH, "tp", {"a": 0, "b": 4}), ValueError,
     ("'a'", "0", "positive")),
    ("unflatten clashing name", lambda: fmesh.unflatten(MESH, "tp", {"dp": 2, "b": 2}),
     ValueError, ("['dp']", "already axes")),
    ("unflatten sizes not a mapping", lambda: fmesh.unflatten(MESH, "tp", [2, 2]), TypeError, ("[2, 2]", "'dp': 2")),
    ("unflatten unknown axis", lambda: fmesh.unflatten(MESH, "pp", {"a": 2}), KeyError, ("'pp'", "('dp', 'cp', 'tp')")),
    ("concat across universes", lambda: fmesh.concat(MESH["tp"], OTHER_WORLD["dp"]), ValueError,
     ("different universes", "world=16", "permuted")),
    ("concat overlapping", lambda: fmesh.concat(MESH["tp"], fmesh.flatten(MESH, ("cp", "tp"), "ct")["ct"]),
     ValueError, ("'tp'", "'ct'", "overlap")),
    ("concat duplicate names", lambda: fmesh.concat(MESH["tp"], MESH["tp"]), ValueError,
     ("'tp'", "more than one mesh")),
    ("concat nothing", lambda: fmesh.concat(), ValueError, ("at least one",)),
    ("concat a non-mesh", lambda: fmesh.concat(MESH, "tp"), TypeError, ("'tp'", "position 1")),
    ("rename unknown axis", lambda: fmesh.rename(MESH, {"pp": "x"}), KeyError, ("'pp'", "('dp', 'cp', 'tp')")),
    ("rename into duplicate", lambda: fmesh.rename(MESH, {"dp": "tp"}), ValueError, ("'tp'", "unique")),
    ("rename with a list", lambda: fmesh.rename(MESH, ["dp"]), TypeError, ("['dp']", "mapping")),
    ("select out of range", lambda: fmesh.select(MESH, dp=2), ValueError, ("dp=2", "0..1")),
    ("select unknown axis", lambda: fmesh.select(MESH, pp=0), KeyError, ("'pp'", "('dp', 'cp', 'tp')")),
    ("group of uncovered rank", lambda: fmesh.select(MESH, dp=0).group(12, "tp"), ValueError,
     ("rank 12", "not covered")),
    ("ranks of many instances", lambda: MESH["tp"].ranks(), ValueError, ("4 instances", "pass a rank")),
    ("layout zero shape", lambda: Layout((2, 0)), ValueError, ("(2, 0)", "positive")),
    ("layout negative stride", lambda: Layout((2, 2), (1, -1)), ValueError, ("(1, -1)", "non-negative")),
    ("layout mismatched stride", lambda: Layout((2, 2), (1,)), ValueError, ("(1,)", "same structure", "(2, 2)")),
    ("layout float shape", lambda: Layout((2.5,)), TypeError, ("2.5", "nested tuple of ints")),
    ("layout index out of range", lambda: Layout((2, 3))(6), ValueError, ("6", "range(0, 6)")),
    ("complement of overlapping layout", lambda: Layout((2, 2), (1, 1)).complement(4), ValueError,
     ("overlaps", "multiples")),
    ("complement size not a multiple", lambda: Layout(4, 1).complement(6), ValueError, ("6", "multiple of 4")),
    ("mesh layouts that overlap", lambda: fmesh.Mesh(Universe(4), ("a", "b"), (Layout(2, 1), Layout(2, 1))),
     ValueError, ("do not tile", "overlaps")),
]


@pytest.mark.parametrize(("call", "kind", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_value_and_choices(
    call: Callable[[], Any], kind: type[Exception], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(kind) as caught:
        call()
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


def test_no_bare_assert_on_user_input() -> None:
    # Errors must survive `python -O`, which strips assert statements.
    import ast
    import pathlib

    root = pathlib.Path(fmesh.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert not asserts, f"{path} uses assert at lines {asserts}"


def test_lazy_context_names_match_the_context_package() -> None:
    import fmesh.context

    lazy = {name for name in fmesh.__all__ if name in fmesh.context.__all__}
    assert lazy == {"Context", "from_device_mesh", "launch", "simulate"}
    assert all(getattr(fmesh, name) is getattr(fmesh.context, name) for name in lazy)


@pytest.mark.parametrize(("typed", "meant"), [("tq", "tp"), ("pd", "dp"), ("d", "dp"), ("dpp", "dp"), ("TP", "tp")])
def test_one_slip_in_a_short_axis_name_suggests_the_name(typed: str, meant: str) -> None:
    # difflib alone missed one slip in a two-letter name ('tq' for 'tp' scores 0.5 < 0.6)
    with pytest.raises(KeyError, match=rf"'{typed}'.*did you mean '{meant}'\?"):
        fmesh.make_mesh((2, 4), ("dp", "tp")).group(0, typed)


def test_a_mesh_of_another_world_suggests_building_it_from_the_contexts_world_size() -> None:
    with fmesh.Context.fake(8) as ctx, pytest.raises(
            ValueError, match=r"Mesh\(dp=2, tp=2; world=4\) is built for 4 ranks, but this context has 8; expected a "
                              r"mesh of this context's world: build it from ctx.world_size, e\.g\. "
                              r"fmesh\.make_mesh\(\(4, 2\), \('dp', 'tp'\)\), its first axis ctx\.world_size // 2"):
        ctx.materialize(fmesh.make_mesh((2, 2), ("dp", "tp")))
