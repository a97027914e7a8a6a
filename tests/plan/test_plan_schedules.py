"""The missing physics of issue 36, one test each (each fails on the planner before it): ZeRO-1 and ZeRO-2
(the optimizer state, then the gradients, sharded over the data-parallel ranks, the weights whole), FP8 matrix
multiplies and FP8 weight gathers, the zero-bubble ZB-H1 pipeline schedule, the interleaved schedule's first
stage holding more micro-batches, and Megatron-LM's scatter/gather of the pipeline's messages. The expected figures
are computed here from the model's sizes, not read from the planner."""

from __future__ import annotations

import io
import math

import attrs
import pytest

from fmesh.cli import main
from fmesh.plan.hardware import hardware
from fmesh.plan.memory import layer_activation_bytes, memory, micro_batches
from fmesh.plan.model import Options, layer_weights, outer_weights, parameter_count, preset
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.search import search
from fmesh.plan.step import compute_seconds, step_flops, step_time
from fmesh.plan.topology import Topology
from fmesh.plan.traffic import traffic

H100 = hardware("h100")
LLAMA = preset("llama3-8b")
FSDP8 = ParallelDims(8, dp_shard=8)


def _padded(numels: list[tuple[int, int]], shards: int) -> int:
    """Elements of FSDP's padded all_gather output for (rows, rest) weights split ``shards`` ways."""
    return sum(math.ceil(rows / shards) * shards * rest for rows, rest in numels)


def _shapes(weights: tuple[object, ...]) -> list[tuple[int, int]]:
    return [(w.shape[0], math.prod(w.shape[1:])) for w in weights]  # type: ignore[attr-defined]


