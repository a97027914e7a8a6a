"""The README's and the docs' examples run as written, and CI runs the README's test command verbatim."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from paths import ROOT
from support import patience

import fmesh

README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
BASH_BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
TEXT_BLOCKS = re.findall(r"```text\n(.*?)```", README, flags=re.S)
DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))
DOC_BLOCKS = [(page.relative_to(ROOT), index, block) for page in DOC_PAGES
              for index, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(120), cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_examples_run(index: int) -> None:
    result = _run(PYTHON_BLOCKS[index])
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("page", "index", "code"), DOC_BLOCKS, ids=[f"{p}:{i}" for p, i, _ in DOC_BLOCKS])
def test_docs_python_examples_run(page: pathlib.Path, index: int, code: str) -> None:
    result = _run(code)
    assert result.returncode == 0, f"{page}, python block {index}:\n{result.stderr}"


def test_there_are_docs_examples_to_run() -> None:
    assert len(DOC_BLOCKS) >= 5, [str(p) for p, _, _ in DOC_BLOCKS]


@pytest.mark.slow
def test_quickstart_comments_tell_the_truth() -> None:
    quickstart = PYTHON_BLOCKS[0]
    result = _run(quickstart)
    printed = result.stdout.splitlines()
    claimed = [line.split("# ", 1)[1] for line in quickstart.splitlines() if line.startswith("print(") and "# " in line]
    assert printed[0] == claimed[0] == "Mesh(dp=2, cp=2, tp=4; world=16)"
    assert printed[1] == claimed[1] == "(4, 5, 6, 7) (0, 1, 1)"
    assert printed[2] == claimed[2] == "(0, 4, 8, 12)"
    assert claimed[3].endswith(printed[3])
    assert printed[4] == claimed[4] == "((0, 4), (1, 5))"


def test_the_readme_picture_is_what_render_draws() -> None:
    call = 'fmesh.render(mesh, highlight="tp", rank=5, gpus_per_node=8)'
    assert f"`{call}`: 16 ranks as dp 2 × cp 2 × tp 4" in README
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    assert TEXT_BLOCKS[0].rstrip("\n") == fmesh.render(mesh, highlight="tp", rank=5, gpus_per_node=8)


@pytest.mark.slow
def test_the_readme_torchrun_script_is_the_example_and_runs_under_torchrun() -> None:
    assert PYTHON_BLOCKS[1].rstrip("\n") == QUICKSTART.read_text().rstrip("\n")
    assert len(PYTHON_BLOCKS[1].splitlines()) <= 20
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone", str(QUICKSTART)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=patience(180),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Four processes share one pipe: a line may be written in two pieces, so find the lines, not split them.
    lines = sorted(re.findall(r"rank \d+: tp group .*? averages \d+", proc.stdout))
    assert lines == [
        "rank 0: tp group (0, 1) sums to 1, dp group (0, 2) averages 1",
        "rank 1: tp group (0, 1) sums to 1, dp group (1, 3) averages 2",
        "rank 2: tp group (2, 3) sums to 5, dp group (0, 2) averages 1",
        "rank 3: tp group (2, 3) sums to 5, dp group (1, 3) averages 2",
    ]
    picture = fmesh.render(fmesh.make_mesh((2, 2), ("dp", "tp")), highlight="tp", rank=0)
    assert picture in proc.stdout
    assert picture + "\n" + "\n".join(lines) in (ROOT / "docs" / "getting-started.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    commands = [block.strip() for block in BASH_BLOCKS if "pytest" in block]
    assert len(commands) == 1
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[0] in ci.splitlines()
    main_job = [block.strip() for block in BASH_BLOCKS if "examples/train.py" in block]
    assert len(main_job) == 1 and main_job[0].startswith("python3 -m venv .venv")


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 200
