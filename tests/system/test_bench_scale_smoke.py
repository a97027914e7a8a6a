"""Smoke test: ``python bench/scale.py --quick`` runs its simulated ranks against a real store, every rank stays
within the store-operation bound of ``tests/context/test_store_operations.py``, and the mismatch and the recovery
end as they must."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = ROOT / "bench" / "scale.py"
BOUND = 16  # store operations per member of one agreement (tests/context/test_store_operations.py, #27)
PHASES = ["start", "materialize", "agree", "mismatch", "recover", "torch barrier"]


def test_quick_scale_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=patience(600))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| ranks | mesh (pp, dpr, dps, cp, tp) | phase | wall s | ops/rank max |" in proc.stdout
    for size in ("64", "256"):
        for phase in PHASES:
            assert f"| {size} | " in proc.stdout and f" | {phase} | " in proc.stdout
    assert "operations/s**" in proc.stdout and "16,384: total ops" in proc.stdout
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [row["ranks"] for row in rows] == [64, 256]
    for row in rows:
        assert row["as_expected"] == dict.fromkeys(PHASES, True), row["outcomes"]
        assert row["mismatch_errors"] == len(row["mismatched_group"]) > 1  # every member of the odd group, no other
        assert row["lost_rank_fenced"]
        ops = row["ops"]
        assert max(ops["start"]) <= BOUND
        assert max(ops["materialize"]) <= BOUND  # one meeting on every group of the mesh
        assert max(ops["agree"]) <= BOUND * row["groups_per_rank"]  # one agreement per group of the rank
        assert max(ops["mismatch"]) <= BOUND
        # the recovery: the bound, plus one counter per group the rank holds (who holds it), whatever N
        assert max(ops["recover"]) <= BOUND + row["groups_per_rank"]
    for phase in PHASES[:5]:  # operations per rank do not grow with the world
        per_rank = [sum(row["ops"][phase]) / row["ranks"] for row in rows]
        assert per_rank[1] <= 1.25 * per_rank[0], (phase, per_rank)
    assert results["capacity"]["ops_per_s"] > 0
    # A start carrying every group of the mesh costs at most twice torch's own start barrier (issue 37).
    assert "| start carrying the mesh | start, then materialize |" in proc.stdout
    for row in rows:
        start, barrier = (sum(row["ops"][phase]) / row["ranks"] for phase in ("start", "torch barrier"))
        assert start <= 2 * barrier, (row["ranks"], start, barrier)
