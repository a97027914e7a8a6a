"""The search over layouts: every candidate valid, the ranking true to the step-time model, the filter true to
the memory model, the changes worth trying faster, and the benchmark's one command."""

from __future__ import annotations

import importlib.util
import io
import re
from contextlib import redirect_stdout

import attrs
import pytest
from paths import ROOT

from fmesh.plan.hardware import hardware
from fmesh.plan.memory import memory, with_communicators
from fmesh.plan.model import RECOMPUTE_MODES, Options, preset
from fmesh.plan.model_plan import plan_model
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.search import alternatives, candidates, check_degrees, fits, search
from fmesh.plan.step import step_time
from fmesh.plan.topology import Topology

MODEL, H100 = preset("llama3-8b"), hardware("h100")


def test_candidates_are_valid_and_complete() -> None:
    found = {(d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp) for d in candidates(MODEL, 32)}
    for pp, dr, ds, cp, tp in found:
        assert pp * dr * ds * cp * tp == 32 and MODEL.kv_heads % tp == 0 and MODEL.seq_len % cp == 0
    powers = (1, 2, 4, 8, 16, 32)
    expected = {(pp, dr, ds, cp, tp) for tp in (1, 2, 4, 8) for cp in powers for pp in powers for dr in powers
                for ds in powers if pp * dr * ds * cp * tp == 32}
    assert found == expected


def test_the_best_is_the_fastest_layout_that_fits() -> None:
    best = search(MODEL, Options(), 64, 8, H100, top=3, micro_batches=[MODEL.micro_batch])
    assert [c.time.total for c in best] == sorted(c.time.total for c in best)
    brute = []
    for dims in candidates(MODEL, 64):
        for mode in RECOMPUTE_MODES:  # the least recomputation that fits
            options = attrs.evolve(Options(), recompute=mode)
            used = memory(MODEL, options, dims)
            if used.total <= H100.memory:
                for order in ("block", "cyclic"):
                    if with_communicators(used, dims, 8, order).total <= H100.memory:
                        brute.append(step_time(MODEL, options, dims, H100, Topology(8, 8, rank_order=order)).total)
                break
    assert best[0].time.total == min(brute)
    assert all(c.memory.total <= H100.memory for c in best)


def test_changes_worth_trying_are_faster() -> None:
    dims = ParallelDims(64, pp=8, dp_shard=1, tp=8)
    changes = alternatives(preset("llama3-70b"), Options(), dims, 8, H100)
    assert changes and all(delta < 0 for _, delta in changes)
    assert [d for _, d in changes] == sorted(d for _, d in changes)


