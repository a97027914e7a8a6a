"""What a demanding user found wrong with the planner (issue 36), one test each: FSDP under a pipeline gathers and
reduces once per step; context parallelism keeps the gathered keys and values; cross-host tp/ep is named in
every output; the changes worth trying all fit, communicators included; the batch is printed and has flags;
micro-batch and recomputation are searched; causal attention costs half its FLOPs with FlashAttention; byte
columns read as a person reads them."""

from __future__ import annotations

import io
import json
import re

import attrs
import pytest

from fmesh.cli import main
from fmesh.plan.costs import format_bytes
from fmesh.plan.hardware import hardware
from fmesh.plan.memory import layer_activation_bytes, memory, micro_batches, with_communicators
from fmesh.plan.model import Model, Options, first_stage_weights, layer_weights, preset
from fmesh.plan.model_plan import plan_model
from fmesh.plan.model_table import format_model_plan
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.search import (
    MICRO_BATCHES,
    alternatives,
    candidates,
    differences,
    fits,
    micro_batch_choices,
    search,
)
from fmesh.plan.step import step_flops, step_time
from fmesh.plan.topology import Topology
from fmesh.plan.traffic import fsdp_gather_elements, traffic

H100 = hardware("h100")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _calls(moved: tuple, axis: str, collective: str) -> tuple[int, int]:
    found = [(t.calls, t.nbytes) for t in moved if t.axis == axis and t.collective == collective]
    return found[0] if found else (0, 0)


@pytest.mark.parametrize("batch", [64, 256, 1024])
def test_fsdp_under_a_pipeline_gathers_and_reduces_once_per_step(batch: int) -> None:
    # torch's pipeline schedules run FSDP2 without resharding between micro-batches and reduce the gradients
    # after the last one: one all_gather and one reduce_scatter per unit per step, however many micro-batches.
    model = attrs.evolve(preset("llama3-70b"), global_batch=batch)
    dims = ParallelDims(256, pp=8, dp_shard=4, tp=8)
    assert micro_batches(model, dims) == batch // 4
    moved = traffic(model, Options(recompute="full"), dims)
    stage_layers = model.layers // 8
    units = stage_layers + 1  # the stage's layers and the root (the embedding on the first stage)
    assert _calls(moved, "dp_shard_cp", "all_gather")[0] == units
    assert _calls(moved, "dp_shard_cp", "reduce_scatter")[0] == units
    dense = [w for w in layer_weights(model) if not w.expert]
    per_layer = fsdp_gather_elements(dense, 8, 4) * 2  # bf16 weights
    root = fsdp_gather_elements(first_stage_weights(model, 8), 8, 4) * 2
    assert _calls(moved, "dp_shard_cp", "all_gather")[1] == stage_layers * per_layer + root
    # and the stage's weights and gradients stay unsharded all step: memory counts them
    used = memory(model, Options(recompute="full"), dims)
    assert used.buffers == stage_layers * per_layer // 2 * (2 + 4)


def test_without_a_pipeline_fsdp_still_follows_every_micro_batch_unless_told() -> None:
    model, dims = attrs.evolve(preset("llama3-8b"), global_batch=64), ParallelDims(16, dp_shard=8, tp=2)
    m, layers = micro_batches(model, dims), model.layers
    moved = traffic(model, Options(recompute="none"), dims)
    assert _calls(moved, "dp_shard_cp", "all_gather")[0] == 2 * m * layers + m
    assert _calls(moved, "dp_shard_cp", "reduce_scatter")[0] == m * (layers + 1)
    once = traffic(model, Options(recompute="none", gradient_sync="step"), dims)
    assert _calls(once, "dp_shard_cp", "reduce_scatter")[0] == layers + 1


@pytest.mark.parametrize(("name", "tp", "cp"), [("llama3-8b", 1, 8), ("llama3-70b", 8, 4), ("megatron-22b", 2, 2),
                                                ("mixtral-8x7b", 2, 16)])
