"""The search over layouts: every candidate valid, the ranking true to the step-time model, the filter true to
the memory model, the changes worth trying faster, and the benchmark's one command."""

from __future__ import annotations

import importlib.util
import io
from contextlib import redirect_stdout

import attrs
from paths import ROOT

from fmesh.plan.hardware import hardware
from fmesh.plan.memory import memory, with_communicators
from fmesh.plan.model import RECOMPUTE_MODES, Options, preset
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.search import alternatives, candidates, search
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
    best = search(MODEL, Options(), 64, 8, H100, top=3)
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
