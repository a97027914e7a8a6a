"""Smoke test: ``python bench/mesh_ops.py --quick`` runs and prints its tables (so the benchmark cannot rot)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = ROOT / "bench" / "mesh_ops.py"


def test_quick_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=patience(120),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| op | world | fmesh µs | DeviceMesh µs | speedup |" in proc.stdout
    assert "2^20" in proc.stdout
    assert "peak KiB" in proc.stdout
    results = json.loads(out.read_text())
    assert {row["op"] for row in results["comparison"]} >= {"build", "slice", "flatten", "build + slice"}
    assert all(row["fmesh_us"] > 0 and row["device_mesh_us"] > 0 for row in results["comparison"])
    assert len(results["memory"]) == 3
