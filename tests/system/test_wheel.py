"""``pip install`` as a user does it: a wheel built from the project installs into a fresh environment and runs the
README's quickstart there, far from the source tree.

The fresh environment gets the wheel without its dependencies, then only ``attrs`` and ``typing-extensions``: the
quickstart is the pure half of fmesh, which must work where torch is not installed (a laptop planning a job), and
the wheel must carry every subpackage and the ``py.typed`` marker (a package left out of ``packages.find`` would
pass every other test, which import fmesh from the source tree).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest
from paths import ROOT
from support import patience

QUICKSTART = re.findall(r"## Quickstart\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def _run(*command: str | pathlib.Path, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    # Nothing of the test session's paths: the fresh environment sees only what was installed into it.
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            timeout=patience(300), cwd=cwd, env=env)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_a_wheel_installs_into_a_fresh_environment_and_runs_the_quickstart(tmp_path: pathlib.Path) -> None:
    assert len(QUICKSTART) == 1
    # No build isolation: the set-up tools of the environment running the tests build it, offline.
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
         ROOT, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("fmesh-*.whl")

    packaged = set(zipfile.ZipFile(wheel).namelist())
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "fmesh").rglob("*.py")}
    assert sources - packaged == set(), "modules missing from the wheel"
    assert "fmesh/py.typed" in packaged

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    _run(python, "-m", "pip", "install", "-q", "attrs", "typing-extensions", cwd=tmp_path)

    result = _run(python, "-c", QUICKSTART[0], cwd=tmp_path)
    assert "Mesh(dp=2, cp=2, tp=4; world=16)" in result.stdout
    where = _run(python, "-c", "import fmesh, importlib.util; print(fmesh.__file__, importlib.util.find_spec('torch'))",
                 cwd=tmp_path)
    assert str(venv) in where.stdout and where.stdout.strip().endswith("None"), where.stdout
