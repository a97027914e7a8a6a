"""Smoke test: ``python bench/spmd.py --quick`` runs and prints its tables (so the benchmark cannot rot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent


def test_quick_spmd_benchmark_runs() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "spmd.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "| collective | Context µs | region, checks off µs | overhead µs | region, checks on µs |" in out
    for name in ("psum", "all_gather", "psum_scatter"):
        assert sum(line.startswith(f"| {name} |") for line in out.splitlines()) == 2
    for how in ("region, checked", "region, unchecked", "region, compiled", "DTensor"):
        assert f"| {how} |" in out
