"""Smoke test: ``python bench/gpu_check.py --cpu`` runs every check it can without a GPU (gloo, 2 processes),
so the GPU check cannot rot on machines that have none."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")


def test_gpu_check_runs_its_checks_on_the_cpu() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| check") and "µs" not in line and "---" not in line
            and not line.startswith("| 1 ")}
    assert rows["collectives, groups made lazily"] == "ok"
    assert rows["group order, lazily"] == "ok"
    assert rows["DTensor and FSDP2 on ctx.device_mesh"] == "ok"
    assert rows["the members' check: no host synchronisation in steady state"] == "ok"
    assert rows["examples/train.py on every process"] == "ok"
    assert rows["device-bound default group + materialize"] == "not run"  # says why, never silently
    assert "| 1 elem |" in proc.stdout and "| 1 KiB |" in proc.stdout and "| 1 MiB |" in proc.stdout
    header = "| size | bare µs | bare + clone µs | funcol µs | fmesh default µs | fmesh every call µs | fmesh off µs |"
    assert header in proc.stdout
