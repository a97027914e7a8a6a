"""Smoke test: ``python bench/group_creation.py --quick`` runs, and fmesh's per-member keys stay constant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = ROOT / "bench" / "group_creation.py"


def test_quick_group_creation_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| members | fmesh keys | fmesh bytes | fmesh µs |" in proc.stdout
    results = json.loads(out.read_text())
    rows = results["agreement"]
    assert [row["members"] for row in rows] == [2, 8, 32, 128, 512]
    assert {row["fmesh"][0] for row in rows} == {4}  # the same 4 keys per member at every size
    assert max(row["fmesh"][1] for row in rows) < 1200
    assert rows[-1]["before"][0] == 512 and rows[-1]["before"][1] > 1000 * rows[0]["before"][1]
    assert [row["keys"] for row in results["torch_gloo"]] == [2, 4]  # torch: one key per member
