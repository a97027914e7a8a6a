"""The defects of issue 38, each found by a fault at a moment no scenario list named (most by the seeded fault campaign,
``tests/faults.py``), each a test that failed before its fix: real gloo processes, every one bounded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

import faults
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
    results = launch(options_differ_between_ranks, 2, timeout=60)
    # The rank that starts second is told (either may be first): ValueError naming the field there, RankLostError
    # naming that rank and its error on the other.
    (odd,) = [rank for rank, result in enumerate(results) if result[0] == "ValueError"]
    mine, theirs = ("'off'", "'steady'") if odd == 1 else ("'steady'", "'off'")  # the check's modes
    assert f"check_tensors: {mine} here, {theirs} there" in results[odd][1], results
    other = results[1 - odd]
    assert other[0] == "RankLostError" and f"rank {odd} failed" in other[1] and "check_tensors" in other[1], other
    assert other[2] < patience(10, 2), other  # the first look of its group's agreement, not the creation timeout


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


# ------------------------------------------------------------------------------------------ recovery tried again

ALL = ("all",)


def recovered_after_retries(ctx: Context, tries: list[list[int]], before: Any = None) -> Any:
    """Rank 3 dies; each survivor recovers with each lost set of ``tries`` in turn until one succeeds (``before(ctx,
    n)``: what this rank does before its n-th try). What each try raised, and the new world's sum and size."""
    mesh = fmesh.make_mesh((4,), ALL)
    ctx.all_reduce(torch.ones(1), mesh, ALL)
    if ctx.rank == 3:
        os._exit(3)
    with pytest.raises(fmesh.RankLostError):
        ctx.all_reduce(torch.ones(1), mesh, ALL)
    errors = []
    for n, lost in enumerate(tries):
        if before is not None:
            before(ctx, n)
        try:
            renewed = ctx.recover(lost)
        except fmesh.RecoveryError as error:
            errors.append(str(error))
            continue
        assert renewed is not None
        with renewed:
            world = fmesh.make_mesh((renewed.world_size,), ALL)
            return errors, renewed.all_reduce(torch.ones(1), world, ALL).item(), renewed.world_size
    return errors, None, None


def dies_in_the_vote(ctx: Context, n: int) -> None:
    """Rank 2 dies when it comes to the survivors' vote."""
    from fmesh.context.store import recovery_vote

    if ctx.rank == 2:
        recovery_vote.agree_on_loss = lambda *args, **kwargs: os._exit(7)  # type: ignore[assignment]


def dies_in_the_new_worlds_rendezvous(ctx: Context, n: int) -> None:
    """Rank 2 dies after the vote, where the survivors meet to start the new world (fmesh's rendezvous)."""
    from fmesh.context.store import rendezvous

    if ctx.rank == 2:
        rendezvous.meet = lambda *args, **kwargs: os._exit(7)  # type: ignore[assignment]


def dies_in_torchs_set_up(ctx: Context, n: int) -> None:
    """Rank 2 dies inside torch's set-up of the new world (after the vote, after fmesh's rendezvous)."""
    import torch.distributed as dist

    if ctx.rank == 2:
        dist.init_process_group = lambda *args, **kwargs: os._exit(7)  # type: ignore[assignment]


def retries(ctx: Context, before: Any, tries: list[list[int]]) -> Any:
    return recovered_after_retries(ctx, tries, before)


@pytest.mark.parametrize(("before", "first", "said"), [
    (dies_in_the_vote, [3], "survivors [2] did not come to recover without [3]"),
    (dies_in_the_new_worlds_rendezvous, [3], "the processes of ranks [2] ended before"),
    (dies_in_torchs_set_up, [3], "their new world could not start: ranks [2] ended"),
])
def test_recover_tried_again_after_a_second_death_succeeds(before: Any, first: list[int], said: str) -> None:
    """A second survivor dies during the recovery: the others' RecoveryError names it, and ``recover`` tried again
    without it too succeeds. Before, the second try raised "fenced out ... they went on without it" (after a failed
    vote) or ContextClosedError (after a failed start); a death inside torch's set-up of the new world left the
    others waiting the whole collective timeout, then a raw DistStoreError."""
    started = time.monotonic()
    results = launch(lambda ctx: retries(ctx, before, [first, [2, 3]]), 4, timeout=120, context_timeout=60,
                     creation_timeout=8, on_rank_loss="continue")
    took = time.monotonic() - started
    assert [getattr(result, "exitcode", None) for result in results[2:]] == [7, 3], results
    for rank in (0, 1):
        errors, total, size = results[rank]
        assert len(errors) == 1 and said in errors[0], (rank, errors)
        assert (total, size) == (2.0, 2), results[rank]
    assert took < patience(40, 4), took  # not the 60 s collective timeout


