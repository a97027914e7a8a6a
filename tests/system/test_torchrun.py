"""fmesh under torchrun: ``Context.from_env()`` on 4 processes launched by ``torch.distributed.run``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from paths import ROOT, TESTS
from support import patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = TESTS / "torchrun_script.py"


def test_context_from_env_under_torchrun() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=patience(120),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("fmesh-torchrun"))
    # rank_map [3, 0, 2, 1]: dp groups {3, 2} and {0, 1}; tp groups {3, 0} and {2, 1}.
    want = {0: (1, 3), 1: (1, 3), 2: (5, 3), 3: (5, 3)}
    assert len(lines) == 4, proc.stdout
    for rank, (dp, tp) in want.items():
        pattern = rf"fmesh-torchrun rank {rank}/4 local_rank {rank} gloo dp={dp} tp={tp} ok"
        assert sum(1 for line in lines if re.fullmatch(pattern, line)) == 1, (pattern, lines)