def test_context_parallel_memory_keeps_the_gathered_keys_and_values(name: str, tp: int, cp: int) -> None:
    # The byte model gathers K and V once per forward and reduce-scatters their gradients in the backward, so
    # the attention keeps the gathered (whole-sequence) K and V: a layer with cp keeps exactly what a layer of
    # seq_len / cp keeps, plus the part of the gathered K and V that is not its own.
    model = preset(name)
    options = Options(recompute="none")
    short = attrs.evolve(model, seq_len=model.seq_len // cp)
    gathered = _calls(traffic(model, options, ParallelDims(tp * cp, cp=cp, tp=tp, dp_shard=1)), "cp", "all_gather")
    per_call = gathered[1] // gathered[0]
    own = per_call // cp
    assert layer_activation_bytes(model, options, tp, cp) == layer_activation_bytes(short, options, tp) + per_call - own


def test_model_plans_warn_when_tp_crosses_hosts_like_the_plain_plan() -> None:
    code, out, _ = run("--model", "megatron-175b", "--world-size", "128", "--gpus-per-node", "8", "--tp", "16",
                       "--pp", "8")
    assert code == 0
    plain = run("--world-size", "128", "--gpus-per-node", "8", "--tp", "16", "--pp", "8")[1]
    warned = [line for line in plain.splitlines() if line.startswith("warning: tp groups")]
    assert warned and all(line.split(";")[0] in out for line in warned)
    code, out, _ = run("--model", "megatron-175b", "--world-size", "128", "--gpus-per-node", "8", "--tp", "16",
                       "--pp", "8", "--json")
    assert any(w.startswith("tp groups") for w in json.loads(out)["warnings"])


def test_every_ranked_layout_names_the_axes_that_cross_hosts() -> None:
    # 4 GPUs per host: a tp of 8 must cross; the search's list says so beside each layout that does.
    best = search(preset("megatron-175b"), Options(flash_attention=False), 64, 4, H100, top=40)
    crossing = [c for c in best if c.dims.tp > 4]
    assert crossing and all(re.search(r"\((\w+, )*tp(, \w+)* across hosts\)", c.label) for c in crossing)
    assert all("tp" not in c.crossing for c in best if c.dims.tp <= 4 and c.rank_order == "block")


@pytest.mark.parametrize(("name", "gpus"), [("llama3-70b", 64), ("llama3-8b", 16), ("mixtral-8x7b", 64)])
def test_changes_worth_trying_fit_with_their_communicators(name: str, gpus: int) -> None:
    model = preset(name)
    checked = layouts = 0
    for dims in list(candidates(model, gpus))[::7]:
        if fits(model, Options(), dims, H100) is None or layouts == 8:  # a fixed sample of 8 layouts that fit
            continue
        layouts += 1
        for text, _ in alternatives(model, Options(), dims, 8, H100):
            if text.startswith("rank order"):
                continue
            other, other_model = _applied(model, dims, text)
            fit = fits(other_model, Options(), other, H100)
            assert fit is not None, text
            assert with_communicators(fit[1], other, 8).total <= H100.memory, (dims, text)
            checked += 1
    assert checked > 0


def _applied(model: Model, dims: ParallelDims, text: str) -> tuple[ParallelDims, Model]:
    degrees = {n: getattr(dims, n) for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")}
    for name, new, _ in re.findall(r"([\w-]+) (\d+) instead of (\d+)", text):
        if name == "micro-batch":
            model = attrs.evolve(model, micro_batch=int(new))
        else:
            degrees[name] = int(new)
    return ParallelDims(dims.world_size, **degrees), model


def test_the_batch_is_printed_and_has_flags() -> None:
    code, out, _ = run("--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8",
                       "--global-batch", "64", "--seq-len", "4096", "--micro-batch", "2")
    assert code == 0
    assert "batch: 64 sequences of 4096 tokens per step, micro-batch 2 (16 per data-parallel rank per step)" in out
    plan = json.loads(run("--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8",
                          "--global-batch", "64", "--seq-len", "4096", "--micro-batch", "2", "--json")[1])
    assert (plan["global_batch"], plan["seq_len"], plan["micro_batch"], plan["micro_batches"]) == (64, 4096, 2, 16)
    code, _, err = run("--world-size", "16", "--gpus-per-node", "8", "--seq-len", "4096")
    assert code == 2 and "--seq-len" in err and "--model" in err
    code, _, err = run("--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--micro-batch", "0",
                       "--tp", "8")
    assert code == 2 and "micro_batch" in err


def test_a_given_micro_batch_is_kept_by_the_search() -> None:
    plan = plan_model(preset("llama3-8b"), Options(), H100, 64, 8, micro_batches=[2])
    assert plan.model.micro_batch == 2 and all(c.micro_batch == 2 for c in plan.ranked)


def test_the_search_tries_every_micro_batch_and_the_least_recomputation_for_each() -> None:
    # brute force over degrees, micro-batches and recomputation: the search's best is the fastest that fits
    model = attrs.evolve(preset("llama3-8b"), global_batch=128)
    best = search(model, Options(), 16, 8, H100, top=3)
    brute = []
    for dims in candidates(attrs.evolve(model, micro_batch=1), 16):
        for size in micro_batch_choices(model, dims):
            sized = attrs.evolve(model, micro_batch=size)
            for mode in ("none", "selective", "full"):
                used = memory(sized, Options(recompute=mode), dims)
                if used.total > H100.memory:
                    continue
                for order in ("block", "cyclic"):
                    if with_communicators(used, dims, 8, order).total <= H100.memory:
                        brute.append((step_time(sized, Options(recompute=mode), dims, H100,
                                                Topology(2, 8, rank_order=order)).total, size, mode))
                break
    assert best[0].time.total == pytest.approx(min(brute)[0], rel=1e-12)
    assert {size for _, size, _ in brute} >= {1, 2, 4, 8, 16} and set(MICRO_BATCHES) >= {c.micro_batch for c in best}
    assert len({mode for _, _, mode in brute}) > 1  # recomputation is searched too


def test_a_bigger_micro_batch_wins_where_it_saves_fsdp_traffic() -> None:
    # no pipeline, FSDP over hosts: every micro-batch gathers the weights again, so fewer, bigger ones are faster
    model = attrs.evolve(preset("llama3-8b"), global_batch=1024, seq_len=1024)
    best = search(model, Options(), 512, 8, H100, top=1)[0]
    assert best.micro_batch > 1
    ones = search(model, Options(), 512, 8, H100, top=1, micro_batches=[1])[0]
    assert best.time.total < ones.time.total


def test_causal_attention_costs_half_with_flash_attention() -> None:
    model = attrs.evolve(preset("llama3-8b"), seq_len=131072, global_batch=8)
    flash, unfused = step_flops(model, Options(recompute="none")), step_flops(model, Options(recompute="none",
                                                                                             flash_attention=False))
    tokens, s, h, layers = model.global_batch * model.seq_len, model.seq_len, model.hidden, model.layers
    assert unfused - flash == 3 * tokens * layers * 2 * s * h  # half of QK^T and AV, forward and backward


def test_byte_columns_read_as_a_person_reads_them() -> None:
    assert format_bytes(2070 * 2**30) == "2.02 TiB"
    code, out, _ = run("--model", "llama3-405b", "--world-size", "256", "--gpus-per-node", "8", "--dp-shard", "32",
                       "--tp", "8", "--recompute", "full")
    assert code == 0 and "e+" not in out


def test_reasons_name_every_difference() -> None:
    plan = plan_model(preset("llama3-70b"), Options(), H100, 256, 8)
    assert len(plan.reasons) == len(plan.ranked) - 1
    for other, line in zip(plan.ranked[1:], plan.reasons, strict=True):
        for change in differences(plan.ranked[0], other):
            assert change in line
        assert "\n" not in line
    text = format_model_plan(plan)
    assert all(r in text for r in plan.reasons)


def test_an_interleaved_pipeline_cuts_the_bubble_and_sends_more() -> None:
    model, dims = preset("megatron-175b"), ParallelDims(64, pp=8, tp=8, dp_shard=1)
    plain, interleaved = Options(recompute="selective"), Options(recompute="selective", pipeline_interleave=3)
    a100, hosts = hardware("a100"), Topology(8, 8)
    m = micro_batches(model, dims)
    one, three = step_time(model, plain, dims, a100, hosts), step_time(model, interleaved, dims, a100, hosts)
    ideal = one.compute - one.bubble
    assert one.bubble == pytest.approx(ideal * 7 / m) and three.bubble == pytest.approx(ideal * 7 / (3 * m))
    sends = _calls(traffic(model, interleaved, dims), "pp", "send")
    assert sends == tuple(3 * x for x in _calls(traffic(model, plain, dims), "pp", "send"))


def test_data_parallel_collectives_after_the_backward_count_in_full() -> None:
    model, dims = preset("llama3-8b"), ParallelDims(64, dp_replicate=8, tp=8, dp_shard=1)
    hosts = Topology(8, 8)
    beside = step_time(model, Options(recompute="none"), dims, H100, hosts)
    after = step_time(model, Options(recompute="none", overlap_data_parallel=False), dims, H100, hosts)
    dp_seconds = sum(t.seconds for t in after.collectives if not t.critical)
    assert dp_seconds > 0 and after.exposed_overlapped == 0.0
    assert after.total == pytest.approx(beside.total - beside.exposed_overlapped + dp_seconds)


def test_link_efficiency_and_non_matmul_time_scale_as_stated() -> None:
    model, dims, hosts = preset("llama3-8b"), ParallelDims(16, tp=8, dp_shard=2), Topology(2, 8)
    base = step_time(model, Options(recompute="none"), dims, H100, hosts)
    slow = step_time(model, Options(recompute="none", link_efficiency=0.5), dims, H100, hosts)
    tp_base = [t.seconds for t in base.collectives if t.axis == "tp"]
    tp_slow = [t.seconds for t in slow.collectives if t.axis == "tp"]
    ratios = [b.seconds / a.seconds for a, b in zip(base.collectives, slow.collectives, strict=True) if a.seconds]
    assert all(1 < r <= 2 for r in ratios) and max(ratios) > 1.95  # the bandwidth term doubles, the latency stays
    assert tp_base and tp_slow
    busy = step_time(model, Options(recompute="none", elementwise_bytes=100), dims, H100, hosts)
    tokens = model.global_batch * model.seq_len
    expected = 3 * tokens * model.layers * model.hidden * 100 / (16 * H100.memory_bandwidth)  # 3 passes
    assert busy.compute - base.compute == pytest.approx(expected)
    full = step_time(model, Options(recompute="full"), dims, H100, hosts)
    full_busy = step_time(model, Options(recompute="full", elementwise_bytes=100), dims, H100, hosts)
    assert full_busy.compute - full.compute == pytest.approx(expected * 4 / 3)  # the recomputed forward: a 4th
