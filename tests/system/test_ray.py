"""Recovery in place on an engine that keeps the survivors: Ray actors (``fmesh.context.ray_actors``), through
``bench/ray_recovery.py``: 4 actors on a local Ray cluster, one dies, the survivors recover and train on, their losses
those of one process on the whole batch. Skipped where ray is not installed (``pip install 'fmesh[ray]'``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from paths import ROOT
from support import patience

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                                   reason="ray is not installed: pip install 'fmesh[ray]'")]


def test_four_ray_actors_lose_one_and_the_survivors_train_on() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ray_recovery.py")], capture_output=True, text=True,
                          timeout=patience(240, 4))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "rank 3: LaunchError: rank 3 died (its Ray actor ended)" in lines, done.stdout
    assert "every survivor's losses equal those, within 1e-5, before and after the loss: True" in lines, done.stdout
    assert sum(line.startswith("rank ") and "world 3 after the loss" in line for line in lines) == 3, done.stdout