def late_by_the_creation_timeout(ctx: Context, n: int) -> None:
    if ctx.rank == 2 and n == 0:
        time.sleep(10)  # past the others' creation timeout (8 s): they give up on it


def test_recover_tried_again_after_a_survivor_came_too_late_succeeds() -> None:
    results = launch(lambda ctx: retries(ctx, late_by_the_creation_timeout, [[3], [3]]), 4, timeout=120,
                     context_timeout=60, creation_timeout=8, on_rank_loss="continue")
    for rank in (0, 1, 2):
        errors, total, size = results[rank]
        assert len(errors) == 1 and "survivors [2] did not come" in errors[0], (rank, errors)
        assert (total, size) == (3.0, 3), results[rank]


def test_recover_tried_again_after_the_survivors_disagreed_succeeds() -> None:
    def tries(ctx: Context) -> Any:  # rank 0 first means the wrong ranks (rank 1 is alive)
        return recovered_after_retries(ctx, [[1, 3] if ctx.rank == 0 else [3], [3]])

    results = launch(tries, 4, timeout=120, context_timeout=60, creation_timeout=8, on_rank_loss="continue")
    for rank in (0, 1, 2):
        errors, total, size = results[rank]
        assert len(errors) == 1 and "the survivors disagree about the ranks lost" in errors[0], (rank, errors)
        assert (total, size) == (3.0, 3), results[rank]


# ------------------------------------------------------------------------------------------ seeds of the campaign


def test_a_member_that_cuts_a_group_a_peer_still_connects_is_named_on_that_peer() -> None:
    """Campaign seed 5 (the first draw, worlds 2-4): rank 2's first collective raised on it (the tensor check's
    all_reduce), so it cut the group while rank 1 was still connecting it; rank 1 raised gloo's raw "Connection closed
    by peer" from inside torch's set-up, and the others blamed rank 1, alive, as gone. Now rank 1 names rank 2."""
    trial = faults.Trial(5, 4, (4,), ("ep",), (3, 0, 2, 1), (("ep",),) * 4,
                         (faults.Fault("raise", "collective", 2, call=1),), check_tensors=True)
    verdict = faults.run(trial)
    assert verdict.ok, str(verdict)


def test_ranks_caught_in_different_phases_of_one_call_answer_one_roll_call() -> None:
    """Rank 2 dies while rank 0 is still in the members' tensor check (its all_reduce) and rank 1 is already in the
    data all_reduce of the same call: each names rank 2 alone, in seconds. Before, the two collectives carried
    different roll-call labels, so each waited out the roll call and named the other, alive, as gone."""
    from datetime import timedelta

    import torch.distributed as dist

    from fmesh.context import failures
    from fmesh.context.groups import Target
    from fmesh.context.options import GroupSettings
    from fmesh.context.store.board import Board, mark_ended

    store, mesh = dist.HashStore(), fmesh.make_mesh((3,), ("dp",))
    spec = GroupSettings.of(None, 60, backend="gloo").spec(("dp",), (0, 1, 2))
    mark_ended(store, 2, -9)
    said: dict[int, tuple[str, str, float]] = {}

    def fails(rank: int) -> None:
        board = Board(store, "t", rank, timedelta(seconds=30), launcher_store=store)
        what = "all_reduce (the members' check of their tensors)" if rank == 0 else "all_reduce"
        started = time.monotonic()
        try:
            failures.failed(what, Target(mesh, ("dp",), (0, 1, 2), spec, member=rank), (0, 1, 2),
                            timedelta(seconds=60), started, RuntimeError("Connection closed by peer"), board)
        except Exception as error:
            said[rank] = type(error).__name__, str(error), time.monotonic() - started

    from support import in_threads

    in_threads(fails, [0, 1], timeout=patience(30))
    for rank in (0, 1):
        kind, message, took = said[rank]
        assert kind == "RankLostError" and "ranks [2] of the group are gone" in message, said[rank]
        assert "did not answer" not in message and took < patience(3), said[rank]  # not the 5 s roll call


