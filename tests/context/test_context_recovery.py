"""Losing ranks and going on (``fmesh.launch(on_rank_loss="continue")``, ``Context.recover``): the choice of what
becomes of each group, the survivors' agreement on the ranks lost, and real gloo jobs that lose a rank and finish.

Every multi-process run is bounded by its launch timeout: a hang fails the test with ``TimeoutError``.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import re
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import in_threads, launch, patience, within

import fmesh
from fmesh import Context
from fmesh.context.recovery import check_lost, new_world
from fmesh.context.store.agreement import agree
from fmesh.context.store.board import Board
from fmesh.context.store.records import RECOVERING, Status
from fmesh.context.store.recovery_vote import HeldGroup, agree_on_loss, post_loss
from fmesh.plan.jobs import job_requests
from fmesh.plan.recovery import recover_job

pytestmark = pytest.mark.usefixtures("nothing_left_behind")  # tests/support.py: nothing left behind

# ------------------------------------------------------------------------------------- pure choices


def test_the_lost_ranks_and_the_new_world_are_checked_before_anything() -> None:
    assert check_lost([3, 1, 3], 4, 0) == (1, 3)
    with pytest.raises(TypeError, match="iterable of lost ranks such as \\[3\\], but got 3"):
        check_lost(3, 4, 0)
    with pytest.raises(ValueError, match=r"lost ranks in 0\.\.3, but got \[4\]"):
        check_lost([4], 4, 0)
    with pytest.raises(ValueError, match="at least one lost rank"):
        check_lost([], 4, 0)
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    assert new_world(4, (3,)) == (0, 1, 2)
    assert new_world(4, (3,), fmesh.without(mesh, [3], "dp")) == (0, 1)
    assert new_world(4, (3,), fmesh.without(mesh, [3], "tp")) == (0, 2)
    with pytest.raises(ValueError, match="still holds lost ranks \\[1\\]"):
        new_world(4, (1, 3), fmesh.without(mesh, [3], "dp"))
    with pytest.raises(ValueError, match="has no lineage"):
        new_world(4, (3,), mesh)
    with pytest.raises(ValueError, match="adds ranks"):
        new_world(4, (3,), fmesh.resize(mesh, "dp", 3))


def test_survivors_that_disagree_about_the_lost_ranks_are_told_both_sets() -> None:
    store = dist.HashStore()
    post_loss(Board(store, "t", 1, timedelta(seconds=5)), [2, 3], ["g"])
    with pytest.raises(fmesh.RecoveryError, match=r"rank 0 says \[3\], rank 1 says \[2, 3\]"):
        agree_on_loss(Board(store, "t", 0, timedelta(seconds=5)), [0, 1, 2], [3], ["g"])


def test_a_survivor_that_never_comes_to_recover_ends_the_wait_with_its_name() -> None:
    store = dist.HashStore()
    post_loss(Board(store, "t", 1, timedelta(seconds=5)), [3], ["g"])
    started = time.monotonic()
    with pytest.raises(fmesh.RecoveryError, match=r"survivors \[2\] did not come to recover without \[3\]"):
        agree_on_loss(Board(store, "t", 0, timedelta(seconds=0.3)), [0, 1, 2], [3], ["h"])
    assert time.monotonic() - started < within(3)
    # The verdict stays: a survivor that comes after the others gave up cannot recover alone with them.
    with pytest.raises(fmesh.RecoveryError, match=r"survivors \[2\] did not come"):
        agree_on_loss(Board(store, "t", 2, timedelta(seconds=5)), [0, 1, 2], [3], ["g", "h"])
    assert time.monotonic() - started < within(3)


def test_the_survivors_count_who_holds_each_of_their_groups() -> None:
    store = dist.HashStore()
    post_loss(Board(store, "t", 1, timedelta(seconds=5)), [3], ["g"])
    held: dict[int, dict[str, int]] = {}
    in_threads(lambda rank: held.update({rank: agree_on_loss(Board(store, "t", rank, timedelta(seconds=5)),
        [0, 1, 2], [3], ["h"] if rank == 0 else ["g", "h"])}), [0, 2], timeout=30)
    assert held == {0: {"h": 2}, 2: {"g": 2, "h": 2}}  # g: ranks 1 and 2; h: ranks 0 and 2


def test_a_survivor_cuts_the_groups_it_shares_with_one_kept_away_and_all_make_them_anew() -> None:
    """Rank 1 comes to recover; rank 0, running (blocked in a collective with rank 1, say), has not come: rank 1 cuts
    the group they share past the grace period (rank 0's collective fails at once), and once rank 0 comes both count
    that group as held by none, so both make it anew. The group shared with rank 2, which failed (on its way to
    recover: nothing blocks it), is not cut, and is kept."""
    store = dist.HashStore()
    Board(store, "t", 0, timedelta(seconds=30)).post("running")
    Board(store, "t", 2, timedelta(seconds=30)).failed(fmesh.RankLostError("rank 3 is gone"))
    one = Board(store, "t", 1, timedelta(seconds=30))
    held = [HeldGroup("g01", (0, 1), "pg01"), HeldGroup("g12", (1, 2), "pg12")]
    results: dict[int, dict[str, int]] = {}
    waiting = threading.Thread(target=lambda: results.update({1: agree_on_loss(one, [0, 1, 2], [3], held)}))
    waiting.start()
    deadline = time.monotonic() + patience(10)
    while not one.connections.was_cut("pg01") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert one.connections.was_cut("pg01") and not one.connections.was_cut("pg12")
    assert Board(store, "t", 1, timedelta(seconds=1)).statuses([1])[1] == Status(RECOVERING, lost=(3,))
    in_threads(lambda rank: results.update({rank: agree_on_loss(Board(store, "t", rank, timedelta(seconds=30)),
        [0, 1, 2], [3], {0: ["g01"], 2: ["g12"]}[rank])}), [0, 2], timeout=patience(30))
    waiting.join(patience(30))
    assert results == {0: {"g01": 0}, 1: {"g01": 0, "g12": 2}, 2: {"g12": 2}}
    assert not one.connections.was_cut("pg12")


def test_a_survivor_that_failed_is_waited_for_not_called_gone() -> None:
    """A survivor whose collective failed (its status says so) is on its way to recover: the watchers wait for it
    instead of calling it gone (every survivor of a failed collective posts that it failed before it recovers)."""
    store = dist.HashStore()
    Board(store, "t", 2, timedelta(seconds=30)).failed(fmesh.RankLostError("rank 3 is gone"))
    results: dict[int, dict[str, int]] = {}

    def late(rank: int) -> None:
        if rank == 2:
            time.sleep(2.5)  # past the watchers' first two looks
        results[rank] = agree_on_loss(Board(store, "t", rank, timedelta(seconds=30)), [0, 1, 2], [3], ["g"])

    in_threads(late, [0, 1, 2], timeout=patience(30))
    assert results == {0: {"g": 3}, 1: {"g": 3}, 2: {"g": 3}}


def test_a_group_creation_waiting_for_a_rank_that_recovers_ends_telling_to_recover_too() -> None:
    """Rank 1 recovers without rank 3; rank 0 waits for it to create a group they share: it is told at the first look
    (not at the creation timeout) that rank 3 is lost and to recover too, never that rank 1 is gone."""
    store = dist.HashStore()
    Board(store, "t", 1, timedelta(seconds=30)).post("recovering", lost=(3,))
    started = time.monotonic()
    with pytest.raises(fmesh.RankLostError, match=r"rank 1 is recovering without the lost ranks \[3\].*ranks \[3\] are "
                       r"lost; call ctx.recover\(\[3\]\) on this rank too"):
        agree(Board(store, "t", 0, timedelta(seconds=20)), "k", [0, 1], "Mesh(dp=2)", "the dp group")
    assert time.monotonic() - started < patience(10)


# ---------------------------------------------------------------------------------- real processes


class ExitHooks:
    """Records, while entered, the exit hooks registered (``+``) and withdrawn (``-``), by qualified name."""

    def __init__(self) -> None:
        self.changes: list[str] = []
        self._saved = (atexit.register, atexit.unregister)

    def __enter__(self) -> None:
        register, unregister = self._saved

        def recording_register(fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.changes.append(f"+{fn.__qualname__}")
            return register(fn, *args, **kwargs)

        def recording_unregister(fn: Any) -> None:
            self.changes.append(f"-{fn.__qualname__}")
            unregister(fn)

        atexit.register, atexit.unregister = recording_register, recording_unregister  # type: ignore[assignment]

    def __exit__(self, *error: object) -> None:
        atexit.register, atexit.unregister = self._saved  # type: ignore[assignment]


def keeps_the_group_that_lost_nobody(ctx: Context) -> Any:
    """Rank 3 dies; the survivors recover onto the mesh without the dp slice holding it (ranks 0 and 1: rank 2
    leaves). The tp group (0, 1) lost nobody: the recovered context runs a collective on that very communicator."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    pair = ctx.group(mesh, "tp")
    ctx.all_reduce(torch.ones(1), mesh, ("dp", "tp"))
    if ctx.rank == 3:
        os._exit(3)
    started = time.monotonic()
    with pytest.raises(fmesh.RankLostError, match=r"the launcher saw the processes of ranks \[3\] end"):
        ctx.all_reduce(torch.ones(1), mesh, ("dp", "tp"))
    # the launcher looks every second; the roll call ends when it has (docs/guides/failures.md: about 1 s)
    assert time.monotonic() - started < within(3), time.monotonic() - started
    smaller = fmesh.without(mesh, [3], "dp")
    hooks = ExitHooks()
    with hooks:
        renewed = ctx.recover([3], smaller)
    if renewed is None:  # the old context's exit hook goes with it
        return "left", repr(ctx), hooks.changes
    with renewed:
        total = renewed.all_reduce(torch.tensor([renewed.rank + 1.0]), smaller, "tp").item()
        same = renewed.group(smaller, "tp") is pair
        stats = renewed.stats()
        created = stats["creation_seconds"], stats["groups_kept"], stats["groups_created"]
        world = renewed.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("all",)), "all").item()
        # The old context's exit hook is withdrawn and the renewed one's added (the old one leaked, once per
        # recovery, and posted "exited" into the old world at interpreter exit).
        return total, same, created, world, dist.get_world_size(), repr(ctx), hooks.changes


