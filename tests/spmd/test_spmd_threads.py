"""A region checked on several threads of one process (as the tests' simulated worlds run their members) does not
deadlock in torch's random state: ``torch.random.fork_rng`` did, on every torch from 2.10 to 2.15, when a garbage
collection ran inside ``get_rng_state`` (it held the generator with the GIL let go, and another thread asking for
the state held the GIL while waiting for the generator). The run is a subprocess: a deadlock that holds the GIL
stops every thread of its process, the test's own too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support import patience

pytestmark = pytest.mark.slow  # a subprocess

THREADS = """
import gc, threading, torch
from {module} import {name} as kept

gc.set_threshold(50, 5, 5)  # collections often, so that one runs inside the state's read

def draws():
    for _ in range(2000):
        garbage = [torch.zeros(2)]
        garbage.append(garbage)  # a cycle that holds a tensor: only a collection frees it
        with kept():
            torch.rand(1)

threads = [threading.Thread(target=draws) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("done")
"""


def test_the_random_state_kept_around_a_rehearsal_does_not_deadlock_beside_other_threads() -> None:
    code = textwrap.dedent(THREADS.format(module="fmesh.spmd.rehearsal", name="random_state_kept"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(60))
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