def test_a_harmless_error_earlier_does_not_make_a_living_rank_gone() -> None:
    """Rank 1 raised once and went on (its status still says it failed); later rank 2 dies while rank 1 is busy
    elsewhere (it does not answer the roll call): rank 0 names rank 2 as gone, and rank 1 apart, as not known to be
    gone. Before, a status that said failed counted as gone."""
    from datetime import timedelta

    import torch.distributed as dist

    from fmesh.context import failures
    from fmesh.context.groups import Target
    from fmesh.context.options import GroupSettings
    from fmesh.context.store.board import Board, mark_ended

    store, mesh = dist.HashStore(), fmesh.make_mesh((3,), ("dp",))
    spec = GroupSettings.of(None, 60, backend="gloo").spec(("dp",), (0, 1, 2))
    Board(store, "t", 1, timedelta(seconds=30)).failed(ValueError("a bad batch, caught and skipped"))
    mark_ended(store, 2, -9)
    board = Board(store, "t", 0, timedelta(seconds=30), launcher_store=store)
    with pytest.raises(fmesh.RankLostError) as caught:
        failures.failed("all_reduce", Target(mesh, ("dp",), (0, 1, 2), spec, member=0), (0, 1, 2),
                        timedelta(seconds=60), time.monotonic(), RuntimeError("Connection closed by peer"), board)
    message = str(caught.value)
    assert "ranks [2] of the group are gone" in message, message
    assert "ranks [1] did not answer a roll call" in message and "not known to be gone" in message, message


def test_the_store_host_checks_master_addr_names_a_host() -> None:
    """The process that hosts the store (RANK=0) with a MASTER_ADDR that names no host: ValueError naming MASTER_ADDR
    at once, as every other rank gets. Before, it hosted the store and waited its whole timeout for ranks that could
    never reach it."""
    script = ("import fmesh\ntry:\n    fmesh.Context.from_env(backend='gloo', timeout=30)\nexcept Exception as error:\n"
              "    print(type(error).__name__, error)\n")
    environ = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid",
               "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True,
                          timeout=patience(60))
    took = time.monotonic() - started
    assert done.stdout.startswith("ValueError") and "MASTER_ADDR='no-such-host.invalid' names no host" in done.stdout, \
        done.stdout + done.stderr[-2000:]
    assert took < patience(20), took  # the interpreter's start and torch's import, not the 30 s timeout



