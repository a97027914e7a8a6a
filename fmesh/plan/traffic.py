"""Bytes per training step along each mesh axis, by collective: :func:`traffic`.

One :class:`Transfer` per (axis, collective, purpose): how many calls one rank makes per step and the bytes
they move in all, counted as nccl-tests and :mod:`fmesh.plan.costs` count them (the whole buffer of an
``all_reduce``, the *output* of an ``all_gather``, the *input* of a ``reduce_scatter``, the send buffer of an
``all_to_all``, the message of a ``send``). Axes are the meshes of :class:`~fmesh.ParallelDims` (``tp``,
``dp_shard_cp``, ``dp_replicate``, ``dp``, ``cp``, ``pp``, ``ep``, ``efsdp``); an axis of size 1 moves nothing.

The recipe is torchtitan's, which ``examples/train.py`` follows (``tests/plan/test_plan_bytes.py`` records
every collective of that script and finds these bytes exactly), per micro-batch of ``T = micro_batch *
seq_len / cp`` tokens and activation width ``w`` bytes:

* **FSDP2** (``fully_shard`` per layer and once at the root, over ``dp_shard_cp``; experts over ``efsdp``):
  each weight is split along its first dimension into ``F`` padded shards of ``ceil(rows / F)`` rows, so a
  unit's ``all_gather`` output is the sum of ``ceil(rows / F) * F * rest`` elements of ``param_bytes``. Without a
  pipeline a layer is gathered twice per micro-batch (forward, and again for backward: resharded after
  forward), the root once; every unit's gradients are ``reduce_scatter``-ed once per micro-batch in
  ``grad_bytes`` (once per step with ``Options.gradient_sync == "step"``). With a pipeline (``pp > 1``) every
  unit is gathered once per step and its gradients reduced once per step, as torch's pipeline schedules run
  FSDP2 (torchtitan: no reshard after forward; the schedule turns off the reshard after backward and the
  gradient sync until the last micro-batch): the stage's weights and gradients stay unsharded meanwhile
  (:func:`fmesh.plan.memory.memory` counts them). With HSDP the reduced shard is then ``all_reduce``-d over
  ``dp_replicate`` as often; with ``F == 1`` only that ``all_reduce`` is left (Megatron-LM's data parallelism).
  With ``Options.fp8`` the linear weights are gathered in FP8 (1 byte each).
* **ZeRO-1 and ZeRO-2** (``Options.zero``; Megatron-LM's distributed optimizer, DeepSpeed): the same padded
  shards, but the weights stay whole on every rank: each unit's updated weights are all-gathered once per step
  (``param_bytes``), its gradients reduce-scattered once per step (ZeRO-1: accumulated whole) or after every
  micro-batch's backward (ZeRO-2: only the shard is kept); with HSDP the shard is ``all_reduce``-d as often.
* **Tensor parallelism** (Megatron's column- then row-parallel pairs, DTensor's ``ColwiseParallel`` and
  ``RowwiseParallel``): without sequence parallelism, an ``all_reduce`` of ``T * h * w`` bytes after each
  row-parallel linear in the forward (two per layer), and in the backward one per column-parallel input
  (one for fused q/k/v, three for separate q, k, v; one more for a gate projection); with sequence parallelism,
  an ``all_gather`` before each column-parallel pair and a ``reduce_scatter`` after each row-parallel one, twice
  each in forward and backward; where the layers meet the embedding and the output layer, one ``all_gather``
  each (and one ``reduce_scatter`` each when the vocabulary is split over ``tp``) per micro-batch; the norms'
  weight gradients summed over ``tp`` once per step (one ``all_reduce``), or, under FSDP, one ``all_reduce`` per
  norm parameter each time FSDP reduces the gradients (FSDP2 sums a DTensor's partial gradient before its
  reduce-scatter). Full recomputation repeats the forward's
  collectives (the layers', not the edges').
* **Context parallelism**: each layer all-gathers its keys and values over ``cp`` in the forward
  (``2 * T * cp * kv_dim / tp`` elements out) and reduce-scatters their gradients in the backward.
* **Pipeline parallelism**: a stage sends ``T * h / (tp if SP)`` activations forward and as many gradients back
  per micro-batch and model chunk (``Options.pipeline_interleave``; a middle stage's count); with
  ``Options.pipeline_scatter_gather`` (and no SP) it sends ``T * h / tp`` and the receiver all-gathers the whole
  over ``tp`` (one ``all_gather`` per message).
* **Expert parallelism**: four ``all_to_all`` per MoE layer per micro-batch (dispatch and combine, forward and
  backward) of ``T * top_k * h * w`` bytes.
* **The loss**: one fp32 scalar ``all_reduce`` over ``dp`` per step.

>>> from fmesh.plan.model import Options, preset
>>> from fmesh.plan.parallel import ParallelDims
>>> moved = traffic(preset("llama3-8b"), Options(recompute="none"), ParallelDims(64, dp_shard=8, tp=8))
>>> sorted({(t.axis, t.collective) for t in moved})[:3]
[('dp', 'all_reduce'), ('dp_shard_cp', 'all_gather'), ('dp_shard_cp', 'reduce_scatter')]
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from fmesh.plan.costs import Collective
from fmesh.plan.memory import micro_batches
from fmesh.plan.model import Model, Options, Weight, first_stage_weights, layer_weights, outer_weights
from fmesh.plan.parallel import ParallelDims

__all__ = ["Transfer", "bytes_by_axis", "fsdp_gather_elements", "gathered_bytes", "traffic"]


@attrs.frozen
class Transfer:
    """``calls`` collectives of one kind along ``axis`` per step, ``nbytes`` in all (one rank's count), and
    what they are for.

    >>> Transfer("tp", "all_reduce", 4, 1024, "tensor parallel").per_call
    256
    """

    axis: str
    collective: Collective
    calls: int
    nbytes: int
    purpose: str

    @property
    def per_call(self) -> int:
        """Bytes of one call (``nbytes // calls``).

        >>> Transfer("dp", "all_reduce", 1, 4, "loss").per_call
        4
        """
        return self.nbytes // self.calls if self.calls else 0


def fsdp_gather_elements(weights: Iterable[Weight], tp: int, shards: int) -> int:
    """Elements of one FSDP2 ``all_gather`` output for ``weights``: each split into ``shards`` padded
    dim-0 shards of its tensor-parallel local tensor.

    >>> fsdp_gather_elements([Weight("norm", (63,)), Weight("q", (64, 64), tp_dim=0)], tp=2, shards=2)
    2112
    """
    total = 0
    for weight in weights:
        shape = weight.local_shape(tp)
        rest = 1
        for n in shape[1:]:
            rest *= n
        total += -(-shape[0] // shards) * shards * rest
    return total


def _tp_inputs(model: Model) -> int:
    """Column-parallel linears that read the same input separately (their backward reduces each)."""
    return (1 if model.fused_qkv else 3) + (2 if model.gated_mlp and not model.experts else 1)


def _add(found: dict[tuple[str, Collective, str], list[int]], axis: str, collective: Collective, purpose: str,
         calls: int, nbytes: int) -> None:
    entry = found.setdefault((axis, collective, purpose), [0, 0])
    entry[0] += calls
    entry[1] += nbytes


def _fsdp_reduces(options: Options, dims: ParallelDims, m: int) -> int:
    """How often FSDP reduces each unit's gradients per step: once with a pipeline or the sync held to the last
    micro-batch, else after every micro-batch's backward."""
    return 1 if dims.pp > 1 or options.gradient_sync == "step" else m


def gathered_bytes(weights: Iterable[Weight], options: Options, tp: int, shards: int) -> int:
    """Bytes of one FSDP2 ``all_gather`` output for ``weights`` (:func:`fsdp_gather_elements`): ``param_bytes``
    each, or 1 for a linear weight with ``options.fp8`` (the float8 all-gather).

    >>> w = [Weight("norm", (64,)), Weight("up.weight", (64, 64), tp_dim=0)]
    >>> gathered_bytes(w, Options(recompute="none"), 1, 2), gathered_bytes(w, Options(recompute="none", fp8=True), 1, 2)
    (8320, 4224)
    """
    weights = list(weights)
    low = [w for w in weights if options.fp8 and w.fp8]
    rest = [w for w in weights if not (options.fp8 and w.fp8)]
    return fsdp_gather_elements(low, tp, shards) + fsdp_gather_elements(rest, tp, shards) * options.param_bytes


def _fsdp(found: dict[tuple[str, Collective, str], list[int]], model: Model, options: Options, dims: ParallelDims,
          m: int, layers: int) -> None:
    """FSDP's (ZeRO-3's) gathers and reductions, or ZeRO-1/2's (``options.zero``): the module docstring."""
    dense = [w for w in layer_weights(model) if not w.expert]
    expert = [w for w in layer_weights(model) if w.expert]
    experts_here = model.experts // dims.ep if model.experts else 0
    root = list(first_stage_weights(model, dims.pp))
    if options.zero == 3:
        layer_gathers, root_gathers = (1, 1) if dims.pp > 1 else (2 * m, m)
        reduces = _fsdp_reduces(options, dims, m)
        gathering, reducing = "FSDP weights", "FSDP gradients"
    else:  # the updated weights once per step; the gradients once (ZeRO-1) or after every backward (ZeRO-2)
        layer_gathers = root_gathers = 1
        reduces = 1 if options.zero == 1 else m
        gathering, reducing = f"ZeRO-{options.zero} weights", f"ZeRO-{options.zero} gradients"
    units = [("dp_shard_cp", dims.dp_shard * dims.cp, dims.tp, dense, layer_gathers, layers),
             ("dp_shard_cp", dims.dp_shard * dims.cp, dims.tp, root, root_gathers, 1),
             ("efsdp", dims.efsdp, dims.etp, expert * experts_here, layer_gathers, layers)]
    for axis, shards, tp, weights, gathers, count in units:
        if not weights or dims.dp_shard * dims.cp * dims.dp_replicate == 1:
            continue
        elements = fsdp_gather_elements(weights, tp, shards)
        if shards > 1:
            gathered = gathered_bytes(weights, options, tp, shards) if options.zero == 3 else (
                elements * options.param_bytes)
            _add(found, axis, "all_gather", gathering, gathers * count, gathers * count * gathered)
            _add(found, axis, "reduce_scatter", reducing, reduces * count,
                 reduces * count * elements * options.grad_bytes)
        if dims.dp_replicate > 1:
            _add(found, "dp_replicate", "all_reduce", "HSDP gradients", reduces * count,
                 reduces * count * elements // shards * options.grad_bytes)


def _sequence_parallel_edges(found: dict[tuple[str, Collective, str], list[int]], model: Model, options: Options,
                             dims: ParallelDims, m: int, layers: int, activation: int) -> None:
    """Sequence parallelism where the layers meet the rest of the model, and the norms' gradients: the
    embedding's output is split along the sequence (a reduce_scatter when the vocabulary is split over tp, else
    a slice) and its gradient gathered; on the stage with the output layer, its input is gathered and, with the
    vocabulary split, its gradient reduce-scattered; the norms' weight gradients, computed from a part of the
    sequence, are summed over tp once per step in one all_reduce (Megatron-LM's, after the backward)."""
    head = 1 if dims.pp == 1 else 0  # the first stage holds the output layer only without a pipeline
    _add(found, "tp", "all_gather", "sequence parallel: embedding and output layer", m * (1 + head),
         m * (1 + head) * activation)
    if model.vocab_parallel:
        _add(found, "tp", "reduce_scatter", "sequence parallel: embedding and output layer", m * (1 + head),
             m * (1 + head) * activation)
    weights = [w for w in layer_weights(model) if w.name.startswith("norm")] * layers
    weights += [w for w in outer_weights(model) if w.name.startswith("norm")] * head
    norms = sum(w.numel for w in weights)
    if dims.dp_shard * dims.cp == 1 or options.zero < 3:
        _add(found, "tp", "all_reduce", "sequence parallel: norm gradients", 1, norms * options.grad_bytes)
    else:  # FSDP2 sums each norm's partial gradient over tp itself, before each of its reduce-scatters
        reduces = _fsdp_reduces(options, dims, m)
        _add(found, "tp", "all_reduce", "sequence parallel: norm gradients", reduces * len(weights),
             reduces * norms * options.grad_bytes)


def traffic(model: Model, options: Options, dims: ParallelDims) -> tuple[Transfer, ...]:
    """Every collective one rank runs in a step, summed per (axis, collective, purpose); the module docstring
    says what is counted. The rank is the first pipeline stage's (its FSDP root holds the embedding), except
    that its pipeline sends are counted as a middle stage's (activations forward and gradients back).

    >>> from fmesh.plan.model import Options, preset
    >>> moved = traffic(preset("megatron-22b"), Options(sequence_parallel=False, recompute="full"),
    ...                 ParallelDims(8, tp=8))
    >>> [(t.axis, t.collective, t.calls) for t in moved]
    [('tp', 'all_reduce', 1152)]
    """
    found: dict[tuple[str, Collective, str], list[int]] = {}
    m, layers = micro_batches(model, dims), -(-model.layers // dims.pp)
    tokens = model.micro_batch * model.seq_len // dims.cp
    activation = tokens * model.hidden * model.dtype_bytes
    _fsdp(found, model, options, dims, m, layers)
    forward_passes = 2 if options.mode == "full" else 1
    if dims.tp > 1:
        if options.sequence_parallel:
            for collective in ("all_gather", "reduce_scatter"):
                calls = m * layers * 2 * (forward_passes + 1)
                _add(found, "tp", collective, "tensor parallel (SP)", calls, calls * activation)
            _sequence_parallel_edges(found, model, options, dims, m, layers, activation)
        else:
            calls = m * layers * (2 * forward_passes + _tp_inputs(model))
            _add(found, "tp", "all_reduce", "tensor parallel", calls, calls * activation)
    if dims.cp > 1:
        kv = 2 * tokens * dims.cp * model.kv_dim // dims.tp * model.dtype_bytes
        _add(found, "cp", "all_gather", "context parallel K/V", m * layers * forward_passes,
             m * layers * forward_passes * kv)
        _add(found, "cp", "reduce_scatter", "context parallel K/V gradients", m * layers, m * layers * kv)
    if dims.pp > 1:
        split = options.sequence_parallel or options.pipeline_scatter_gather
        calls = 2 * m * options.pipeline_interleave  # each chunk sends forward and back
        _add(found, "pp", "send", "pipeline activations and gradients", calls,
             calls * (activation // (dims.tp if split else 1)))
        if dims.tp > 1 and options.pipeline_scatter_gather and not options.sequence_parallel:
            _add(found, "tp", "all_gather", "pipeline scatter/gather", calls, calls * activation)
    if dims.ep > 1 and model.experts:
        calls = 4 * m * layers
        _add(found, "ep", "all_to_all", "expert dispatch and combine", calls, calls * activation * model.top_k)
    if options.loss_all_reduce and dims.dp_replicate * dims.dp_shard > 1:
        _add(found, "dp", "all_reduce", "loss", 1, 4)
    return tuple(Transfer(axis, collective, calls, nbytes, purpose)
                 for (axis, collective, purpose), (calls, nbytes) in found.items())


def bytes_by_axis(moved: Iterable[Transfer]) -> dict[str, int]:
    """Bytes per step per axis, every collective together.

    >>> bytes_by_axis([Transfer("tp", "all_reduce", 1, 8, "x"), Transfer("tp", "all_gather", 1, 2, "y")])
    {'tp': 10}
    """
    totals: dict[str, int] = {}
    for transfer in moved:
        totals[transfer.axis] = totals.get(transfer.axis, 0) + transfer.nbytes
    return totals
