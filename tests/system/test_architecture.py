"""The package's architecture rules hold (tests/architecture.py), and the checks catch planted violations."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from architecture import (
    MAX_CLASS_CODE_LINES,
    MAX_FILE_LINES,
    OVERSIZED,
    Module,
    all_violations,
    code_lines,
    cycles,
    exception_homes,
    layering,
    parse_tree,
    planted,
    privacy,
    sizes,
)
from support import patience

import fmesh
import fmesh.errors

PACKAGE = pathlib.Path(fmesh.__file__).parent
TREE = parse_tree(PACKAGE, PACKAGE.parent / "bench")  # parsed once; every test reads it


def test_imports_go_downward_and_only_the_context_imports_torch() -> None:
    assert [str(v) for v in layering(TREE)] == []
    assert {m.name.split(".")[0] for m in TREE} == {"fmesh", "bench"}


def test_no_import_cycles_even_through_imports_inside_functions() -> None:
    assert [str(v) for v in cycles(TREE)] == []


def test_private_names_stay_home_and_torch_internals_live_in_one_module() -> None:
    assert [str(v) for v in privacy(TREE)] == []


def test_every_exception_lives_in_errors_and_is_public() -> None:
    assert [str(v) for v in exception_homes(TREE)] == []
    classes = [value for value in vars(fmesh.errors).values()
               if isinstance(value, type) and issubclass(value, BaseException)
               and value.__module__ in ("fmesh", "fmesh.errors")]
    assert {c.__name__ for c in classes} == set(fmesh.errors.__all__)
    for cls in classes:
        # At the front door (and saying so) or only in fmesh.errors.
        public = cls.__name__ in fmesh.__all__
        assert cls.__module__ == ("fmesh" if public else "fmesh.errors"), cls
        assert not public or getattr(fmesh, cls.__name__) is cls, cls
        assert cls.__doc__ and len(cls.__doc__.split()) >= 8, f"{cls.__name__} does not say what raises it"


def test_the_context_stays_thin() -> None:
    # One door for the collectives, the rooms doing their own work: the Context conducts, in under 250 code lines.
    (context,) = [m for m in TREE if m.name == "fmesh.context.context"]
    assert 100 < code_lines(context) < 250, code_lines(context)


def test_no_file_over_600_lines_and_no_class_over_300_lines_of_code() -> None:
    assert (MAX_FILE_LINES, MAX_CLASS_CODE_LINES) == (600, 300)
    assert [str(v) for v in sizes(TREE)] == []
    # An exemption stays only while its module is still over a limit: once the work it names is done, it goes.
    still_over = {v.module for v in sizes(TREE, exempt=())}
    assert [name for name in OVERSIZED if name not in still_over] == [], "drop these from OVERSIZED"


PLANTED = [
    ("fmesh.mesh.mesh", "from fmesh.context import Context\n", "layers", "imports fmesh.context"),
    ("fmesh.plan.topology", "import torch\n", "torch-free", "imports torch"),
    ("fmesh.cli", "import torch.distributed\n", "torch-free", "imports torch.distributed"),
    ("fmesh.plan.parallel", "def store(c10d):\n    return c10d._get_default_store()\n", "torch-internals",
     "_get_default_store"),
    ("fmesh.context.world", "from torch.distributed._mesh_layout import _MeshLayout\n", "torch-internals",
     "torch.distributed._mesh_layout"),
    ("fmesh.context.launch", "def peek(t):\n    return getattr(t, '_local_tensors', None)\n", "torch-internals",
     "_local_tensors"),
    ("fmesh.rendering", "def peek(mesh):\n    return mesh._covered_index(0)\n", "privacy", "_covered_index"),
    ("fmesh.rendering", "def peek(mesh):\n    return getattr(mesh, '_covered_index')(0)\n", "privacy",
     "_covered_index"),
    ("fmesh.cli", "from fmesh.mesh.mesh import _EMPTY\n", "privacy", "_EMPTY"),
    ("fmesh.plan.jobs", "class PlanError(ValueError):\n    pass\n", "errors", "PlanError"),
    ("fmesh.layout.layout", "import fmesh\n", "layers", "facade"),
    ("fmesh.plan.parallel", "from fmesh.plan.jobs import job\n", "layers", "from the plan: reports layer"),
    ("fmesh.plan.recovery", "from fmesh.context import Context\n", "layers", "imports fmesh.context"),
    ("fmesh.plan.communicators", "from fmesh.rendering import render\n", "layers", "pictures layer"),
    ("fmesh.pictures.text", "from fmesh.pictures.mesh import render\n", "layers", "from the pictures layer"),
    ("fmesh.context.world", "from fmesh.plan.jobs import job\n", "layers", "the context imports fmesh.plan.jobs"),
    # The store protocols stand under the Context's rooms, and their words under the meeting and the board.
    ("fmesh.context.store.roll_call", "from fmesh.context.groups import Route\n", "layers", "from the context layer"),
    ("fmesh.context.store.board", "from fmesh.context.store.agreement import agree\n", "layers",
     "from the context: store protocols layer"),
    ("fmesh.context.store.records", "from fmesh.context.store.board import Board\n", "layers",
     "from the context: store meeting layer"),
    ("fmesh.plan.manifest", "def later():\n    from fmesh.plan import recovery\n", "cycles",
     "fmesh.plan.manifest -> fmesh.plan.recovery -> fmesh.plan.manifest"),
    ("fmesh.mesh.frame", "def later():\n    from fmesh.mesh import transforms\n", "cycles",
     "fmesh.mesh.frame -> fmesh.mesh.transforms -> fmesh.mesh.frame"),
    ("bench.collectives", "from fmesh.context import _torch\n", "privacy", "only fmesh.context may use _torch"),
    ("bench.mesh_ops", "def peek(mesh):\n    return mesh._covered_index(0)\n", "privacy", "_covered_index"),
    ("fmesh.context.threads", "# a line\n" * 600, "size", "lines, over 600"),
    ("fmesh.context.renewal", "class Big:\n    '''Docstrings do not count.'''\n" + "    x = 1\n" * 300, "size",
     "class Big has 301 lines of code, over 300"),
]


@pytest.mark.parametrize(("module", "code", "rule", "fragment"), PLANTED, ids=[f"{p[2]}:{p[0]}" for p in PLANTED])
def test_a_planted_violation_is_caught(module: str, code: str, rule: str, fragment: str) -> None:
    tree: tuple[Module, ...] = planted(TREE, module, code)
    found = [v for v in all_violations(tree) if v.rule == rule]
    assert found and any(fragment in str(v) for v in found), [str(v) for v in all_violations(tree)]


PURE = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
import fmesh
mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"), rank_map=list(range(15, -1, -1)))
flat = fmesh.flatten(mesh, ("dp", "cp"), "dp_cp")
split = fmesh.unflatten(fmesh.slice(fmesh.flatten(fmesh.make_mesh((3, 2, 2), ("a", "b", "c")), ("a", "c"), "ac"), "ac"),
                        "ac", {"p": 2, "q": 3})
print(flat.group(0, "dp_cp"), split.groups("q")[0], mesh.rank_grid()[0][0], fmesh.select(mesh, dp=1).rank_grid()[0])
dims = fmesh.ParallelDims(64, pp=2, cp=2, tp=4)
print(fmesh.Topology(8, 8).span(dims.world_mesh, "tp"))
print(fmesh.render(mesh, highlight="tp").splitlines()[0], len(fmesh.rendering.html(mesh)) > 0)
import fmesh.spmd  # the sharding picture is pure too: specs, shardings and the grid it is drawn on
print(fmesh.spmd.sharding_text(fmesh.spmd.Sharding(mesh, fmesh.spmd.P("dp", None, "tp")), (4, 3, 8, 5)).splitlines()[2])
print(fmesh.plan.job_table.format_plan(fmesh.plan.jobs.build_plan(64, 8, tp=8)).splitlines()[0])
from fmesh.cli import main
main(["plan", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--json"])
try:
    fmesh.Context
except ImportError:
    print("the context needs torch")
"""


def test_the_pure_layers_run_without_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PURE], capture_output=True, text=True, timeout=patience(120))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Rank 0 sits in the last slot (dp=1, cp=1, tp=3): its dp_cp group is the last tp column, reversed.
    assert lines[0] == "(12, 8, 4, 0) (0, 1, 4) (15, 14, 13, 12) (7, 6, 5, 4)"
    assert lines[1] == "AxisSpan(tp: size=4, groups=16, hosts/group=1)"
    assert "each block (2, 3, 2, 5)" in lines
    assert lines[-1] == "the context needs torch"
