"""A caller's local error is not a group failure (#29): what torch or the backend refuses on this rank before any
byte is sent is raised unchanged, and the group stays healthy: no connection cut, no abort, no roll call, no
status posted as failed. The rule is one function (``failures.callers_error``), checked here over a table of
errors, then on real gloo processes where every rank refuses the same collective and the next collective on the
same group works; and where one rank alone refuses, it gets its own error and frees its blocked peer, which names it
within seconds (not the collective's timeout)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import launch, succeeded, within

import fmesh
from fmesh import Context
from fmesh.context import _torch, failures

MESH = fmesh.make_mesh((2,), ("dp",))
REVERSED = fmesh.make_mesh((2,), ("dp",), rank_map=[1, 0])  # another group, made only after the refusals

# What torch and its backends say when they refuse a call on this rank, before communicating: each the caller's.
CALLERS = [
    RuntimeError("Tensors must be contiguous"),  # ProcessGroupNCCL, torch before 2.4
    ValueError("Tensors must be contiguous"),  # ProcessGroupNCCL, C10_THROW_ERROR(ValueError, ...)
    RuntimeError("Tensors must be CUDA and dense"),
    RuntimeError("Tensor list must be nonempty"),
    TypeError("Tensors must have identical type"),
    RuntimeError("Tensors must be non-overlapping and dense"),
    RuntimeError("Expected list of tensors on the same device"),
    TypeError("Input tensor data type is not supported for NCCL process group: Short"),
    RuntimeError("Unsupported data type for NCCL process group: Short"),
    ValueError("Cannot use ReduceOp.BAND with NCCL"),
    RuntimeError("Cannot use ReduceOp.PREMUL_SUM with Gloo"),
    RuntimeError("No backend type associated with device type cpu"),
    RuntimeError("ProcessGroupGloo::allreduce: unsupported reduction operation (allreduce of sparse tensors only "
                 "works with ReduceOp.SUM)"),
    RuntimeError("ProcessGroupGloo::allreduce: unsupported layout"),
    RuntimeError("ProcessGroupGloo::broadcast: invalid root rank: 5"),
    RuntimeError("ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (2), got (3))"),
    RuntimeError("ProcessGroupGloo::allgather: invalid tensor type at index 0 (expected TensorOptions(dtype=float))"),
    RuntimeError("ProcessGroupGloo::allreduce: requires non-empty tensor list"),
    RuntimeError("ProcessGroupGloo::broadcast: only supports dense tensors"),
    RuntimeError("ProcessGroupGloo::send takes a single tensor"),
    RuntimeError("Invalid scalar type"),  # gloo's dtype check (int16), made before it sends
    ValueError("all_reduce does not support RedOpType.MAX on complex tensors"),  # distributed_c10d.py
    TypeError("Invalid function argument. Expected parameter `tensor` of type torch.Tensor"),  # distributed_c10d.py
    NotImplementedError("Could not run 'c10d::allreduce_' with arguments from the 'SparseCsrCPU' backend"),
]
# What a group that failed says: each the group's, never the caller's.
GROUPS = [
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv "
                 "operation to complete"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5961"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"),
    dist.DistBackendError("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE)"),
    dist.DistStoreError("Socket Timeout"),
    dist.DistNetworkError("Connection reset by peer"),
    dist.DistBackendError("Tensors must be contiguous"),  # a DistError is the group's, whatever it says
    RuntimeError("NCCL communicator was aborted on rank 1."),
    OSError("Broken pipe"),
]

pytestmark = pytest.mark.usefixtures("nothing_left_behind")  # tests/support.py: nothing left behind


def test_the_rule_over_a_table_of_errors() -> None:
    rule = failures.callers_error
    assert [e for e in CALLERS if not rule(e, group_is_live=True)] == []
    assert [e for e in GROUPS if rule(e, group_is_live=True)] == []
    # every pattern is met by a message of the table: the tuple holds no pattern nothing here checks
    assert [p for p in failures.LOCAL_REFUSALS if not any(re.search(p, str(e)) for e in CALLERS)] == []
    # on a group no longer live (aborted, destroyed, its context aborted) torch's errors say so: the group's;
    # only torch's refusal of the call itself, whatever the group, stays the caller's
    assert [e for e in CALLERS if rule(e, group_is_live=False)] == [CALLERS[-1]]
    assert not rule(ValueError("Invalid process group specified"), group_is_live=False)


Refusal = tuple[str, Any, str, Callable[[Context], object], Exception]


def refusals() -> list[Refusal]:
    """(name, owner, attribute, the Context's call, the error): each collective path fmesh takes to torch, with
    torch's function replaced by one that refuses at once, as the backend does before communicating."""
    return [
        ("all_reduce", dist, "all_reduce", lambda ctx: ctx.all_reduce(torch.ones(2), MESH, "dp"),
         RuntimeError("Tensors must be contiguous")),
        ("all_gather", _torch, "all_gather_single", lambda ctx: ctx.all_gather(torch.ones(2), MESH, "dp"),
         RuntimeError("ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (2), got (3))")),
        ("broadcast", dist, "broadcast", lambda ctx: ctx.broadcast(torch.ones(2), MESH, "dp", src=1),
         ValueError("Tensors must be CUDA and dense")),
        ("barrier", dist, "barrier", lambda ctx: ctx.barrier(MESH, "dp"),
         RuntimeError("No backend type associated with device type cpu")),
        ("world barrier", dist, "barrier", lambda ctx: ctx.barrier(),
         RuntimeError("No backend type associated with device type cpu")),
    ]


def every_rank_refuses(ctx: Context) -> Any:
    assert ctx.all_reduce(torch.ones(1), MESH, "dp").item() == 2.0  # the group exists and works
    # complex tensors travel as real pairs in all_reduce (SUM) and broadcast: NCCL takes them (torch's view_as_real)
    summed = ctx.all_reduce(torch.full((2,), 1 + 2j, dtype=torch.complex64) * (ctx.rank + 1), MESH, "dp").tolist()
    sent = ctx.broadcast(torch.full((2,), complex(ctx.rank, 1), dtype=torch.complex64), MESH, "dp", src=1).tolist()
    seen = []
    # torch's own refusal, unpatched: all_reduce op=max of a complex tensor (a ValueError of distributed_c10d)
    try:
        ctx.all_reduce(torch.ones(2, dtype=torch.complex64), MESH, "dp", op="max")
    except Exception as caught:
        seen.append(("complex max", type(caught).__name__, str(caught), True))
    seen.append(("after complex max", "sum", str(ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), MESH, "dp").item()),
                 True))
    took = []
    for name, owner, attribute, call, error in refusals():
        original = getattr(owner, attribute)

        def refuse(*args: Any, error: Exception = error, **kwargs: Any) -> None:
            raise error

        setattr(owner, attribute, refuse)
        started = time.monotonic()
        try:
            call(ctx)
        except Exception as caught:
            seen.append((name, type(caught).__name__, str(caught), caught is error))
        finally:
            took.append(time.monotonic() - started)
            setattr(owner, attribute, original)
        # the next collective on the same group, on every rank
        seen.append((f"after {name}", "sum", str(ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), MESH, "dp").item()),
                     True))
    assert ctx._board is not None
    # as a watcher reads them (an agreement leaves a status at "waiting" on a group since made: running, after it)
    statuses = ctx._board.current(ctx._board.statuses([0, 1]))
    states = {rank: status.state for rank, status in statuses.items()}
    gathered = ctx.all_gather(torch.tensor([ctx.rank]), MESH, "dp").tolist()
    other = ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), REVERSED, "dp").item()  # a new group: nobody failed
    return seen, states, gathered, other, ctx.stats()["groups_created"], summed + sent, max(took)


