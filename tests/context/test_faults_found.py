"""The defects of issue 38, each found by a fault at a moment no scenario list named (most by the seeded fault campaign,
``tests/faults.py``), each a test that failed before its fix: real gloo processes, every one bounded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from support import launch, patience

import fmesh
from fmesh import Context
from fmesh.context.launch import free_port

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nothing_left_behind")]


def options_differ_between_ranks(ctx: Context) -> Any:
    """A second context whose ranks differ in ``check_tensors``: rank 1's tensor check would run against rank 0's
    data inside gloo (a SIGABRT, before). Each rank: what it raised, and when."""
    started = time.monotonic()
    try:
        with Context(backend="gloo", name="second", check_tensors=ctx.rank == 0, creation_timeout=20) as second:
            second.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("dp",)), "dp")
    except Exception as error:
        return type(error).__name__, str(error), time.monotonic() - started
    return "ok", "", time.monotonic() - started


def test_ranks_whose_options_differ_each_get_one_clear_error_at_start() -> None:
    first, second = launch(options_differ_between_ranks, 2, timeout=60)
    assert second[0] == "ValueError" and "check_tensors: False here, True there" in second[1], second
    assert first[0] == "RankLostError" and "rank 1" in first[1] and "check_tensors" in first[1], first
    assert first[2] < patience(10, 2), first  # the first look of its group's agreement, not the creation timeout


def raises_while_the_job_starts(ctx: Context) -> Any:
    return "started"


def test_a_rank_that_fails_while_the_others_start_ends_their_wait_at_once() -> None:
    """Campaign seed 8 (worlds 2-4): a rank raised inside the start's rendezvous; the other waited the whole
    collective timeout, then raised GroupTimeoutError."""
    from fmesh.context.store import rendezvous

    meet = rendezvous.meet

    def failing(*args: Any, **kwargs: Any) -> None:
        if os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1 cannot start")
        meet(*args, **kwargs)

    rendezvous.meet = failing  # type: ignore[assignment]  # in the forked ranks; this process calls none
    try:
        started = time.monotonic()
        results = launch(raises_while_the_job_starts, 2, timeout=120, context_timeout=60)
        took = time.monotonic() - started
    finally:
        rendezvous.meet = meet  # type: ignore[assignment]
    assert isinstance(results[1], RuntimeError) and "rank 1 cannot start" in str(results[1]), results
    assert isinstance(results[0], fmesh.RankLostError), results
    assert "rank 1 cannot start" in str(results[0]) and "RANK='1'" in str(results[0]), results[0]
    assert took < patience(20, 2), took  # not the 60 s timeout


SLURM_TASK = """
import torch, fmesh
with fmesh.Context.from_env(backend="gloo", timeout=60) as ctx:
    total = ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), fmesh.make_mesh((ctx.world_size,), ("dp",)), "dp")
    print(ctx.rank, ctx.world_size, int(total.item()))
"""


def test_tasks_started_by_srun_form_a_job_from_slurms_variables() -> None:
    """Two processes with only the variables srun sets for each task (no RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    they form one world of two. Before, each was a world of one."""
    job = free_port() - 15000  # the port fmesh derives from SLURM_JOB_ID: 15000 + job % 20000
    launcher = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    environ = {k: v for k, v in os.environ.items() if k not in launcher}
    environ.update(SLURM_NTASKS="2", SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID=str(job % 20000),
                   SLURM_STEP_TASKS_PER_NODE="2", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", SLURM_TASK], env={**environ, "SLURM_PROCID": str(task),
                                                                         "SLURM_LOCALID": str(task)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for task in range(2)]
    try:
        outputs = [proc.communicate(timeout=patience(90, 2)) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = sorted(out.strip().splitlines()[-1] if out.strip() else err[-500:] for out, err in outputs)
    assert lines == ["0 2 3", "1 2 3"], lines
