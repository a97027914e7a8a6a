"""Tensors checked at the door of every tensor collective, before any group is touched; and the members' check of
their tensors (``Context(check_tensors=True)``, the default) that names the rank whose tensor differs before any of
it is sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support import launch, patience, succeeded

import fmesh
from fmesh import Context
from fmesh.context.call_checks import CHECKPOINT, check_mode

MESH = fmesh.make_mesh((2, 2), ("dp", "tp"))


def calls(tensor: Any) -> dict[str, Callable[[Context], Any]]:
    """Every tensor collective of the Context on ``tensor``."""
    return {
        "all_reduce": lambda ctx: ctx.all_reduce(tensor, MESH, "tp"),
        "all_gather": lambda ctx: ctx.all_gather(tensor, MESH, "tp"),
        "reduce_scatter": lambda ctx: ctx.reduce_scatter(tensor, MESH, "tp"),
        "broadcast": lambda ctx: ctx.broadcast(tensor, MESH, "tp"),
        "all_to_all": lambda ctx: ctx.all_to_all(tensor, MESH, "tp"),
        "ppermute": lambda ctx: ctx.ppermute(tensor, MESH, "tp", [(0, 1)]),
        "shift": lambda ctx: ctx.shift(tensor, MESH, "tp"),
        "sum_gradients": lambda ctx: ctx.sum_gradients(tensor, MESH, "tp"),
        "sum_partials": lambda ctx: ctx.sum_partials(tensor, MESH, "tp"),
    }


@pytest.mark.parametrize("what", sorted(calls(None)))
@pytest.mark.parametrize("sparse", [torch.ones(2, 2).to_sparse(), torch.eye(2).to_sparse_csr()], ids=["coo", "csr"])
def test_a_sparse_tensor_is_refused_at_the_door_naming_it_and_what_to_do(what: str, sparse: torch.Tensor) -> None:
    # Before: it went on to the collective, which raised "unsupported memory format option Contiguous" (or NCCL's
    # "Tensors must be CUDA and dense") from deep inside.
    with Context.fake(4) as ctx:
        with pytest.raises(TypeError, match=rf"^{what}: expected a dense tensor, but got a sparse_c.. one of shape "
                                            r"\(2, 2\); .*tensor\.to_dense\(\)"):
            calls(sparse)[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", sorted(calls(None)))
def test_not_a_tensor_is_a_type_error_naming_its_type_and_touches_no_group(what: str) -> None:
    with Context.fake(4) as ctx:
        with pytest.raises(TypeError, match=rf"^{what}: expected a torch.Tensor, but got list: \[1.0, 2.0\]; "
                                            r"make one with torch.tensor\(\.\.\.\)$"):
            calls([1.0, 2.0])[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", sorted(calls(None)))
def test_a_tensor_on_another_device_is_a_value_error_naming_both(what: str) -> None:
    with Context.fake(4) as ctx:
        with pytest.raises(ValueError, match=rf"^{what}: expected a tensor on the context's device cpu, but got "
                                             r"one on meta; move it first \(tensor.to\('cpu'\)\)$"):
            calls(torch.ones(4, device="meta"))[what](ctx)
        assert ctx.stats()["groups_created"] == 0


@pytest.mark.parametrize("what", ["all_reduce", "reduce_scatter"])
def test_avg_of_an_integer_tensor_is_a_clear_error(what: str) -> None:
    with Context.fake(4) as ctx:
        call = getattr(ctx, what)
        with pytest.raises(TypeError, match=rf"^{what}: op='avg' divides, so it needs a floating-point tensor, but "
                                            r"got torch.int64; convert it \(tensor.float\(\)\) or use op='sum'$"):
            call(torch.arange(4), MESH, "tp", op="avg")
        assert ctx.stats()["groups_created"] == 0
        assert call(torch.arange(4), MESH, "tp", op="sum").dtype == torch.int64  # sum of integers is fine


def test_check_tensors_must_be_true_false_or_every_call() -> None:
    with pytest.raises(TypeError, match=r"^check_tensors: expected True, False or 'every-call', but got 'yes'$"):
        Context.fake(2, check_tensors="yes")
    with pytest.raises(TypeError, match=r"but got 1$"):  # 1 == True, but not what the option means
        Context.fake(2, check_tensors=1)


def test_the_environment_chooses_the_check_when_the_context_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_mode(None) == "steady"
    monkeypatch.setenv("FMESH_CHECK_TENSORS", "every-call")
    assert (check_mode(None), check_mode(True), check_mode(False)) == ("every-call", "steady", "off")
    monkeypatch.setenv("FMESH_CHECK_TENSORS", "sometimes")
    with pytest.raises(ValueError, match=r"^FMESH_CHECK_TENSORS: expected one of \['0', '1', 'every-call', 'off', "
                                         r"'on'\], but got 'sometimes'$"):
        Context.fake(2)


def odd_tensors(ctx: Context) -> dict[str, Any]:
    """Rank 3 passes a float64 tensor where the others pass float32; then one of another shape."""
    mesh = fmesh.make_mesh((4,), ("dp",), rank_map=[2, 3, 0, 1])
    seen: dict[str, Any] = {}
    for label, tensor in (("dtype", torch.ones(3, dtype=torch.float64 if ctx.rank == 3 else torch.float32)),
                          ("shape", torch.ones(3 if ctx.rank != 3 else 5))):
        try:
            ctx.all_reduce(tensor, mesh, "dp")
            seen[label] = ("no error", "")
        except Exception as error:
            seen[label] = (type(error).__name__, str(error))
    seen["after"] = ctx.all_reduce(torch.ones(2), mesh, "dp").tolist()  # the group is still in step
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"check_tensors": True}], ids=["default", "asked"])
def test_check_tensors_names_the_odd_rank_and_its_tensor(options: dict[str, Any]) -> None:
    results = succeeded(launch(odd_tensors, 4, timeout=120, **options))
    for rank, seen in enumerate(results):
        kind, message = seen["dtype"]
        assert kind == "TensorMismatchError", seen
        assert message.startswith(f"on rank {rank}: all_reduce along the group [2, 3, 0, 1] along axes ('dp',)")
        assert ("members hold different tensors: rank 3 holds a tensor of shape (3,) dtype torch.float64 in "
                "all_reduce('sum'), while ranks [0, 1, 2] hold shape (3,) dtype torch.float32 in all_reduce('sum')"
                ) in message
        kind, message = seen["shape"]
        assert kind == "TensorMismatchError", seen
        assert ("rank 3 holds a tensor of shape (5,) dtype torch.float32 in all_reduce('sum'), while ranks [0, 1, 2] "
                "hold shape (3,) dtype torch.float32") in message
        assert seen["after"] == [4.0, 4.0]


def unequal_gathers(ctx: Context) -> dict[str, Any]:
    """Rank 0 gathers 6 elements where rank 1 gathers 4 (gloo returned rank 1's bytes and garbage, unchecked), then a
    reduce_scatter along another dim, then an all_reduce on one rank against an all_gather on the other."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    seen: dict[str, Any] = {}
    calls: dict[str, Callable[[], Any]] = {
        "gather": lambda: ctx.all_gather(torch.arange(6.0) if ctx.rank == 0 else torch.arange(4.0) + 100, mesh),
        "dim": lambda: ctx.reduce_scatter(torch.ones(2, 2), mesh, dim=ctx.rank),
        "kind": lambda: (ctx.all_reduce if ctx.rank == 0 else ctx.all_gather)(torch.ones(2), mesh),
    }
    for label, call in calls.items():
        try:
            seen[label] = ("no error", call().tolist())
        except Exception as error:
            seen[label] = (type(error).__name__, str(error))
    seen["after"] = ctx.all_gather(torch.full((1,), float(ctx.rank)), mesh).tolist()  # the group is still in step
    return seen


@pytest.mark.slow
def test_by_default_unequal_calls_are_refused_on_every_member_before_any_byte_is_sent() -> None:
    for seen in succeeded(launch(unequal_gathers, 2, timeout=120)):
        assert seen["gather"][0] == "TensorMismatchError", seen
        assert ("rank 0 holds a tensor of shape (6,) dtype torch.float32 in all_gather(0); rank 1 holds a tensor of "
                "shape (4,) dtype torch.float32 in all_gather(0)") in seen["gather"][1], seen
        assert seen["dim"][0] == "TensorMismatchError" and "in reduce_scatter(0, 'sum'); rank 1" in seen["dim"][1]
        assert seen["kind"][0] == "TensorMismatchError", seen
        assert "in all_reduce('sum'); rank 1 holds a tensor of shape (2,) dtype torch.float32 in all_gather(0)" in (
            seen["kind"][1])
        assert seen["after"] == [0.0, 1.0], seen


def counted_all_reduces(ctx: Context) -> int:
    """How many all_reduce calls reach torch.distributed for one ``ctx.all_reduce`` on a group of two."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    ctx.materialize(mesh)
    real, count = torch.distributed.all_reduce, [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    torch.distributed.all_reduce = counting  # type: ignore[assignment]
    try:
        ctx.all_reduce(torch.ones(2), mesh)
    finally:
        torch.distributed.all_reduce = real
    return count[0]


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, "every-call", False])
def test_the_check_sends_no_collective_of_its_own(check: Any) -> None:
    # Before: one all_reduce of two int64 on the group before each collective (2 here), read back on the host.
    assert succeeded(launch(counted_all_reduces, 2, check_tensors=check)) == [1, 1]


# --------------------------------------------------------------------------------------------- steady state

STEPS = 6  # steps of a loop before the odd one: every window of the loop is known by then


def step_calls(ctx: Context, mesh: fmesh.Mesh, odd: str | None) -> None:
    """One step of a loop of three collectives on ``mesh``'s dp group; ``odd`` makes this rank's step differ."""
    ctx.all_reduce(torch.ones(4, dtype=torch.int32 if odd == "dtype" else torch.float32), mesh)
    if odd != "count":
        (ctx.all_reduce if odd == "collective" else ctx.all_gather)(torch.ones(2), mesh)
    ctx.all_reduce(torch.ones(5 if odd == "shape" else 3), mesh)


def odd_step(kind: str, ranks: int = 2) -> Callable[[Context], dict[str, Any]]:
    def body(ctx: Context) -> dict[str, Any]:
        mesh = fmesh.make_mesh((ranks,), ("dp",))
        seen: dict[str, Any] = {"steps": 0}
        try:
            for step in range(STEPS + 2):
                step_calls(ctx, mesh, kind if step == STEPS and ctx.rank == ranks - 1 else None)
                seen["steps"] += 1
            seen["error"] = ("no error", "")
        except Exception as error:
            seen["error"] = (type(error).__name__, str(error))
        return seen
    return body


THE_ODD_CALL = {
    "shape": "shape (5,) dtype torch.float32 in all_reduce('sum')",
    "dtype": "shape (4,) dtype torch.int32 in all_reduce('sum')",
    "collective": "shape (2,) dtype torch.float32 in all_reduce('sum')",
    "count": "shape (3,) dtype torch.float32 in all_reduce('sum')",
}
THE_USUAL_CALL = {
    "shape": "shape (3,) dtype torch.float32 in all_reduce('sum')",
    "dtype": "shape (4,) dtype torch.float32 in all_reduce('sum')",
    "collective": "shape (2,) dtype torch.float32 in all_gather(0)",
    "count": "shape (2,) dtype torch.float32 in all_gather(0)",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(THE_ODD_CALL))
def test_in_steady_state_a_call_that_differs_is_named_on_every_rank_before_it_is_sent(kind: str) -> None:
    # The loop's windows are known after a few steps: the usual calls go without a meeting. The odd rank's call
    # makes a window never agreed, so it meets; its peer, on the known path, blocks in the collective until its watch
    # posts the call it is blocked in; the odd rank names both, sends nothing, and cuts the group, which frees its peer
    # with the same error. Before: one all_reduce per call (2.4x a small collective's cost), no such path.
    odd, usual = launch(odd_step(kind), 2, timeout=120)[::-1]
    for seen in (odd, usual):
        assert seen["error"][0] == "TensorMismatchError", seen
        assert seen["steps"] == STEPS, seen  # found at the odd step, not later
    assert THE_ODD_CALL[kind] in odd["error"][1] and THE_USUAL_CALL[kind] in odd["error"][1], odd
    assert "rank 0 is blocked in" in odd["error"][1] and "Nothing of this rank's tensor was sent" in odd["error"][1]
    assert "rank 1 refused it on itself" in usual["error"][1] and THE_ODD_CALL[kind] in usual["error"][1], usual


def run_phases(ctx: Context, mesh: fmesh.Mesh) -> tuple[int, Exception | None]:
    """Two phases of the same shapes, training (sum, sum) and evaluation (max, max), 16 of them; rank 1 starts
    evaluating one step early. How many calls went through, and what the next one raised."""
    calls = 0
    try:
        for phase in range(16):
            for step in range(10):
                early = phase == 4 and step == 9 and ctx.rank == 1
                for _ in range(2):
                    ctx.all_reduce(torch.ones(4), mesh, op="max" if phase % 2 or early else "sum")
                    calls += 1
    except Exception as error:
        return calls, error
    return calls, None


def after(ctx: Context, mesh: fmesh.Mesh) -> Any:
    """What a call on the group gives after the phases: its sum, or the name of what it raised."""
    try:
        return ctx.all_reduce(torch.ones(2), mesh).tolist()
    except Exception as error:
        return type(error).__name__


def swapped_phases(ctx: Context) -> dict[str, Any]:
    """:func:`run_phases`: every window either rank makes is one both made before, so only the checkpoint can tell."""
    mesh = fmesh.make_mesh((2,), ("dp",))
    calls, error = run_phases(ctx, mesh)
    return {"calls": calls, "error": ("no error", "") if error is None else (type(error).__name__, str(error)),
            "after": after(ctx, mesh)}


@pytest.mark.slow
def test_by_default_a_divergence_between_known_calls_is_found_at_the_next_checkpoint() -> None:
    first, second = launch(swapped_phases, 2, timeout=120)
    for seen in (first, second):
        assert seen["error"][0] == "TensorMismatchError", seen
        # Found at the checkpoint after call #100 (the odd one), #128, compared on the watch's thread while the calls go
        # on: raised a few calls later (a store round trip), well before the next checkpoint but one.
        assert 2 * CHECKPOINT <= seen["calls"] < 3 * CHECKPOINT, seen
        assert seen["after"] == "RankLostError", seen  # the mismatched call ran: the group is cut
    # The member that arrives second at the checkpoint finds the difference and names its own calls of the first
    # block that differs (either rank may); the other member passes its error on, or raises the same text where the
    # failed group's one verdict reached it first (store/records.Conclusion): either way one rank's calls are named.
    block = ("all_reduce along the group [0, 1] along axes ('dp',) of Mesh(dp=2; world=2): members made different "
             "calls on this group, found after they ran: among calls #97-#104")
    texts = [seen["error"][1] for seen in (first, second)]
    rank_of_text = next(rank for rank, text in enumerate(texts) if block in text)
    told, other = texts[rank_of_text], texts[1 - rank_of_text]
    named = 0 if f"{block} rank 0 made" in told else 1  # whose calls it lists
    assert f"{block} rank {named} made" in told, told
    assert f"#99 shape (4,) dtype torch.float32 in all_reduce('{'max' if named else 'sum'}')" in told, told
    assert f"rank {1 - named} made others" in told, told
    passed_on = f"rank {named} disagrees about the calls made on this group"
    assert passed_on in other or f"{block} rank {named} made" in other, other


class StagedStore:
    """The watch's store connection in :func:`watch_told_after_its_collective`: at the checkpoint after the calls
    differ, rank 0 is second (it finds the difference), and rank 1 reads the verdict only once its own collective has
    failed."""

    def __init__(self, store: Any, rank: int, collective_failed: threading.Event) -> None:
        self.store, self.rank, self.collective_failed = store, rank, collective_failed
        self.staged = False

    def compare_set(self, key: str, expected: str, desired: str) -> Any:
        self.staged = key.endswith(f"/checkpoint/{2 * CHECKPOINT}")
        while self.staged and self.rank == 0 and not self.store.check([key]):  # after rank 1's hashes
            time.sleep(0.01)
        return self.store.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        if self.staged and self.rank == 1:
            while not self.store.check(keys):  # rank 0's verdict
                time.sleep(0.01)
            assert self.collective_failed.wait(patience(60)), "rank 1's collective never failed"
        return bool(self.store.check(keys))

    def get(self, key: str) -> Any:
        return self.store.get(key)


def watch_told_after_its_collective(ctx: Context) -> dict[str, Any]:
    """:func:`swapped_phases`, staged: rank 0 finds the difference and cuts the group; rank 1, blocked in a
    collective, is told by its failure; only then does rank 1's watch read the same difference (the race of a loaded
    machine, seen in CI)."""
    from fmesh.context.call_checks import CallChecks

    collective_failed, compared = threading.Event(), threading.Event()
    compare = CallChecks.compare

    def staged(self: CallChecks, checkpoint: Any, store: Any) -> Any:
        try:
            return compare(self, checkpoint, StagedStore(store, ctx.rank, collective_failed))
        finally:
            if checkpoint.count == 2 * CHECKPOINT:
                compared.set()

    CallChecks.compare = staged  # type: ignore[method-assign]  # this forked process only
    mesh = fmesh.make_mesh((2,), ("dp",))
    calls, error = run_phases(ctx, mesh)
    collective_failed.set()
    assert compared.wait(patience(60)), "the watch never compared"
    time.sleep(0.2)  # the watch files what it found right after comparing
    return {"calls": calls, "error": None if error is None else type(error).__name__, "after": after(ctx, mesh)}


@pytest.mark.slow
def test_a_difference_the_watch_finds_after_the_failed_collective_told_it_is_not_raised_again() -> None:
    # Before: rank 1's next call, on any group, raised the same TensorMismatchError a second time, though the group
    # had failed once and said so.
    for rank, seen in enumerate(launch(watch_told_after_its_collective, 2, timeout=120)):
        assert seen.get("error") == "TensorMismatchError", (rank, seen)
        assert seen["after"] == "RankLostError", (rank, seen)  # the group was cut: that is what its next call says


@pytest.mark.slow
def test_every_call_stops_before_the_first_call_that_differs_and_the_group_stays_healthy() -> None:
    for rank, seen in enumerate(launch(swapped_phases, 2, timeout=120, check_tensors="every-call")):
        assert seen["error"][0] == "TensorMismatchError", seen
        assert seen["calls"] == 98, seen  # calls #99, rank 1's first evaluation call, was never sent
        assert ("rank 0 holds a tensor of shape (4,) dtype torch.float32 in all_reduce('sum'); rank 1 holds a tensor "
                "of shape (4,) dtype torch.float32 in all_reduce('max')") in seen["error"][1], seen
        assert seen["after"] == [2.0, 2.0], (rank, seen)


def host_reads(check: Any) -> Callable[[Context], int]:
    def body(ctx: Context) -> int:
        """How often the host read a tensor's value (``.item()``, ``.tolist()``: on a GPU, a device synchronisation)
        in 200 steady-state collectives."""
        from torch.utils._python_dispatch import TorchDispatchMode

        class Reads(TorchDispatchMode):
            count = 0

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if func is torch.ops.aten._local_scalar_dense.default:
                    Reads.count += 1
                return func(*args, **(kwargs or {}))

        mesh = fmesh.make_mesh((2,), ("dp",))
        for _ in range(8):  # the first calls meet: every window known afterwards
            ctx.all_reduce(torch.ones(4), mesh)
        with Reads():
            for _ in range(200):
                ctx.all_reduce(torch.ones(4), mesh)
        return Reads.count
    return body


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, "every-call"])
def test_the_check_never_reads_a_tensor_on_the_host(check: Any) -> None:
    # Under NCCL's rules (tests/strict_nccl.py). Before: one .tolist() per collective, a device synchronisation on NCCL.
    assert succeeded(launch(host_reads(check), 2, timeout=120, check_tensors=check)) == [0, 0]