@pytest.mark.slow
def test_a_refusal_on_every_rank_is_each_callers_error_and_the_group_stays_healthy() -> None:
    results = succeeded(launch(every_rank_refuses, 2, timeout=60, context_timeout=20, creation_timeout=10))
    # torch refuses MAX of a complex tensor itself (distributed_c10d.supports_complex), under NCCL's rules on CPU
    # (tests/strict_nccl.py) too: a complex tensor reaches NCCL as real pairs, which NCCL takes
    complex_kind, complex_says = "ValueError", "complex tensors"
    expected = [("complex max", complex_kind)] + [(n, type(e).__name__) for n, _, _, _, e in refusals()]
    for rank, (seen, states, gathered, other, created, complexes, longest) in enumerate(results):
        # each refusal's roll call ends once every member answered, within its 2 s (REFUSAL_GRACE_SECONDS)
        assert longest < failures.REFUSAL_GRACE_SECONDS + within(0.5), (rank, longest)
        assert complexes == [3 + 6j, 3 + 6j, 1 + 1j, 1 + 1j], (rank, complexes)
        refused = seen[0::2]
        assert [(name, kind) for name, kind, _, _ in refused] == expected, (rank, seen)
        assert all(same for _, _, _, same in refused), (rank, seen)  # the very error torch raised, unchanged
        assert complex_says in refused[0][2], (rank, refused[0])
        assert [message for _, _, message, _ in seen[1::2]] == ["3.0"] * len(expected), (rank, seen)
        assert states == {0: "running", 1: "running"}, (rank, states)  # no rank posted a failure
        assert (gathered, other, created) == ([0, 1], 3.0, 2), rank


def one_rank_refuses(ctx: Context) -> Any:
    """Rank 0's all_reduce is refused on rank 0 alone (torch's function replaced there); rank 1 runs the real one
    and is blocked in it, waiting for rank 0."""
    assert ctx.all_reduce(torch.ones(1), MESH, "dp").item() == 2.0
    error = RuntimeError("Tensors must be contiguous")
    original = dist.all_reduce
    if ctx.rank == 0:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise error

        dist.all_reduce = refuse  # type: ignore[assignment]
    started = time.monotonic()
    try:
        ctx.all_reduce(torch.ones(2), MESH, "dp")
    except Exception as caught:
        return type(caught).__name__, str(caught), caught is error, time.monotonic() - started
    finally:
        dist.all_reduce = original  # type: ignore[assignment]
    return "no error", "", False, time.monotonic() - started


@pytest.mark.slow
def test_a_refusal_on_one_rank_is_its_error_and_the_blocked_peer_is_told_within_seconds() -> None:
    zero, one = succeeded(launch(one_rank_refuses, 2, timeout=90, context_timeout=60, creation_timeout=10))
    assert zero[:3] == ("RuntimeError", "Tensors must be contiguous", True), zero  # its own error, unchanged
    assert one[0] == "TensorMismatchError" and "rank 0 refused it on itself" in one[1], one  # the peer names it
    assert "(RuntimeError: Tensors must be contiguous)" in one[1], one
    assert one[3] < within(15), one  # not the collective's 60 s timeout
