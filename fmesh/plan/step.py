"""Time per training step, from the model's FLOPs and its bytes per axis: :func:`step_time`.

**Compute.** The FLOPs of a step are counted as Narayanan et al. 2021 count them (a multiply-add is 2 FLOPs;
the attention scores ``QK^T`` and their product with ``V`` are ``4·s·h`` per token per layer), except that with
FlashAttention (``Options.flash_attention``) the causal mask halves the attention's (``2·s·h``): its kernels
skip the blocks above the diagonal, where the unfused attention of Megatron-LM 2021-22 computes every score and
masks it after. One forward pass is ``tokens · (layers · (2 · active layer parameters + a · s · h) + 2 · v · h)``
(``a`` = 4, or 2 with FlashAttention),
and a step runs 3 of them (forward, and backward at twice the forward), plus the recomputation: a forward of
the attention scores with selective recomputation, a whole forward with full recomputation. Every GPU does an
equal share at ``efficiency`` times the GPU's peak (the layers' linear layers at its FP8 peak with
``Options.fp8``), and a 1F1B pipeline of ``pp`` stages and ``m`` micro-batches idles ``(pp - 1) / m`` of it (the
bubble; :func:`bubble_fraction` for the interleaved and zero-bubble schedules).

**The optimizer step** reads and writes every parameter's Adam state once, at the GPU's memory bandwidth:
``2 · (param_bytes + master_bytes + moment_bytes) + grad_bytes`` bytes per parameter the GPU owns.

**Communication** (:mod:`fmesh.plan.traffic` for the bytes, :func:`fmesh.plan.costs.estimate_span` for the time
of each call on the job's hosts): tensor, context and expert parallelism and the pipeline's sends sit on the
critical path of every micro-batch (not overlapped, as in Megatron-LM of 2022), so they count in full and pay
the bubble too; FSDP's gathers and reductions, HSDP's and the loss's all_reduce run beside the compute (FSDP2
prefetches), so only what exceeds the compute counts.

>>> from fmesh.plan.hardware import hardware
>>> from fmesh.plan.model import Options, preset
>>> from fmesh.plan.parallel import ParallelDims
>>> from fmesh.plan.topology import Topology
>>> t = step_time(preset("llama3-8b"), Options(recompute="selective"), ParallelDims(64, dp_shard=8, tp=8),
...               hardware("h100"), Topology(8, 8))
>>> round(t.total, 2), round(t.compute, 2)
(24.01, 14.21)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

import attrs

from fmesh.plan.costs import estimate_span
from fmesh.plan.hardware import Hardware
from fmesh.plan.memory import micro_batches, owned_parameters
from fmesh.plan.model import Model, Options, active_parameter_count, layer_weights
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.topology import AxisSpan, Topology
from fmesh.plan.traffic import Transfer, traffic

__all__ = ["CRITICAL_AXES", "AxisTime", "StepTime", "axis_spans", "bubble_fraction", "compute_efficiency",
           "compute_seconds", "elementwise_seconds", "flops_parts",
           "step_flops", "step_time", "transfer_seconds"]

CRITICAL_AXES: tuple[str, ...] = ("tp", "cp", "ep", "pp")
"""Axes whose collectives wait on the critical path of every micro-batch; the others overlap the compute."""


@attrs.frozen
class AxisTime:
    """Seconds per step of one (axis, collective): ``seconds`` in all, ``exposed`` of them not hidden."""

    axis: str
    collective: str
    seconds: float
    critical: bool


@attrs.frozen
class StepTime:
    """A step's estimated seconds: ``compute`` (the bubble included), the collectives' time, what is exposed,
    and the assumptions it rests on (printed by the command line).

    >>> StepTime(2.0, 0.25, 0.0, (AxisTime("tp", "all_reduce", 0.5, True),), 0.5, 0.0, ()).total
    2.5
    """

    compute: float
    bubble: float
    optimizer: float
    collectives: tuple[AxisTime, ...]
    exposed_critical: float
    exposed_overlapped: float
    assumptions: tuple[str, ...]

    @property
    def total(self) -> float:
        """Compute plus the communication that is not hidden.

        >>> StepTime(1.0, 0.0, 0.5, (), 0.25, 0.25, ()).total
        2.0
        """
        return self.compute + self.optimizer + self.exposed_critical + self.exposed_overlapped


def flops_parts(model: Model, options: Options) -> tuple[float, float]:
    """:func:`step_flops` in two: the layers' linear layers' (what ``Options.fp8`` runs in FP8), and the rest
    (the attention scores and the output layer).

    >>> from fmesh.plan.model import preset
    >>> linear, rest = flops_parts(preset("megatron-22b"), Options(recompute="none"))
    >>> round(linear / 1e15, 3), round(rest / 1e15, 3)
    (1.069, 0.045)
    """
    tokens = model.global_batch * model.seq_len
    layer_matmuls, castable = _layer_matmuls(model)
    scores = (2 if options.flash_attention else 4) * model.seq_len * model.hidden  # causal blocks skipped
    forwards = 4 if options.mode == "full" else 3  # forward, backward (twice), and the recomputed forward
    linear = forwards * tokens * model.layers * 2.0 * castable
    rest = forwards * tokens * model.layers * 2.0 * (layer_matmuls - castable)  # norms, biases, the router
    rest += (3.0 if options.mode == "none" else 4.0) * tokens * model.layers * scores
    return linear, rest + 3.0 * tokens * 2 * model.vocab * model.hidden


@functools.lru_cache(maxsize=256)
def _layer_matmuls(model: Model) -> tuple[int, int]:
    """The weights one token multiplies by per layer (``top_k`` experts of a MoE layer), and those of them
    :attr:`Weight.fp8` marks: per model, remembered (the search costs one model's layouts by the thousand)."""
    layer_matmuls = (active_parameter_count(model) - model.vocab * model.hidden) // model.layers
    castable = sum(w.numel * (model.top_k if w.expert else 1) for w in layer_weights(model) if w.fp8)
    return layer_matmuls, castable


def step_flops(model: Model, options: Options) -> float:
    """FLOPs of one step, the whole job, the recomputation included (module docstring).

    >>> from fmesh.plan.model import preset
    >>> round(step_flops(preset("megatron-22b"), Options(recompute="full", flash_attention=False)) / 1e15, 3)
    1.52
    >>> round(step_flops(preset("megatron-22b"), Options(recompute="full")) / 1e15, 3)  # causal FlashAttention
    1.48
    """
    return sum(flops_parts(model, options))


def axis_spans(dims: ParallelDims, topology: Topology, axes: Iterable[str]) -> dict[str, AxisSpan]:
    """How the groups along each of ``axes`` (mesh names of ``dims``) sit on ``topology``'s hosts: what
    :func:`transfer_seconds` costs a transfer on. The search computes them once per layout and rank order.

    >>> axis_spans(ParallelDims(16, tp=8), Topology(2, 8), ["tp"])["tp"].intra_host
    True
    """
    return {axis: topology.span(dims.mesh(axis), axis) for axis in axes}


def compute_efficiency(model: Model, options: Options, dims: ParallelDims) -> float:
    """The fraction of peak FLOP/s the matrix multiplies reach: ``options.efficiency``, times
    ``w / (w + options.efficiency_half_width)`` for the width ``w = hidden / tp`` each GPU multiplies (narrow
    multiplies keep the tensor cores less busy; Narayanan et al. 2021 see the same model throughput rise with
    the width per GPU).

    >>> from fmesh.plan.model import preset
    >>> compute_efficiency(preset("megatron-22b"), Options(efficiency=0.6), ParallelDims(8, tp=8))
    0.6
    >>> round(compute_efficiency(preset("megatron-22b"), Options(efficiency=0.6, efficiency_half_width=256),
    ...                          ParallelDims(8, tp=8)), 6)
    0.45
    """
    width = model.hidden / dims.tp
    return options.efficiency * width / (width + options.efficiency_half_width)


def bubble_fraction(options: Options, pp: int, m: int) -> float:
    """The pipeline's idle time as a fraction of the compute: ``(pp - 1) / (v m)`` for 1F1B over ``v`` chunks per
    rank; for ZB-H1 (Qi et al. 2023) ``(pp - 1) / m`` times ``(F + B - W) / (F + B + W)``, with a forward ``F``,
    the backward's input gradients ``B`` and its weight gradients ``W`` costing 1 each (a matmul's two backward
    products), and ``B`` one more with full recomputation (the recomputed forward precedes it): a third of 1F1B's
    bubble, or a half with full recomputation.

    >>> bubble_fraction(Options(recompute="none"), 8, 64), bubble_fraction(Options(recompute="none",
    ...                                                                             pipeline_schedule="zb-h1"), 8, 64)
    (0.109375, 0.036458333333333336)
    """
    if pp == 1:
        return 0.0
    if options.pipeline_schedule == "zb-h1":
        backward_input = 2.0 if options.mode == "full" else 1.0
        return (pp - 1) / m * backward_input / (backward_input + 2.0)
    return (pp - 1) / (options.pipeline_interleave * m)


def _compute(model: Model, options: Options, dims: ParallelDims, hardware: Hardware) -> tuple[float, float]:
    """The compute's seconds without the bubble, and the factor the bubble multiplies it (and the critical
    collectives) by."""
    m = micro_batches(model, dims)
    bubble_factor = 1 + bubble_fraction(options, dims.pp, m)
    linear, rest = flops_parts(model, options)
    peak = dims.world_size * hardware.flops * compute_efficiency(model, options, dims)
    if options.fp8:
        if not hardware.fp8_flops:
            raise ValueError(f"expected hardware with FP8 tensor cores for fp8, but got {hardware.name} (no FP8 "
                             "peak); choose h100, h200 or b200, or leave fp8 off")
        linear *= hardware.flops / hardware.fp8_flops  # the same fraction of the FP8 peak
    ideal = (linear + rest) / peak + elementwise_seconds(model, options, dims, hardware)
    return ideal, bubble_factor


def compute_seconds(model: Model, options: Options, dims: ParallelDims, hardware: Hardware) -> float:
    """:attr:`StepTime.compute` alone (the bubble included), without placing a group on a host: a lower bound of
    the step time, which the search ranks by before it costs the collectives.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> from fmesh.plan.topology import Topology
    >>> m, o, d = preset("llama3-8b"), Options(recompute="none"), ParallelDims(16, pp=2, tp=8)
    >>> compute_seconds(m, o, d, hardware("h100")) == step_time(m, o, d, hardware("h100"), Topology(2, 8)).compute
    True
    """
    ideal, bubble_factor = _compute(model, options, dims, hardware)
    return ideal * bubble_factor


def elementwise_seconds(model: Model, options: Options, dims: ParallelDims, hardware: Hardware) -> float:
    """Seconds of the operations that are not matrix multiplies, which memory bandwidth bounds: every token
    passes ``options.elementwise_bytes`` bytes per hidden unit per layer through memory in each pass over the
    layers, counted as the FLOPs are: the forward one pass, the backward two, and full recomputation's second
    forward one more (3 passes, or 4 with full recomputation: the recomputed forward re-runs its norms,
    activations and dropout), the work spread over every GPU as the FLOPs are.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> m, dims, a100 = preset("megatron-22b"), ParallelDims(8, tp=8), hardware("a100")
    >>> elementwise_seconds(m, Options(), dims, a100)
    0.0
    >>> round(elementwise_seconds(m, Options(recompute="none", elementwise_bytes=100), dims, a100), 4)
    0.0444
    >>> round(elementwise_seconds(m, Options(recompute="full", elementwise_bytes=100), dims, a100), 4)
    0.0592
    """
    if not options.elementwise_bytes:
        return 0.0
    tokens = model.global_batch * model.seq_len
    passes = 4 if options.mode == "full" else 3
    return passes * tokens * model.layers * model.hidden * options.elementwise_bytes / (
        dims.world_size * hardware.memory_bandwidth)


def transfer_seconds(transfer: Transfer, dims: ParallelDims, topology: Topology, hardware: Hardware,
                     span: AxisSpan | None = None) -> float:
    """Seconds one rank spends in ``transfer``'s calls: each call costed on the hosts its group spans (``span``,
    when the caller has it already: :func:`axis_spans`).

    >>> from fmesh.plan.hardware import hardware
    >>> dims = ParallelDims(16, tp=8)
    >>> round(transfer_seconds(Transfer("tp", "all_reduce", 10, 10 * 2**26, ""), dims, Topology(2, 8),
    ...                        hardware("h100")), 5)
    0.00317
    """
    if transfer.calls == 0:
        return 0.0
    if span is None:
        span = topology.span(dims.mesh(transfer.axis), transfer.axis)
    return transfer.calls * estimate_span(transfer.collective, transfer.per_call, span, hardware.links).seconds


def _schedule(options: Options) -> str:
    v = options.pipeline_interleave
    if options.pipeline_schedule == "zb-h1":
        return "zero-bubble ZB-H1"
    return "1F1B" if v == 1 else f"interleaved 1F1B ({v} chunks per rank)"


def _assumptions(model: Model, options: Options, dims: ParallelDims, hardware: Hardware) -> tuple[str, ...]:
    narrow = (f" ({options.efficiency:.0%} x w / (w + {options.efficiency_half_width:g}) at the width per GPU "
              f"w = {model.hidden // dims.tp})" if options.efficiency_half_width else "")
    overlap = ("FSDP/HSDP/loss collectives overlap the compute (only their excess counts)"
               if options.overlap_data_parallel else "FSDP/HSDP/loss collectives after the backward, in full")
    fp8 = (f"; the layers' linear layers in FP8 at the same fraction of {hardware.fp8_flops / 1e12:.0f} TFLOP/s"
           if options.fp8 else "")
    zero = "" if options.zero == 3 else f"; ZeRO-{options.zero} over the data-parallel shards (weights whole)"
    return (
        f"compute at {compute_efficiency(model, options, dims):.0%}{narrow} of {hardware.flops / 1e12:.0f} "
        f"TFLOP/s per GPU ({hardware.name}){fp8}",
        f"tp/cp/ep/pp collectives on the critical path, not overlapped; {overlap}",
        f"collectives at NCCL's ring/tree model on {options.link_efficiency:.0%} of peak link bandwidth "
        "(fmesh.plan.costs)",
        f"{_schedule(options)} pipeline; activation recomputation: {options.mode}",
        f"non-matmul operations: {options.elementwise_bytes:g} bytes per token per hidden unit per layer per pass "
        f"(3 passes a step, 4 with full recomputation) at {hardware.memory_bandwidth / 1e12:.2f} TB/s",
        f"sequence parallelism {'on' if options.sequence_parallel else 'off'} (with tp > 1); FlashAttention "
        f"{'on' if options.flash_attention else 'off'}; dropout {'on' if options.dropout else 'off'}; per parameter "
        f"{options.param_bytes} B weights, {options.grad_bytes} B gradients, {options.master_bytes} + "
        f"{options.moment_bytes} B optimizer state (master copy + moments){zero}",
    )


def step_time(model: Model, options: Options, dims: ParallelDims, hardware: Hardware, topology: Topology,
              moved: Sequence[Transfer] | None = None, spans: Mapping[str, AxisSpan] | None = None) -> StepTime:
    """The step's estimated time (module docstring); ``moved`` is :func:`~fmesh.plan.traffic.traffic`'s answer
    and ``spans`` :func:`axis_spans`' (for every axis that moves bytes) when the caller has them already.
    """
    ideal, bubble_factor = _compute(model, options, dims, hardware)
    if options.link_efficiency != 1:
        links = hardware.links
        hardware = attrs.evolve(hardware, links=attrs.evolve(
            links, intra_bandwidth=links.intra_bandwidth * options.link_efficiency,
            inter_bandwidth=links.inter_bandwidth * options.link_efficiency))
    compute = ideal * bubble_factor
    transfers = traffic(model, options, dims) if moved is None else moved
    if spans is None:
        spans = axis_spans(dims, topology, {t.axis for t in transfers})
    times = tuple(
        AxisTime(t.axis, t.collective, transfer_seconds(t, dims, topology, hardware, spans[t.axis]),
                 t.axis in CRITICAL_AXES)
        for t in transfers
    )
    critical = sum(t.seconds for t in times if t.critical) * bubble_factor
    overlapped = sum(t.seconds for t in times if not t.critical)
    if not options.overlap_data_parallel:  # after the backward, in full
        critical, overlapped = critical + overlapped, 0.0
    touched = 2 * (options.param_bytes + options.master_bytes + options.moment_bytes) + options.grad_bytes
    optimizer = owned_parameters(model, dims) * touched / hardware.memory_bandwidth
    return StepTime(compute, compute - ideal, optimizer, times, critical, max(0.0, overlapped - compute),
                    _assumptions(model, options, dims, hardware))
