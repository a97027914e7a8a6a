"""Each collective waits for a late peer as long as its group's timeout, not the shorter creation timeout the
group was connected under (#29: gloo's send and receive kept the creation timeout, so ``ppermute`` called a peer
lost that was only late, while ``all_reduce`` waited for it)."""

from __future__ import annotations

import functools
import multiprocessing
import time
from typing import Any

import pytest
import torch
from support import launch, patience, within

import fmesh
from fmesh import Context

CREATION, LATE = 2.0, 6.0  # a peer late by three creation timeouts, well within the group's timeout (60 s)

pytestmark = pytest.mark.usefixtures("nothing_left_behind")  # tests/support.py: nothing left behind


def late_peer(ctx: Context) -> Any:
    mesh = fmesh.make_mesh((2,), ("pp",))
    ctx.all_reduce(torch.ones(1), mesh, "pp")  # the group is connected (under the creation timeout) here
    results = []
    for what in ("ppermute", "all_reduce"):
        if ctx.rank == 1:
            time.sleep(LATE)
        started = time.monotonic()
        if what == "ppermute":
            value = ctx.shift(torch.tensor([ctx.rank + 1.0]), mesh, "pp", wrap=True).item()
        else:
            value = ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), mesh, "pp").item()
        results.append((what, value, time.monotonic() - started))
    return results


@pytest.mark.slow
def test_a_peer_later_than_the_creation_timeout_is_waited_for_by_every_collective() -> None:
    zero, one = launch(late_peer, 2, timeout=90, context_timeout=60, creation_timeout=CREATION)
    for result in (zero, one):
        assert not isinstance(result, BaseException), result
    assert [(what, value) for what, value, _ in zero] == [("ppermute", 2.0), ("all_reduce", 3.0)], zero
    assert [(what, value) for what, value, _ in one] == [("ppermute", 1.0), ("all_reduce", 3.0)], one
    assert all(waited > LATE - 1 for _, _, waited in zero), zero  # rank 0 did wait for its late peer


def permutations_differ(ctx: Context, answered: Any) -> Any:
    """Rank 0 sends to rank 1 and waits for rank 1; rank 1 means the identity and sends nothing: rank 0 waits until
    the group's timeout, then gets fmesh's timeout error, not the backend's raw one (and sets ``answered``)."""
    mesh = fmesh.make_mesh((2,), ("pp",))
    ctx.all_reduce(torch.ones(1), mesh, "pp")
    perm = [(0, 1), (1, 0)] if ctx.rank == 0 else [(0, 0), (1, 1)]
    started = time.monotonic()
    try:
        result = "ok", ctx.ppermute(torch.ones(1), mesh, "pp", perm).item(), time.monotonic() - started
    except Exception as error:
        answered.set()
        return type(error).__name__, str(error), time.monotonic() - started
    if ctx.rank == 1:
        answered.wait(patience(60, 2))  # rank 1 stays (busy elsewhere) until rank 0 has its error
    return result


@pytest.mark.slow
def test_a_ppermute_whose_permutations_differ_ends_in_a_group_timeout() -> None:
    answered = multiprocessing.get_context("fork").Event()  # the ranks are forked: they share it
    zero, one = launch(functools.partial(permutations_differ, answered=answered), 2, timeout=60, context_timeout=4,
                       creation_timeout=2)
    assert one[0] == "ok", one  # the identity: rank 1 keeps its own
    assert zero[0] == "GroupTimeoutError" and 3.5 < zero[2] < within(15), zero