def test_an_error_inside_the_roll_call_is_not_taken_for_the_store_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Campaign seed 116 (worlds 2-8): an exception inside a survivor's roll call (not the store's) was taken for the
    store gone, and that survivor named every other member as silent. Now it passes unchanged."""
    from datetime import timedelta

    import torch.distributed as dist

    from fmesh.context import failures
    from fmesh.context.groups import Target
    from fmesh.context.options import GroupSettings
    from fmesh.context.store.board import Board

    def broken(*args: Any, **kwargs: Any) -> list[int]:
        raise RuntimeError("the roll call itself failed")

    monkeypatch.setattr(failures, "roll_call", broken)
    mesh = fmesh.make_mesh((3,), ("dp",))
    spec = GroupSettings.of(None, 60, backend="gloo").spec(("dp",), (0, 1, 2))
    with pytest.raises(RuntimeError, match="the roll call itself failed"):
        failures.failed("all_reduce", Target(mesh, ("dp",), (0, 1, 2), spec, member=0), (0, 1, 2),
                        timedelta(seconds=60), time.monotonic(), RuntimeError("Connection closed by peer"),
                        Board(dist.HashStore(), "t", 0, timedelta(seconds=5)))


def test_a_connection_that_timed_out_calls_no_living_member_silent() -> None:
    """Campaign seed 407 of the 1,000 (worlds 2-8; drawn with no launcher marks since): a rank killed at an agreement;
    the survivors' recovered world timed out connecting a group under a load average of 15, and a survivor that
    watched its peers' heartbeats 3 s called rank 0, alive but late to beat, gone. The watch after a failed
    connection is a whole silence now (10 s), and only where nobody said why."""
    verdict = faults.run(faults.draw(407))
    assert verdict.ok, str(verdict)


def test_a_survivor_told_every_member_answered_recovers_once_the_launcher_says_one_left() -> None:
    """Campaign seed 352 of the 1,000 (worlds 2-8), in 5 runs of 5: rank 2's collective raised on itself (tp group
    [2, 3]), so rank 3's roll call found every member there ("every member answered, none is lost"); then rank 2 left.
    Ranks 0 and 1 recovered without rank 2 and waited for rank 3, which had ended its program on that error:
    RecoveryError "survivors [3] did not come". A survivor acts on "every member answered" as on a loss once the
    launcher says a member left (the campaign's program asks it, as an operator's does), and recovers with the rest."""
    verdict = faults.run(faults.draw(352))
    assert verdict.ok, str(verdict)


def test_torch_set_up_of_the_first_world_out_of_time_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Campaign seed 734 of the 1,000 (7 ranks, no fault struck, the machine loaded): torch's set-up of the job's
    default group ran past its bound (the creation timeout, 8 s there), and every rank raised torch's bare
    DistStoreError or gloo's "connectFullMesh failed ... Connect timeout". Now GroupTimeoutError, saying what timed
    out. Here rank 1 reaches torch's set-up 6 s late, past rank 0's 3 s."""
    import torch.distributed as dist

    original = dist.init_process_group

    def late(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("RANK") == "1":
            time.sleep(6)
        return original(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", late)  # forked with it: acts in rank 1 only
    results = launch(lambda ctx: ctx.rank, 2, timeout=60, creation_timeout=3)
    assert isinstance(results[0], fmesh.GroupTimeoutError), results
    assert "torch's set-up of the job's default group did not complete within 3s" in str(results[0]), results[0]


@pytest.mark.parametrize("seed", [152, 735, 566, 576, 837])
def test_a_seed_that_ran_out_of_its_creation_timeout_under_load_keeps_every_promise(seed: int) -> None:
    """Campaign seeds of the 1,000 (worlds 2-8) on one verdict per failed group, with a load average of 11 to 80 on 2
    cores (other jobs beside 4 streams): each ran out of the campaign's 8 s creation timeout (the default is 2
    minutes), met by processes held off the CPU. 152: rank 1 raised at its first members' check (tp group [1, 3, 5,
    7]); rank 3, waiting there for it, learnt of it more than 8 s later, so rank 2, waiting for rank 3 at the dp group
    [2, 3], timed out creating it (GroupTimeoutError: not a loss, so it did not recover, and the others' vote named it
    as not come). 735: rank 3 came to the survivors' vote more than 8 s after the others. 566: the world's agreement
    waited 10 s for ranks 3 and 7 (rank 7 stopped 2.4 s). 576 and 837, before their fault: the members of a group
    agreed but did not all connect within 8 s. Each passes alone (152: fault to first error, 1 s); the campaign now
    stretches its contexts' creation timeout by the machine's load, as it does their collective timeout and its
    bounds. 152 and 735 failed on in the suite's runs (CI, 2026-11-28) with any timeout: the member late to come was
    inside gloo's set-up of a group whose victim had closed its connections, and gloo held it five connect timeouts
    (5 x 15 s in 735: ``set_up.set_up_bound``). Every wait for a member now goes on
    past the creation timeout while that member is alive inside torch's set-up (``Board.set_up_seconds``), and the
    member's error says that the set-up told it, the promise it keeps (``faults.set_up_bound``)."""
    verdict = faults.run(faults.draw(seed))
    assert verdict.ok, str(verdict)


def test_a_rank_that_raised_at_its_first_check_is_named_within_the_bound_with_no_launcher_marks() -> None:
    """Campaign seed 647 of the 1,000 (7 ranks, no launcher marks): rank 2 raised at its first members' check of the
    group of all 7. Every survivor recovers into the right world blaming rank 2 alone, but in 2 runs of 5 (one alone on
    a quiet machine: 80 s) rank 6 raised RankLostError ("rank 2 failed ... after agreeing to create the group") 75 s
    after the fault, past the 41 to 62 s bound; 12 to 22 s in the others. It was inside gloo's set-up of that group
    (five connect timeouts, 5 x 15 s): its error now says the set-up told it, and is held to that
    set-up's bound (``faults.set_up_bound``)."""
    verdict = faults.run(faults.draw(647))
    assert verdict.ok, str(verdict)


def test_a_rank_whose_own_set_up_raised_leaves_at_once_in_a_recovery() -> None:
    """Campaign seed 852 of the 1,000 (8 ranks): rank 4 raised inside torch's set-up of the recovered world. It watched
    its peers' heartbeats 10 s before raising (its own error is no timeout: nobody to look for), so the launcher
    marked it late, and the others, whose set-up timed out, named nobody ("torch's set-up of it failed") 28 s after the
    first fault. Now it leaves at once and the others name it."""
    verdict = faults.run(faults.draw(852))
    assert verdict.ok, str(verdict)


# ------------------------------------------------------------------------------------------ one verdict per group


def survivors_conclude(monkeypatch: pytest.MonkeyPatch, started: dict[int, float],
                       between: Any = None) -> dict[int, tuple[str, str]]:
    """Ranks 0 and 1 of the group [0, 1, 2] see their all_reduce fail (a closed connection); rank 2 never answers their
    roll call (it is in another's, status ``failing``; the roll call shortened to 1 s). ``started``: how long ago each
    survivor's collective began; ``between(store)``: done once rank 0 has raised, before rank 1, held until then, reads
    the board. What each raised."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist
    from support import in_threads

    from fmesh.context import failures
    from fmesh.context.groups import Target
    from fmesh.context.options import GroupSettings
    from fmesh.context.store.board import Board
    from fmesh.context.store.records import FAILING

    store, mesh = dist.HashStore(), fmesh.make_mesh((3,), ("dp",))
    spec = GroupSettings.of(None, 60, backend="gloo").spec(("dp",), (0, 1, 2))
    Board(store, "t", 2, timedelta(seconds=30)).post(FAILING, what="all_reduce")
    monkeypatch.setattr(failures, "ROLL_CALL_SECONDS", 1.0)
    first_raised = threading.Event()
    roll_call = failures.roll_call

    def held(board: Board, *args: Any, **kwargs: Any) -> list[int]:
        missing = roll_call(board, *args, **kwargs)
        if board.rank == 1 and between is not None:
            assert first_raised.wait(patience(30))
        return missing

    monkeypatch.setattr(failures, "roll_call", held)
    said: dict[int, tuple[str, str]] = {}

    def fails(rank: int) -> None:
        board = Board(store, "t", rank, timedelta(seconds=30))
        try:
            failures.failed("all_reduce", Target(mesh, ("dp",), (0, 1, 2), spec, member=rank), (0, 1, 2),
                            timedelta(seconds=60), time.monotonic() - started[rank],
                            RuntimeError("Connection closed by peer"), board)
        except Exception as error:
            said[rank] = type(error).__name__, str(error)
        if rank == 0 and between is not None:
            between(store)
            first_raised.set()

    in_threads(fails, [0, 1], timeout=patience(60))
    return said


def same_conclusion(said: dict[int, tuple[str, str]]) -> None:
    """Ranks 0 and 1 raised the same error, blaming the same ranks."""
    (kind0, message0), (kind1, message1) = said[0], said[1]
    assert kind0 == kind1, said
    assert faults.blamed(message0) == faults.blamed(message1), said
    concluded = [re.sub(r" \((the backend said|rank \d+ concluded this first).*$", "", message.split(": ", 1)[1])
                 for message in (message0, message1)]
    assert concluded[0] == concluded[1], said


def test_survivors_of_one_failed_group_raise_one_error_though_one_waited_out_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's all_reduce had waited the group's whole timeout (60 s) when it failed, rank 1's had just begun: both
    found rank 2 silent. Rank 0 raised GroupTimeoutError, rank 1 RankLostError, and a program that recovers on a loss
    recovered on rank 1 alone (the vote then waited for rank 0 until the creation timeout). Now the first to conclude
    writes the group's verdict and the other raises it too."""
    said = survivors_conclude(monkeypatch, {0: 60.0, 1: 0.0})
    same_conclusion(said)
    assert all(set(re.findall(r"ranks \[([\d, ]+)\]", message)) == {"2"} for _, message in said.values()), said


def test_survivors_of_one_failed_group_raise_one_error_though_they_read_the_board_at_different_moments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2, silent in the roll call, came to recover (ctx.recover([3]), a loss elsewhere) after rank 0 had read its
    status and before rank 1 did: rank 0 named rank 2 as not answering, rank 1 said rank 3 is lost and rank 2 recovers
    without it (call ctx.recover([3])): two survivors of one failed collective, told different ranks are gone. Now
    both raise the first conclusion."""
    from datetime import timedelta

    from fmesh.context.store.board import Board
    from fmesh.context.store.records import RECOVERING

    def recovers(store: Any) -> None:
        Board(store, "t", 2, timedelta(seconds=30)).post(RECOVERING, lost=(3,))

    said = survivors_conclude(monkeypatch, {0: 0.0, 1: 0.0}, recovers)
    same_conclusion(said)
    assert said[1][0] == "RankLostError" and "rank 0 concluded this first" in said[1][1], said
