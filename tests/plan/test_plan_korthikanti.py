"""Memory and step time against Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), with that paper's configurations (Table 3) on A100s.

* Table 2's activation memory per layer, row by row, exactly;
* Figure 1's quantities (weights + optimizer state, activations per GPU, with tensor parallelism alone and with
  sequence parallelism + selective recomputation) within 5% of the paper's closed forms that produce them
  (``18`` bytes per parameter for the first stage's ``L/p`` layers of ``12h^2`` weights and its ``vh``
  embedding split over ``t``; ``L`` layers of activations in flight on the first stage of a 1F1B pipeline);
* Table 5's measured step times within 15%, at one stated compute efficiency for all eight runs.
"""

from __future__ import annotations

import attrs
import pytest
from paths import ROOT

from fmesh.plan.hardware import hardware
from fmesh.plan.memory import layer_activation_bytes, memory
from fmesh.plan.model import Options, preset
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.step import step_time
from fmesh.plan.topology import Topology

# Table 3: GPUs and pipeline degree (t = 8 for all); the models' sizes are the presets (h, a, L, global batch).
RUNS = {"megatron-22b": (8, 1), "megatron-175b": (64, 8), "megatron-530b": (280, 35), "megatron-1t": (512, 64)}
# Table 5: seconds per iteration.
FULL_RECOMPUTE = {"megatron-22b": 1.42, "megatron-175b": 18.13, "megatron-530b": 49.05, "megatron-1t": 94.42}
SP_SELECTIVE = {"megatron-22b": 1.10, "megatron-175b": 13.75, "megatron-530b": 37.83, "megatron-1t": 71.49}
EFFICIENCY = 0.63  # the one fitted figure: the fraction of 312 TFLOP/s the matrix multiplies reach
GPT = Options(flash_attention=False, dropout=True, efficiency=EFFICIENCY)
TP_ONLY = attrs.evolve(GPT, recompute="none", sequence_parallel=False)
PRESENT = attrs.evolve(GPT, recompute="selective", sequence_parallel=True)


def dims_of(name: str) -> ParallelDims:
    gpus, pp = RUNS[name]
    return ParallelDims(gpus, pp=pp, tp=8, dp_shard=1)


@pytest.mark.parametrize("name", list(RUNS))
def test_table_2_rows(name: str) -> None:
    model = preset(name)
    s, b, h, a, t = model.seq_len, model.micro_batch, model.hidden, model.heads, 8
    sbh, scores = s * b * h, 5 * a * s * s * b
    none = attrs.evolve(GPT, recompute="none", sequence_parallel=False)
    assert layer_activation_bytes(model, none) == 34 * sbh + scores
    assert layer_activation_bytes(model, none, tp=t) == 10 * sbh + (24 * sbh + scores) // t
    sp = attrs.evolve(none, sequence_parallel=True)
    assert layer_activation_bytes(model, sp, tp=t) == (34 * sbh + scores) // t
    assert layer_activation_bytes(model, attrs.evolve(sp, recompute="selective"), tp=t) == 34 * sbh // t
    assert layer_activation_bytes(model, attrs.evolve(none, recompute="selective"), tp=t) == (10 + 24 // t) * sbh
    assert layer_activation_bytes(model, attrs.evolve(none, recompute="full"), tp=t) == 2 * sbh


def paper_weights_and_optimizer(name: str) -> float:
    model = preset(name)
    _, pp = RUNS[name]
    h, v, layers = model.hidden, model.vocab, model.layers
    return 18 * (layers / pp * 12 * h * h + v * h) / 8


def paper_activations(name: str, present: bool) -> float:
    model = preset(name)
    s, b, h, a, t, layers = model.seq_len, model.micro_batch, model.hidden, model.heads, 8, model.layers
    per_layer = s * b * h * 34 / t if present else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    return per_layer * layers


@pytest.mark.parametrize("name", list(RUNS))
def test_figure_1_memory_within_5_percent(name: str) -> None:
    for options, present in ((TP_ONLY, False), (PRESENT, True)):
        used = memory(preset(name), options, dims_of(name))
        assert used.weights + used.gradients + used.optimizer == pytest.approx(
            paper_weights_and_optimizer(name), rel=0.05)
        assert used.activations == pytest.approx(paper_activations(name, present), rel=0.05)
    baseline = memory(preset(name), TP_ONLY, dims_of(name)).activations
    assert baseline / memory(preset(name), PRESENT, dims_of(name)).activations > 4  # "reduces ... by 5x"


@pytest.mark.parametrize("name", list(RUNS))
def test_table_5_step_times_within_15_percent(name: str) -> None:
    gpus, _ = RUNS[name]
    topology, a100 = Topology(gpus // 8, 8), hardware("a100")
    full = step_time(preset(name), attrs.evolve(GPT, recompute="full", sequence_parallel=False), dims_of(name),
                     a100, topology)
    present = step_time(preset(name), PRESENT, dims_of(name), a100, topology)
    assert full.total == pytest.approx(FULL_RECOMPUTE[name], rel=0.15)
    assert present.total == pytest.approx(SP_SELECTIVE[name], rel=0.15)
    assert present.total < full.total


def docs_rows() -> dict[str, list[str]]:
    """The table of docs/guides/planning.md, by model: its cells after the first."""
    text = (ROOT / "docs" / "guides" / "planning.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("22B", "175B", "530B", "1T"):
            rows[f"megatron-{cells[0].lower()}"] = cells[1:]
    return rows


@pytest.mark.parametrize("name", list(RUNS))
def test_the_docs_table_is_what_the_code_computes(name: str) -> None:
    gpus, _ = RUNS[name]
    topology, a100, dims = Topology(gpus // 8, 8), hardware("a100"), dims_of(name)
    tp_only, present = memory(preset(name), TP_ONLY, dims), memory(preset(name), PRESENT, dims)
    full = step_time(preset(name), attrs.evolve(GPT, recompute="full", sequence_parallel=False), dims, a100,
                     topology).total
    fast = step_time(preset(name), PRESENT, dims, a100, topology).total
    expected = [
        f"{(tp_only.weights + tp_only.gradients + tp_only.optimizer) / 1e9:.1f} GB",
        f"{tp_only.activations / 1e9:.1f} GB",
        f"{present.activations / 1e9:.1f} GB",
        f"{full:.2f} s ({FULL_RECOMPUTE[name]:.2f} s, {full / FULL_RECOMPUTE[name] - 1:+.1%})",
        f"{fast:.2f} s ({SP_SELECTIVE[name]:.2f} s, {fast / SP_SELECTIVE[name] - 1:+.1%})",
    ]
    assert docs_rows()[name] == expected
