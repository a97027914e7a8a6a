"""The README's examples run as written, and CI runs the README's test command verbatim."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
BASH_BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_examples_run(index: int) -> None:
    result = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_quickstart_comments_tell_the_truth() -> None:
    quickstart = PYTHON_BLOCKS[0]
    result = subprocess.run([sys.executable, "-c", quickstart], capture_output=True, text=True, timeout=120)
    printed = result.stdout.splitlines()
    claimed = [line.split("# ", 1)[1] for line in quickstart.splitlines() if line.startswith("print(") and "# " in line]
    assert printed[0] == claimed[0] == "Mesh(dp=2, cp=2, tp=4; world=16)"
    assert printed[1] == claimed[1] == "(4, 5, 6, 7) (0, 1, 1)"
    assert printed[2] == claimed[2] == "(0, 4, 8, 12)"
    assert claimed[3].endswith(printed[3])
    assert printed[4] == claimed[4] == "((0, 4), (1, 5))"


def test_ci_runs_the_readme_test_command() -> None:
    commands = [block.strip() for block in BASH_BLOCKS if "pytest" in block]
    assert len(commands) == 1
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[0] in ci.splitlines()
    main_job = [block.strip() for block in BASH_BLOCKS if "examples/train.py" in block]
    assert len(main_job) == 1 and main_job[0].startswith("python3 -m venv .venv")