def test_bench_prints_a_table() -> None:
    spec = importlib.util.spec_from_file_location("plan_search_bench", ROOT / "bench" / "plan_search.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = io.StringIO()
    with redirect_stdout(out):
        bench.main(["--model", "llama3-8b", "--gpus", "64"])
    rows = out.getvalue().splitlines()
    assert rows[1].split()[0] == "GPUs" and rows[2].split()[0] == "64" and "s" in rows[2]


def test_given_degrees_follow_the_search_rules() -> None:
    # Every degree set of 48 GPUs is a candidate exactly when check_degrees lets it through (one rule for both).
    for model in (preset("llama3-70b"), preset("mixtral-8x7b"), attrs.evolve(MODEL, global_batch=96, seq_len=8190)):
        found = set(candidates(model, 48))
        for pp, dr, ds, cp, tp in [(pp, dr, ds, cp, tp) for pp in (1, 2, 3, 4, 6, 8, 12, 16, 24, 48)
                                   for dr in (1, 2, 3, 4, 6) for cp in (1, 2, 3, 4, 6) for tp in (1, 2, 3, 4, 8, 16)
                                   for ds in (1, 2, 3, 4, 8) if pp * dr * cp * tp * ds == 48]:
            for ep in (1, 2, 4, 8):
                try:
                    dims = ParallelDims(48, pp=pp, dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, ep=ep)
                except ValueError:
                    continue
                try:
                    check_degrees(model, dims)
                except ValueError as error:
                    assert dims not in found, error
                else:
                    assert dims in found, dims


@pytest.mark.parametrize(("degrees", "says"), [
    ({"tp": 16, "dp_shard": 4}, "but got tp=16"),
    ({"cp": 3, "dp_shard": 8}, "but got cp=3"),
    ({"dp_shard": 3, "tp": 8}, "but got dp=3 (dp_replicate=1 x dp_shard=3)"),
    ({"ep": 2, "tp": 8}, "but got ep=2"),
    ({"pp": 96, "dp_shard": 1}, "but got pp=96"),
])
def test_given_degrees_that_do_not_suit_the_model_raise(degrees: dict[str, int], says: str) -> None:
    gpus = 1
    for value in degrees.values():
        gpus *= value if value > 0 else 1
    gpus = max(gpus, 8) if "ep" not in degrees else 64
    with pytest.raises(ValueError, match=re.escape(says)) as raised:
        plan_model(preset("llama3-70b"), Options(), H100, gpus, 8, degrees=degrees)
    assert "\n" not in str(raised.value)


def test_the_ep_message_names_what_fits() -> None:
    with pytest.raises(ValueError, match=r"expected ep 1 \(it has no experts\) of llama3-70b \(ep in 1\)"):
        check_degrees(preset("llama3-70b"), ParallelDims(64, tp=8, ep=2))
    with pytest.raises(ValueError, match=r"tp in 1, 2, 4, 8\), but got tp=16"):
        check_degrees(preset("llama3-70b"), ParallelDims(64, tp=16))


def test_a_forced_recompute_mode_is_kept() -> None:
    degrees = {"dp_shard": 8, "tp": 8}
    for mode in RECOMPUTE_MODES:
        plan = plan_model(MODEL, Options(recompute=mode), H100, 64, 8, degrees=degrees)
        assert plan.recompute == mode
        assert plan.memory.activations == memory(MODEL, Options(recompute=mode), plan.dims).activations
    assert plan_model(MODEL, Options(), H100, 64, 8, degrees=degrees).recompute == "none"  # auto: the least
    for candidate in search(preset("llama3-70b"), Options(recompute="full"), 64, 8, H100, top=5):
        assert candidate.recompute == "full"
    tight = {"dp_shard": 64}  # 70B on 64 GPUs with FSDP alone fits only with full recomputation
    assert plan_model(preset("llama3-70b"), Options(), H100, 64, 8, degrees=tight).recompute == "full"
    for mode in ("none", "selective"):
        with pytest.raises(ValueError, match=f"does not with recompute {mode}"):
            plan_model(preset("llama3-70b"), Options(recompute=mode), H100, 64, 8, degrees=tight)


def _applied(dims: ParallelDims, text: str) -> ParallelDims:
    """The layout a change's text describes: 'tp 4 instead of 8, dp_shard 2 instead of 1 (ep 2 kept)'."""
    degrees = {n: getattr(dims, n) for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")}
    for name, new, old in re.findall(r"(\w+) (\d+) instead of (\d+)", text):
        assert degrees[name] == int(old)
        degrees[name] = int(new)
    return ParallelDims(dims.world_size, **degrees)


def test_moe_changes_name_ep_and_cost_the_layout_they_name() -> None:
    mixtral = preset("mixtral-8x7b")
    dims = ParallelDims(64, dp_shard=32, tp=2, ep=2)
    changes = alternatives(mixtral, Options(), dims, 8, H100)
    assert changes and any(text.startswith("ep ") for text, _ in changes)
    base = step_time(mixtral, Options(recompute=fits(mixtral, Options(), dims, H100)[0]), dims, H100,
                     Topology(8, 8)).total
    for text, delta in changes:
        if text.startswith(("rank order", "micro-batch", "ZeRO", "pipeline schedule")):  # the degrees kept
            continue
        assert "ep" in text, text
        other = _applied(dims, text)
        mode = fits(mixtral, Options(), other, H100)[0]
        seconds = step_time(mixtral, Options(recompute=mode), other, H100, Topology(8, 8)).total
        assert seconds / base - 1 == pytest.approx(delta, abs=1e-12), text
