"""Jobs that lose a rank and train on: ``examples/train.py``'s elastic mode in one process (``fmesh.launch``), and
``examples/elastic_torchrun.py``, two torchrun agents of which one is killed (each run its own subprocess)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from paths import ROOT
from support import losses, patience

pytestmark = pytest.mark.slow  # subprocess runs of the examples: left out of the quick subset (-m "not slow")
SCRIPT = ROOT / "examples" / "train.py"


def test_elastic_mode_loses_a_rank_and_trains_on_from_the_resharded_checkpoint(tmp_path: pathlib.Path) -> None:
    """4 ranks in one process (fmesh.launch), rank 3 exits at step 5; the 3 survivors recover, load the step-4
    checkpoint resharded over 3 ranks, and their losses at steps 4 and 5 are the 4-rank job's (same global batch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    command = [sys.executable, str(SCRIPT), "--processes", "4", "--batch-size", "12", "--steps", "7", "--seq-len",
               "16", "--dim", "32", "--log-every", "1", "--checkpoint-dir", str(tmp_path / "ckpt"),
               "--checkpoint-every", "4", "--lose-rank", "3", "--at-step", "5", "--losses-to", str(tmp_path / "l.json")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=patience(240),
                         env={**env, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rank 3: exits at step 5" in run.stdout and "lost rank 3: recovered in" in run.stdout, run.stdout
    # the figure the README and the elastic guide promise, printed by the command they show
    assert re.search(r"^death -> next step: \d+\.\d\d s$", run.stdout, flags=re.M), run.stdout
    logged: dict[int, list[float]] = {}
    for step, loss in re.findall(r"step +(\d+) +loss (\d+\.\d+)", run.stdout):  # ranks' lines may interleave
        logged.setdefault(int(step), []).append(float(loss))
    start, recovered = losses(tmp_path / "l.json")
    assert start == 4 and len(recovered) == 3  # steps 4, 5, 6 by the 3 survivors
    assert len(logged[4]) == 2 and logged[4][0] == pytest.approx(recovered[0], abs=1e-4), logged  # 4 ranks, then 3
    assert [round(x, 4) for x in recovered] == [logged[4][1], logged[5][0], logged[6][0]], logged


def test_two_torchrun_agents_one_killed_the_other_trains_on_alone() -> None:
    """examples/elastic_torchrun.py: two agents (--nnodes 1:2, 2 processes each) train one 4-rank job; the second
    is killed after the step-4 checkpoint; torchrun restarts the first one's processes in a world of 2, which
    resume from that checkpoint, resharded, and finish."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "elastic_torchrun.py"), "--steps", "7", "--kill-at",
                          "4", "--timeout", "200"], capture_output=True, text=True,
                         timeout=patience(240), env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "world 4 (torchrun restart 0)" in out and "world 2 (torchrun restart 1)" in out, out[-3000:]
    assert "resumed from step 4" in out, out[-3000:]
    logged = {int(step): float(loss) for step, loss in re.findall(r"step +(\d+) +loss (\d+\.\d+)", out)}
    assert set(logged) == set(range(7)) and logged[6] < logged[0], logged
