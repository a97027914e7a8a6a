"""Threads of one rank on distinct groups run side by side (#29: a pipeline schedule's thread, an asynchronous
checkpoint on a group of its own), as torch allows; two threads on one group get one clear error."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest
import torch
from support import launch, within

import fmesh
from fmesh import Context
from fmesh.context import AxisOptions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nothing_left_behind")]  # multi-process; nothing left

ROUNDS = 1000


def two_threads_two_groups(ctx: Context) -> Any:
    """On a (dp=2, tp=2) mesh one thread sums along dp and another along tp, ROUNDS times each, at once, once the
    groups exist (made by one thread: ``materialize``)."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    ctx.materialize(mesh)
    start = threading.Barrier(2)
    sums: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def drive(axis: str) -> None:
        try:
            start.wait()
            sums[axis] = [ctx.all_reduce(torch.tensor([ctx.rank + step + 1.0]), mesh, axis).item()
                          for step in range(ROUNDS)]
        except BaseException as error:  # reported, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=drive, args=(axis,), name=axis) for axis in ("dp", "tp")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # the launch's timeout bounds a hang
    if errors:
        raise errors[0]
    expected = {axis: [sum(r + step + 1.0 for r in mesh.group(ctx.rank, axis)) for step in range(ROUNDS)]
                for axis in ("dp", "tp")}
    return sums == expected, ctx.stats()["groups_created"]


def test_two_threads_on_two_groups_sum_correctly_1000_times() -> None:
    for rank, result in enumerate(launch(two_threads_two_groups, 4, timeout=120)):
        assert result == (True, 2), (rank, result)


def one_group_two_threads(ctx: Context) -> Any:
    """The main thread uses the dp group; a second thread's collective on it is refused, naming both threads."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    ctx.all_reduce(torch.ones(1), mesh, "dp")
    refused: list[str] = []
    took: list[float] = []

    def other() -> None:
        started = time.monotonic()
        try:
            ctx.all_reduce(torch.ones(1), mesh, "dp")
        except RuntimeError as error:
            refused.append(str(error))
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=other, name="checkpointer")
    thread.start()
    thread.join()
    return refused, took, ctx.all_reduce(torch.ones(1), mesh, "dp").item()


def test_a_second_thread_on_a_group_in_use_is_refused_and_the_group_stays_healthy() -> None:
    for result in launch(one_group_two_threads, 2, timeout=60):
        refused, took, total = result
        assert len(refused) == 1 and "is used by thread 'MainThread'" in refused[0], refused
        assert "thread 'checkpointer' asked for a collective on it" in refused[0], refused
        assert "belong to one thread" in refused[0] and took[0] < within(0.5), (refused, took)  # at once, nothing sent
        assert total == 2.0


def a_new_group_while_another_is_created(ctx: Context, slowdown: float = 1.0) -> Any:
    """Rank 0's main thread creates the group along "a", waiting for rank 1 (2 s late); meanwhile a second thread
    of rank 0 asks for the group along "b" (another group: another timeout), which does not exist yet. The two
    delays that order this are scaled by the machine's ``slowdown`` (tests/support.py)."""
    if ctx.rank == 1:
        time.sleep(2 * slowdown)
        return ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("a",)), "a").item()
    asked: list[tuple[str, float]] = []

    def other() -> None:
        time.sleep(0.5 * slowdown)  # the main thread is creating "a" by now
        started = time.monotonic()
        try:
            ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("b",)), "b")
            asked.append(("no error", time.monotonic() - started))
        except RuntimeError as error:
            asked.append((str(error), time.monotonic() - started))

    thread = threading.Thread(target=other, name="loader")
    thread.start()
    total = ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("a",)), "a").item()
    thread.join()
    return total, asked, ctx.stats()["groups_created"]


def test_a_thread_asking_for_a_new_group_while_another_creates_one_is_refused_at_once() -> None:
    ordered = functools.partial(a_new_group_while_another_is_created, slowdown=within(1))
    zero, one = launch(ordered, 2, timeout=60, axis_options={"b": AxisOptions(timeout=21)})
    assert one == 2.0, one
    total, asked, created = zero
    assert total == 2.0 and created == 1, zero  # "a" made; "b" never started
    (message, took), = asked
    assert "thread 'loader' asked for" in message and "while thread 'MainThread' creates another group" in message, (
        message)
    assert "ctx.materialize(mesh)" in message and took < within(0.5), (message, took)