@pytest.mark.slow
def test_recover_keeps_an_intact_group_and_renumbers_the_survivors() -> None:
    results = launch(keeps_the_group_that_lost_nobody, 4, timeout=60, on_rank_loss="continue")
    assert isinstance(results[3], fmesh.LaunchError) and results[3].exitcode == 3
    assert results[2] == ("left", "Context(rank=2, world=4, gloo, closed)", ["-Board.post_exit"])
    for rank in (0, 1):
        total, same, created, world, size, old, hooks = results[rank]
        assert (total, same, created, world, size) == (3.0, True, (0.0, 1, 0), 2.0, 2), results[rank]
        assert hooks == ["-Board.post_exit", "+Board.post_exit"], results[rank]
        assert old == f"Context(rank={rank}, world=4, gloo, closed)"


# A tiny model trained data-parallel: every rank holds the whole model, takes its slice of one global batch per
# step and averages the gradients over dp. The global batch divides by 4 and by 3 ranks.
BATCH, FEATURES, STEP_LOST, STEPS = 12, 8, 3, 8


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def train_step(ctx: Context, mesh: fmesh.Mesh, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               step: int) -> float:
    (index,) = mesh.coordinate(ctx.rank) or (0,)
    inputs, targets = (part.chunk(mesh.size)[index] for part in global_batch(step))
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    for parameter in model.parameters():
        assert parameter.grad is not None
        parameter.grad = ctx.all_reduce(parameter.grad, mesh, "dp", op="avg")
    optimizer.step()
    optimizer.zero_grad()
    return float(ctx.all_reduce(loss.detach(), mesh, "dp", op="avg").item())


