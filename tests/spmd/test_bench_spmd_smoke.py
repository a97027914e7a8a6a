"""Smoke test: ``python bench/spmd.py --quick`` runs and prints its tables (so the benchmark cannot rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import patience

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent


def test_quick_spmd_benchmark_runs() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "spmd.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=patience(600))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "| collective | Context µs | region, checks off µs | overhead µs | region, checks on µs |" in out
    for name in ("psum", "all_gather", "psum_scatter"):
        assert sum(line.startswith(f"| {name} |") for line in out.splitlines()) == 2
    for how in ("region, checked", "region, unchecked", "region, compiled", "DTensor"):
        assert f"| {how} |" in out
    # (c) the TP + SP block: every way a row, timed or saying why it failed; the region's losses equal DTensor's
    assert "| how | µs | first loss - DTensor's |" in out
    rows = {line.split(" | ")[0][len("| block: "):]: line.split(" | ")[1:] for line in out.splitlines()
            if line.startswith("| block: ")}
    assert sorted(rows) == sorted(["region, checked", "region, unchecked", "region, compiled",
                                   "DTensor (parallelize_module)", "DTensor, compiled"]), rows
    for how in ("region, checked", "region, unchecked", "DTensor (parallelize_module)"):
        assert float(rows[how][0]) > 0, (how, rows[how])
        assert float(rows[how][1].rstrip(" |")) < 1e-4, (how, rows[how])
    for how, (us, _) in rows.items():
        assert us.startswith("fails: ") or float(us) > 0, (how, us)
    # (d) the steady state of the check: both rows, timed
    assert "| region | µs | / unchecked |" in out
    assert "| checked |" in out and "| unchecked |" in out


def test_the_fuzzer_benchmark_runs_and_counts_every_verdict() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "spmd_fuzz.py"), "--programs", "30"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = [[line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
              for block in proc.stdout.split("\n\n")]
    verdicts, fixes = (next(t for t in tables if t and t[0].startswith(head)) for head in (
        "| verdict", "| the fixes printed"))
    rows = {line.split(" | ")[0][2:]: int(line.split(" | ")[1].rstrip(" |")) for line in verdicts[1:]}
    assert set(rows) == {"caught", "right", "false positive", "silently wrong", "loud", "not built"}, rows
    assert sum(rows.values()) == 30 and rows["silently wrong"] == 0, rows
    fixed = {line.split(" | ")[0][2:]: int(line.split(" | ")[1].rstrip(" |")) for line in fixes[1:]}
    assert sum(fixed.values()) == rows["caught"] and fixed["silently wrong"] == 0, fixed
