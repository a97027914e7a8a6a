"""A fixed sample of the seeded fault campaign (``tests/faults.py``; the nightly command is ``python bench/faults.py
--seeds 1000``): each seed a job of 2 to 4 gloo processes meeting a random fault at a random point, judged by the
failure model's promises (no hang, no wrong sum, every survivor recovers into the same new world or raises a named
error within its bound, no living rank blamed; and, by ``nothing_left_behind``, nothing left in this process).

The sample is chosen for speed (most runs take 0.2 to 2 s; a second fault in the roll call or in torch's set-up of
the new world, 6 to 10 s; a death no launcher marks, 5 to 12 s) and so that every kind of fault meets every point;
11 of its runs have no launcher marking the dead (seeds 4, 7, 48, 502 and 56 among them: a kill in the members'
check, in a collective, between steps, in torch's set-up). The seeds that broke a promise are tests of their own in
``test_faults_found.py``.
"""

from __future__ import annotations

import faults
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nothing_left_behind")]

WORLDS = (2, 4)
# Five seeds per kind of fault, one per first point (kill, raise, stop, delay), and the second faults: in the roll
# call (502), the recovery's vote (48), the new world's start (219) and torch's set-up of it (56).
SAMPLE = (4, 7, 13, 18, 35, 9, 34, 49, 54, 48, 12, 16, 40, 44, 15, 3, 31, 30, 32, 51, 502, 219, 56)


@pytest.mark.parametrize("seed", SAMPLE)
def test_a_seeded_fault_keeps_every_promise(seed: int) -> None:
    verdict = faults.run(faults.draw(seed, WORLDS))
    assert verdict.ok, str(verdict)
    assert verdict.struck, f"no fault of seed {seed} struck: the sample must strike\n{verdict}"


def test_the_sample_meets_every_kind_of_fault_at_every_point() -> None:
    planned = [fault for seed in SAMPLE for fault in faults.draw(seed, WORLDS).faults]
    assert {fault.kind for fault in planned} == set(faults.KINDS)
    assert {fault.point for fault in planned} == set(faults.POINTS), sorted({fault.point for fault in planned})
    for kind in faults.KINDS:  # every kind at every first point
        assert {f.point for f in planned if f.kind == kind} >= set(faults.FIRST_POINTS), kind
    # Deaths with no launcher marking them (as under torchrun): told by the roll call, the statuses, the heartbeat.
    unmarked = [faults.draw(seed, WORLDS) for seed in SAMPLE if not faults.draw(seed, WORLDS).marks]
    assert {f.kind for trial in unmarked for f in trial.faults} >= set(faults.DEADLY), unmarked