def resume(directory: pathlib.Path) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved = torch.load(directory / "checkpoint.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return model, optimizer, int(saved["step"])


def loses_a_rank_and_finishes(ctx: Context, directory: pathlib.Path) -> Any:
    """4 ranks train; rank 0 checkpoints after step STEP_LOST - 1; rank 3 dies at step STEP_LOST; the survivors
    recover onto dp=3, reload the checkpoint and finish."""
    mesh = fmesh.make_mesh((4,), ("dp",))
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEP_LOST + 1):
        if step == STEP_LOST and ctx.rank == 3:
            (directory / "death").write_text(repr(time.time()))
            os._exit(9)
        try:
            train_step(ctx, mesh, model, optimizer, step)
        except fmesh.RankLostError:
            break
        if step == STEP_LOST - 1 and ctx.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       directory / "checkpoint.pt")
    else:
        return "no rank was lost"
    with ctx.recover([3]) as renewed:
        mesh = fmesh.without(mesh, [3], "dp")
        model, optimizer, start = resume(directory)
        losses = [train_step(renewed, mesh, model, optimizer, start)]
        finished = time.time()
        losses += [train_step(renewed, mesh, model, optimizer, step) for step in range(start + 1, STEPS)]
        return start, losses, finished, [fmesh.old_rank(mesh, r) for r in range(mesh.world_size)]


