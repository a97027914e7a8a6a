"""Smoke test: ``python bench/collectives.py --quick`` runs and prints its tables (so the benchmark cannot rot)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import ROOT
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = ROOT / "bench" / "collectives.py"


def test_quick_collectives_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=patience(600)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "| procs | size | bare µs | fmesh µs | overhead µs | ratio |" in out
    assert "| call | µs |" in out and "ctx.group(mesh, 'tp') (cached group lookup)" in out
    assert "| world | what | torch groups | fmesh groups | torch ms | fmesh ms | same groups |" in out
    rows = [line for line in out.splitlines() if line.startswith("| 2 | 1 ") and line.count("|") == 10]
    assert len(rows) == 6  # 1 elem, 1 KiB, 1 MiB on 2 processes: the members' check's table, and (a)
    titan = [line for line in out.splitlines() if line.startswith("| 64 | ")]
    assert len(titan) == 2 and all(line.rstrip().endswith("| yes |") for line in titan)
    assert "| 64 | build mesh + views + ep | 10 | 10 |" in out  # the same groups, counted on both sides
    assert "| procs | call | object | torch µs | fmesh µs | overhead µs | pickle + unpickle µs |" in out
    for call in ("all_gather_object | small dict", "broadcast_object | 64 KiB bytes", "ppermute (ring) | 1 KiB",
                 "shift(wrap=True) | 1 KiB"):
        assert f"| 2 | {call} |" in out, call
    assert "ctx.ppermute(t, mesh, 'tp', [(0, 1), (1, 0)]) on fake (no comm)" in out
    # (d) gradients and compile
    assert "| the autograd wrapper's cost (difference) |" in out
    # the members' check against c10d and funcol, each mode; the Python cost on a no-op backend; the TP/SP block
    assert ("| procs | size | bare c10d µs | bare c10d + clone µs | funcol µs | fmesh default µs | fmesh every call µs "
            "| fmesh off µs | default - (bare + clone) µs |") in out
    for label in ("fmesh default - (bare c10d + clone)", "fmesh default, t.requires_grad - (bare c10d + clone)"):
        assert f"| {label} | " in out, label
    block = [line for line in out.splitlines() if line.startswith("| 2 | 64 | 64 | ")]
    assert len(block) == 1 and block[0].count("|") == 10, out
    for label in ("fmesh eager", "funcol eager", "fmesh compiled", "funcol compiled"):
        assert f"| 2 | {label} |" in out, label
