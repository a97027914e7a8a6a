"""The notebooks run top to bottom, and are committed with the outputs of such a run."""

from __future__ import annotations

import importlib.util
import pathlib

import nbformat
import pytest
from paths import ROOT

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

FOLDER = ROOT / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("notebook_build", FOLDER / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def test_there_are_four_notebooks_built_from_one_place() -> None:
    assert sorted(build.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    assert [p.name for p in NOTEBOOKS] == ["01_mesh_algebra.ipynb", "02_planning_a_job.ipynb", "03_collectives.ipynb",
                                           "04_sharded_computation.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_the_cells_of_build_py(path: pathlib.Path) -> None:
    # A cell edited in build.py but not re-run leaves a stale notebook that works on one torch only.
    committed = [(cell.cell_type, cell.source) for cell in nbformat.read(path, as_version=4).cells]
    built = [(cell.cell_type, cell.source) for cell in build.make(build.NOTEBOOKS[path.name]).cells]
    assert committed == built, f"{path.name} differs from notebooks/build.py: run python notebooks/build.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_was_committed_with_outputs(path: pathlib.Path) -> None:
    committed = nbformat.read(path, as_version=4)
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name} is not a fresh top-to-bottom run: {counts}"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) // 2, f"{path.name} lacks outputs"
    assert not any(out.get("output_type") == "error" for cell in code for out in cell.outputs)
    fresh = build.execute(nbformat.read(path, as_version=4))  # raises CellExecutionError on a failing cell
    errors = [out for cell in fresh.cells if cell.cell_type == "code" for out in cell.outputs
              if out.get("output_type") == "error"]
    assert not errors