def three_ranks_from_the_checkpoint(ctx: Context, directory: pathlib.Path) -> Any:
    mesh = fmesh.make_mesh((3,), ("dp",))
    model, optimizer, start = resume(directory)
    return start, [train_step(ctx, mesh, model, optimizer, step) for step in range(start, STEPS)]


@pytest.mark.slow
def test_a_job_that_loses_one_of_4_ranks_finishes_like_a_3_rank_job(tmp_path: pathlib.Path) -> None:
    results = launch(lambda ctx: loses_a_rank_and_finishes(ctx, tmp_path), 4, timeout=90, on_rank_loss="continue")
    assert isinstance(results[3], fmesh.LaunchError) and results[3].exitcode == 9, results[3]
    for result in results[:3]:
        assert not isinstance(result, BaseException) and result != "no rank was lost", result
    reference = launch(lambda ctx: three_ranks_from_the_checkpoint(ctx, tmp_path), 3, timeout=60)
    start, expected = reference[0]
    assert start == STEP_LOST and len(expected) == STEPS - STEP_LOST
    for rank, (resumed, losses, _, old_ranks) in enumerate(results[:3]):
        assert resumed == start and old_ranks == [0, 1, 2], results[rank]
        assert losses == pytest.approx(expected, abs=1e-5), (rank, losses, expected)
    died = float((tmp_path / "death").read_text())
    recovered = max(result[2] for result in results[:3]) - died
    print(f"\nfrom the death of rank 3 to the next finished step on every survivor: {recovered:.2f} s")
    assert recovered > 0


def renews_as_the_plan_says(ctx: Context) -> Any:
    """A 6-rank job (dp_shard 3 x tp 2) holds every group of its meshes; rank 5 dies; the survivors recover onto the
    job that ``plan --lose 5`` plans, and create every group of its meshes. What the Context kept and created is
    what the printed plan counts (gloo: no shrink)."""
    dims = fmesh.ParallelDims(6, dp_shard=3, tp=2)
    ctx.materialize(*[(request.mesh, request.axes) for request in job_requests(dims)])
    everyone = (dims.world_mesh, dims.world_mesh.axis_names)
    ctx.all_reduce(torch.ones(1), *everyone)
    if ctx.rank == 5:
        os._exit(5)
    with pytest.raises(fmesh.RankLostError):
        ctx.all_reduce(torch.ones(1), *everyone)
    return recovered_as_planned(ctx, dims, shrink_groups=False, axes=dims.world_mesh.axis_names)


def recovered_as_planned(ctx: Context, dims: fmesh.ParallelDims, shrink_groups: bool,
                         axes: tuple[str, ...]) -> Any:
    """Recover without rank 5 onto the job ``plan --lose 5`` plans, create every group of its meshes: what the
    Context kept, shrunk and created, what the plan counts, and a sum over ``axes`` of the new world mesh (the
    ranks' count along them); ``None`` on a rank the smaller job drops."""
    job = recover_job(dims, [5], shrink_groups=shrink_groups)
    renewed = ctx.recover([5], job.after.world_mesh)
    if renewed is None:
        return None
    with renewed:
        renewed.materialize(*[(request.mesh, request.axes) for request in job_requests(job.after)])
        stats = renewed.stats()
        total = renewed.all_reduce(torch.ones(1), job.after.world_mesh, axes).item()
    return (stats["groups_kept"], stats["groups_shrunk"], stats["groups_created"]), job.plan.counts, total