def _by(moved: tuple[object, ...], axis: str, collective: str) -> tuple[int, int]:
    found = [(t.calls, t.nbytes) for t in moved if (t.axis, t.collective) == (axis, collective)]  # type: ignore
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_1_and_2_keep_the_weights_whole_and_shard_the_optimizer(zero: int) -> None:
    whole = parameter_count(LLAMA)
    shard = math.ceil(whole / 8)
    options = Options(recompute="none", zero=zero)
    used = memory(LLAMA, options, FSDP8)
    assert used.weights == whole * 2  # bf16 weights, whole on every rank
    assert used.optimizer == shard * (4 + 8)  # the fp32 master copy and Adam's moments, sharded
    one_layer = sum(w.numel for w in layer_weights(LLAMA))
    if zero == 1:
        assert (used.gradients, used.buffers) == (whole * 4, 0)
    else:  # the shard, and one layer's whole gradients before their reduce_scatter
        assert (used.gradients, used.buffers) == (shard * 4, one_layer * 4)
    fsdp = memory(LLAMA, Options(recompute="none"), FSDP8)
    assert fsdp.weights == shard * 2 and fsdp.weights < used.weights and fsdp.optimizer == used.optimizer
    for bad in (0, 4, True, "1"):
        with pytest.raises(ValueError, match=r"expected zero among \(1, 2, 3\)"):
            Options(zero=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_1_and_2_gather_the_weights_once_per_step(zero: int) -> None:
    model = attrs.evolve(LLAMA, global_batch=64)
    options = Options(recompute="none", zero=zero)
    m = micro_batches(model, FSDP8)
    assert m == 8
    moved = traffic(model, options, FSDP8)
    units = model.layers + 1  # each layer and the root (the embedding, the final norm and the output layer)
    elements = model.layers * _padded(_shapes(layer_weights(model)), 8) + _padded(_shapes(outer_weights(model)), 8)
    assert _by(moved, "dp_shard_cp", "all_gather") == (units, elements * 2)  # once per step, not 2 m per layer
    reduces = 1 if zero == 1 else m  # accumulated whole, or reduced after every backward
    assert _by(moved, "dp_shard_cp", "reduce_scatter") == (reduces * units, reduces * elements * 4)
    fsdp = traffic(model, Options(recompute="none"), FSDP8)
    assert _by(fsdp, "dp_shard_cp", "all_gather")[0] == (2 * m * model.layers + m)


def test_fp8_multiplies_the_linear_layers_at_the_fp8_peak() -> None:
    options, dims = Options(recompute="none"), ParallelDims(64, dp_shard=8, tp=8)
    tokens = LLAMA.global_batch * LLAMA.seq_len
    linear = sum(w.numel for w in layer_weights(LLAMA) if w.fp8) * LLAMA.layers * tokens * 2 * 3
    bf16 = compute_seconds(LLAMA, options, dims, H100)
    fp8 = compute_seconds(LLAMA, attrs.evolve(options, fp8=True), dims, H100)
    peak = 64 * H100.flops * options.efficiency
    assert bf16 - fp8 == pytest.approx(linear / peak - linear / (64 * H100.fp8_flops * options.efficiency))
    assert step_flops(LLAMA, attrs.evolve(options, fp8=True)) == step_flops(LLAMA, options)  # the same work
    with pytest.raises(ValueError, match="expected hardware with FP8 tensor cores"):
        compute_seconds(LLAMA, attrs.evolve(options, fp8=True), dims, hardware("a100"))


def test_fp8_gathers_the_linear_weights_in_one_byte() -> None:
    model = attrs.evolve(LLAMA, global_batch=8)  # one micro-batch: each layer gathered twice, the root once
    bf16, fp8 = Options(recompute="none"), Options(recompute="none", fp8=True)
    gathers, gathered = _by(traffic(model, bf16, FSDP8), "dp_shard_cp", "all_gather")
    linear = _padded(_shapes(tuple(w for w in layer_weights(model) if w.fp8)), 8)  # one layer's linear weights
    saved = 2 * model.layers * linear * (2 - 1)  # 2 bytes to 1, for every gather of a layer
    assert _by(traffic(model, fp8, FSDP8), "dp_shard_cp", "all_gather") == (gathers, gathered - saved)
    assert memory(model, bf16, FSDP8).buffers - memory(model, fp8, FSDP8).buffers == 2 * (
        sum(w.numel for w in layer_weights(model) if w.fp8))  # the two gathered layers held in FP8
    assert memory(model, fp8, FSDP8).weights == memory(model, bf16, FSDP8).weights


def test_zero_bubble_h1_idles_a_third_of_1f1b_with_its_memory() -> None:
    model, dims = preset("megatron-175b"), ParallelDims(64, pp=8, tp=8, dp_shard=1)
    a100, hosts = hardware("a100"), Topology(8, 8)
    m = micro_batches(model, dims)
    for recompute, part in (("none", 1 / 3), ("selective", 1 / 3), ("full", 1 / 2)):
        plain = Options(recompute=recompute)
        zb = attrs.evolve(plain, pipeline_schedule="zb-h1")
        one, zero = step_time(model, plain, dims, a100, hosts), step_time(model, zb, dims, a100, hosts)
        ideal = one.compute - one.bubble
        assert one.bubble == pytest.approx(ideal * 7 / m)
        assert zero.bubble == pytest.approx(ideal * 7 / m * part)
        assert memory(model, zb, dims) == memory(model, plain, dims)
    with pytest.raises(ValueError, match="expected pipeline_interleave 1 with the zb-h1 schedule"):
        Options(pipeline_schedule="zb-h1", pipeline_interleave=2)


def test_the_interleaved_first_stage_holds_more_micro_batches() -> None:
    model, dims = preset("megatron-175b"), ParallelDims(64, pp=8, tp=8, dp_shard=1)
    plain, interleaved = Options(recompute="selective"), Options(recompute="selective", pipeline_interleave=2)
    layer = layer_activation_bytes(model, plain, tp=8)
    layers = model.layers // 8
    assert micro_batches(model, dims) >= 8
    assert memory(model, plain, dims).activations == layers * 8 * layer
    # Korthikanti et al. 2022, 4.2.3: pp (1 + (pp - 1) / (pp v)) micro-batches of the stage's layers
    assert memory(model, interleaved, dims).activations == pytest.approx(layers * 8 * (1 + 7 / 16) * layer)


def test_megatrons_scatter_gather_sends_a_tp_th_of_the_activations_and_gathers_them() -> None:
    model, dims = preset("megatron-530b"), ParallelDims(280, pp=35, tp=8, dp_shard=1)
    plain = Options(recompute="full", sequence_parallel=False, pipeline_interleave=3)
    split = attrs.evolve(plain, pipeline_scatter_gather=True)
    m = micro_batches(model, dims)
    activation = model.micro_batch * model.seq_len * model.hidden * 2
    assert _by(traffic(model, plain, dims), "pp", "send") == (2 * m * 3, 2 * m * 3 * activation)
    assert _by(traffic(model, split, dims), "pp", "send") == (2 * m * 3, 2 * m * 3 * activation // 8)
    gathers = [t for t in traffic(model, split, dims) if t.purpose == "pipeline scatter/gather"]
    assert [(t.axis, t.collective, t.calls, t.nbytes) for t in gathers] == [
        ("tp", "all_gather", 2 * m * 3, 2 * m * 3 * activation)]
    a100, hosts = hardware("a100"), Topology(35, 8)
    assert step_time(model, split, dims, a100, hosts).total < step_time(model, plain, dims, a100, hosts).total
    with_sp = attrs.evolve(split, sequence_parallel=True)  # sequence parallelism splits them already
    assert traffic(model, with_sp, dims) == traffic(model, attrs.evolve(with_sp, pipeline_scatter_gather=False), dims)


def test_the_changes_worth_trying_include_zero_stages_and_the_zero_bubble_schedule() -> None:
    from fmesh.plan.search import alternatives

    changes = dict(alternatives(LLAMA, Options(), ParallelDims(64, dp_shard=8, tp=8), 8, H100))
    fsdp = step_time(LLAMA, Options(recompute="none"), ParallelDims(64, dp_shard=8, tp=8), H100, Topology(8, 8))
    zero1 = step_time(LLAMA, Options(recompute="none", zero=1), ParallelDims(64, dp_shard=8, tp=8), H100,
                      Topology(8, 8))
    assert changes["ZeRO-1 instead of FSDP (ZeRO-3)"] == pytest.approx(zero1.total / fsdp.total - 1)
    piped = dict(alternatives(LLAMA, Options(), ParallelDims(64, tp=4, pp=2), 8, H100))
    assert piped["pipeline schedule zb-h1 instead of 1f1b"] < 0
    assert not any("zb-h1" in text for text, _ in alternatives(LLAMA, Options(pipeline_schedule="zb-h1"),
                                                               ParallelDims(64, tp=4, pp=2), 8, H100))


def test_the_new_options_are_flags_and_the_search_uses_them() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", "--model", "llama3-8b", "--world-size", "64", "--gpus-per-node", "8", "--tp", "8",
                 "--zero", "1", "--fp8", "--pipeline-schedule", "zb-h1", "--pipeline-scatter-gather"],
                stdout=out, stderr=err) == 0, err.getvalue()
    text = out.getvalue()
    assert "ZeRO-1 weights" in text and "in FP8" in text and "zero-bubble ZB-H1" in text
    err = io.StringIO()
    assert main(["plan", "--model", "llama3-8b", "--world-size", "8", "--gpus-per-node", "8", "--fp8",
                 "--hardware", "a100"], stdout=io.StringIO(), stderr=err) == 2
    assert "expected --hardware with FP8 tensor cores" in err.getvalue()
    best = search(LLAMA, Options(fp8=True), 64, 8, H100, top=1)[0]
    assert "in FP8" in " ".join(best.time.assumptions)
    assert best.time.total < search(LLAMA, Options(), 64, 8, H100, top=1)[0].time.total
