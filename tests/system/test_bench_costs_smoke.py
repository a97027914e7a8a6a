"""Smoke test: ``python bench/costs.py --quick`` runs and prints its table (so the benchmark cannot rot)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")


def test_quick_cost_benchmark_runs() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "costs.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "fitted from broadcasts: launch" in out
    assert "| procs | collective | size | measured ms | model ms (fitted) | model / measured | algorithm |" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| 2 | ", "| 4 | "))]
    assert len(rows) == 2 * 5 * 3  # 2 and 4 processes, 5 collectives, 3 sizes
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)