@pytest.mark.slow
def test_what_recover_keeps_and_creates_is_what_plan_lose_prints() -> None:
    results = launch(renews_as_the_plan_says, 6, timeout=90, on_rank_loss="continue")
    assert isinstance(results[5], fmesh.LaunchError)
    assert results[4] is None  # rank 5's tp partner leaves with its slice of dp_shard
    for rank in range(4):
        (kept, shrunk, created), counts, total = results[rank]
        assert (kept, shrunk, created) == (counts["keep"], counts["shrink"], counts["create"]) == (1, 0, 1), results
        assert total == 4.0


def shrinks_as_nccl_must(ctx: Context) -> Any:
    """The same job on NCCL's rule (``can_shrink`` made true), with a recording fake of NCCL's calls: torch's
    ``shrink_group`` (a group of the survivors, made on gloo), the abort and the destroy of groups. What recover
    kept, shrunk and created is what ``plan --lose`` prints for a backend that shrinks; each parent of a shrink is
    shrunk with ``SHRINK_ABORT`` and then aborted, never destroyed (pytorch #194775: destroying the parent after a
    shrink hangs)."""
    import torch.distributed.distributed_c10d as c10d

    from fmesh.context import _torch

    calls: list[tuple[Any, ...]] = []
    abort, destroy = c10d._abort_process_group, dist.destroy_process_group

    def shrink_group(exclude: list[int], group: Any, shrink_flags: int = 0, pg_options: Any = None) -> Any:
        calls.append(("shrink", group.group_name, tuple(exclude), shrink_flags))
        members = dist.get_process_group_ranks(group)
        if members.index(dist.get_rank()) in exclude:  # torch's rule: "if an excluded rank calls this function"
            raise RuntimeError(f"rank {dist.get_rank()} is excluded from the shrink of {members}: it must not call it")
        return dist.new_group([r for i, r in enumerate(members) if i not in exclude], backend="gloo",
                              use_local_synchronization=True)

    def recording_abort(group: Any = None) -> None:
        ended = list(c10d._world.pg_map) if group is None else [group]
        calls.append(("abort", {g.group_name for g in ended}))
        abort(group)

    def recording_destroy(group: Any = None) -> None:
        ended = list(c10d._world.pg_map) if group is None else [group]
        calls.append(("destroy", {g.group_name for g in ended}))
        destroy(group)

    _torch.can_shrink = lambda backend: True  # type: ignore[assignment]
    dist.shrink_group = shrink_group  # type: ignore[assignment]
    c10d._abort_process_group, dist.destroy_process_group = recording_abort, recording_destroy  # type: ignore
    dims = fmesh.ParallelDims(6, dp_shard=3, tp=2)
    ctx.materialize(*[(request.mesh, request.axes) for request in job_requests(dims)])
    if ctx.rank == 5:
        os._exit(5)
    for axis in ("dp_shard", "tp"):  # the members of rank 5's groups learn of its loss there
        if 5 in dims.mesh(axis).group(ctx.rank):
            with pytest.raises(fmesh.RankLostError):
                ctx.all_reduce(torch.ones(1), dims.mesh(axis), axis)
    outcome = recovered_as_planned(ctx, dims, shrink_groups=True, axes=("dp_shard",))
    return None if outcome is None else (*outcome, calls, c10d.SHRINK_ABORT)


@pytest.mark.slow
def test_an_nccl_recovery_shrinks_what_plan_lose_prints_and_aborts_each_parent() -> None:
    results = launch(shrinks_as_nccl_must, 6, timeout=90, on_rank_loss="continue")
    assert isinstance(results[5], fmesh.LaunchError)
    assert results[4] is None
    for rank in range(4):
        counts, planned, total, calls, abort_flag = results[rank]
        assert counts == (planned["keep"], planned["shrink"], planned["create"]) == (1, 1, 0), results[rank]
        assert total == 2.0
        shrinks = [call for call in calls if call[0] == "shrink"]
        assert len(shrinks) == 1 and shrinks[0][2] == (2,) and shrinks[0][3] == abort_flag, calls
        parent = shrinks[0][1]
        after = calls[calls.index(shrinks[0]) + 1:]
        assert any(call[0] == "abort" and parent in call[1] for call in after), calls
        assert not any(call[0] == "destroy" and parent in call[1] for call in calls), calls


def a_survivor_dies_after_agreeing(ctx: Context) -> Any:
    """Rank 3 dies; the survivors agree to recover without it; then rank 2 dies too, before the new world starts
    (its process ends where it would meet the others). Ranks 0 and 1: a RecoveryError naming rank 2, in seconds."""
    from fmesh.context.world import World

    mesh = fmesh.make_mesh((4,), ("all",))
    ctx.all_reduce(torch.ones(1), mesh, "all")
    if ctx.rank == 3:
        os._exit(3)
    with pytest.raises(fmesh.RankLostError):
        ctx.all_reduce(torch.ones(1), mesh, "all")
    if ctx.rank == 2:
        World.renewed = lambda *args, **kwargs: os._exit(7)  # type: ignore[assignment,method-assign]
    started = time.monotonic()
    try:
        ctx.recover([3])
    except fmesh.RecoveryError as error:
        return str(error), time.monotonic() - started
    return "recovered", time.monotonic() - started


@pytest.mark.slow
def test_a_survivor_that_dies_after_agreeing_ends_the_recovery_on_the_others_in_seconds() -> None:
    results = launch(a_survivor_dies_after_agreeing, 4, timeout=120, context_timeout=60, creation_timeout=30,
                     on_rank_loss="continue")
    assert [getattr(result, "exitcode", None) for result in results[2:]] == [7, 3], results
    for rank in (0, 1):
        message, took = results[rank]
        assert "their new world could not start" in message and "ranks [2] ended" in message, (rank, message)
        assert took < within(15), (rank, took, message)  # not the 30 s creation timeout, nor torch's 60 s


def blocked_with_a_survivor_that_recovers(ctx: Context) -> Any:
    """(dp=2, tp=2): rank 3 dies; rank 2 (tp with rank 3) and rank 1 (dp with rank 3) lose it and recover; rank 0 is
    blocked in a dp all_reduce with rank 2, which recovers instead of coming. Rank 0 is freed, told that rank 3 is
    lost and to recover too, and all three recover together."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    ctx.all_reduce(torch.ones(1), mesh, "dp")
    ctx.all_reduce(torch.ones(1), mesh, "tp")
    if ctx.rank == 3:
        os._exit(3)
    started = time.monotonic()
    try:
        ctx.all_reduce(torch.ones(1), mesh, "tp" if ctx.rank == 2 else "dp")
    except fmesh.RankLostError as error:
        freed, message = time.monotonic() - started, str(error)
    else:
        return "no rank was lost"
    with ctx.recover([3]) as renewed:
        assert renewed is not None
        total = renewed.all_reduce(torch.ones(1), fmesh.make_mesh((3,), ("all",)), "all").item()
        return freed, message, total, renewed.stats()["groups_kept"], time.monotonic() - started


@pytest.mark.slow
def test_a_survivor_blocked_with_one_that_recovers_is_freed_and_recovers_with_them() -> None:
    results = launch(blocked_with_a_survivor_that_recovers, 4, timeout=120, context_timeout=60, creation_timeout=30,
                     on_rank_loss="continue")
    assert isinstance(results[3], fmesh.LaunchError) and results[3].exitcode == 3
    freed, message, _, _, took = results[0]
    # Rank 2 came to recover; rank 1 too, unless rank 0 was told before it came (it is told at its first look, whether
    # it waits in the members' check of its calls or in the collective, freed by the recovery's cut).
    assert re.search(r"ranks \[3\] are lost, and ranks \[(1, )?2\] are recovering without them", message), message
    assert "call ctx.recover([3])" in message and "gone" not in message, message  # rank 2 is alive: never "gone"
    assert freed < patience(10, 4), (freed, message)  # seconds, not the 60 s timeout nor the 30 s creation timeout
    assert took < patience(15, 4), (took, message)
    for rank in (1, 2):
        assert "ranks [3] of the group are gone" in results[rank][1], results[rank]
    # Every survivor is in the new world. The dp group (0, 2) was cut to free rank 0 and is made anew (rank 2 keeps
    # nothing). The tp group (0, 1) is cut too when rank 1 came to recover more than SEVER_GRACE_SECONDS before rank 0
    # (quiet machine), and kept when rank 0 came first (a loaded one): either way ranks 0 and 1 keep the same groups.
    assert [result[2] for result in results[:3]] == [3.0] * 3, results
    assert results[2][3] == 0 and results[0][3] == results[1][3] in (0, 1), results
