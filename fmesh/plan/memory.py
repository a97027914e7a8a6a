"""Memory per GPU of a training job, before any GPU is touched: :func:`memory`.

The busiest GPU is the first pipeline stage's (it holds the embedding and the most micro-batches in flight).
Its memory is split into

* **weights** (``param_bytes`` each), **gradients** (``grad_bytes``) and **optimizer** state (Adam: an fp32
  master copy and two moments, ``master_bytes + moment_bytes``), for the parameters it owns: its
  ``ceil(layers / pp)`` layers (and the embedding, and with ``pp == 1`` the output layer), split over ``tp`` as
  Megatron-LM splits them (:func:`fmesh.plan.model.layer_weights`), experts over ``ep``, then sharded over the
  FSDP ranks (``dp_shard * cp`` for dense weights, ``efsdp`` for experts; ``dp_replicate`` holds copies);
* **activations**, per layer and micro-batch by Korthikanti et al. 2022 (arXiv 2205.05198, Table 2), for
  ``s`` tokens (``seq_len / cp``), micro-batch ``b``, hidden ``h``, ``a`` heads and ``t = tp``:
  ``sbh(34 + 5as/h)`` with no parallelism, ``sbh(10 + 24/t + 5as/(ht))`` with tensor parallelism,
  ``sbh/t (34 + 5as/h)`` with sequence parallelism too, ``34 sbh/t`` with selective recomputation and
  ``2sbh`` (``/t`` with sequence parallelism) with full recomputation. The 34 and 24 are the GPT-3 layer's
  (:func:`layer_activation_bytes` derives them from the layer's tensors, so a gated MLP, grouped-query attention,
  no dropout or FlashAttention change them). The first stage of a 1F1B pipeline holds ``min(pp, m)``
  micro-batches of its layers (``m``: micro-batches per step per pipeline), which is ``layers`` layers' worth
  when ``m >= pp`` (ZB-H1 too); interleaved over ``v`` chunks, ``1 + (pp - 1) / (pp v)`` times as much
  (:func:`in_flight`); with ``pp == 1`` one micro-batch of every layer. The output layer's (the final norm's input and
  output, the fp32 log-probabilities, split over ``tp`` when the vocabulary is) count where it is;
* **buffers**: with FSDP, the all-gathered weights of two layers (the one computing and the one prefetched) and
  one layer's unsharded gradients before the reduce_scatter; with FSDP under a pipeline (``pp > 1``), every
  layer of the stage unsharded, weights and gradients, for the whole step (torch's pipeline schedules gather
  once and reduce once per step: :mod:`fmesh.plan.traffic`); gathered linear weights in FP8 with
  ``Options.fp8``. ZeRO-1 and ZeRO-2 (``Options.zero``) keep the weights whole (no gathered buffers), ZeRO-1
  the gradients whole too, ZeRO-2 one layer's whole gradients before their reduce_scatter; all three shard the
  optimizer state;
* **communicators**: NCCL's own buffers for every communicator the rank joins, from the job's manifest
  (:func:`with_communicators`, :mod:`fmesh.plan.manifest`'s memory model); :func:`memory` leaves it 0, as it
  knows nothing of hosts.

>>> from fmesh.plan.model import Options, preset
>>> from fmesh.plan.parallel import ParallelDims
>>> m = memory(preset("megatron-22b"), Options(recompute="selective", flash_attention=False, dropout=True),
...            ParallelDims(8, tp=8))
>>> round(m.weights / 2**30, 2), round(m.activations / 2**30, 2)
(5.14, 2.49)
"""

from __future__ import annotations

import attrs

from fmesh.plan.manifest import plan_manifest
from fmesh.plan.model import Model, Options, Weight, first_stage_weights, layer_weights
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.topology import RankOrder

__all__ = ["Memory", "activation_memory", "in_flight", "layer_activation_bytes", "memory", "micro_batches",
           "owned_parameters", "with_communicators"]


@attrs.frozen
class Memory:
    """Bytes per GPU, by what holds them.

    >>> Memory(1, 2, 3, 4, 5).total, Memory(1, 2, 3, 4, 5, communicators=6).total
    (15, 21)
    """

    weights: int
    gradients: int
    optimizer: int
    activations: int
    buffers: int
    communicators: int = 0

    @property
    def total(self) -> int:
        """The sum of the parts.

        >>> Memory(0, 0, 0, 2**30, 0).total
        1073741824
        """
        return (self.weights + self.gradients + self.optimizer + self.activations + self.buffers
                + self.communicators)


def micro_batches(model: Model, dims: ParallelDims) -> int:
    """Micro-batches per step on each data-parallel rank: ``global_batch / (dp * micro_batch)``.

    >>> from fmesh.plan.model import preset
    >>> micro_batches(preset("megatron-175b"), ParallelDims(64, pp=8, tp=8, dp_shard=1))
    64
    """
    dp = dims.dp_replicate * dims.dp_shard
    return max(1, model.global_batch // (dp * model.micro_batch))


def _local(weight: Weight, dims: ParallelDims) -> int:
    tp = dims.etp if weight.expert else dims.tp
    total = 1
    for n in weight.local_shape(tp):
        total *= n
    return total


def owned_parameters(model: Model, dims: ParallelDims, sharded: bool = True) -> int:
    """Parameters the first pipeline stage's GPU keeps after ``tp`` and ``ep`` (and, with ``sharded``, after FSDP's
    or ZeRO's data-parallel sharding).

    >>> from fmesh.plan.model import preset
    >>> owned_parameters(preset("megatron-22b"), ParallelDims(8, tp=8)) / 1e9
    2.7592704
    >>> owned_parameters(preset("llama3-8b"), ParallelDims(8, dp_shard=8), sharded=False) / 1e9
    8.030261248
    """
    dense_shard, expert_shard = (dims.dp_shard * dims.cp, dims.efsdp) if sharded else (1, 1)
    experts_here = model.experts // dims.ep if model.experts else 1
    dense = expert = 0
    for weight in layer_weights(model):
        if weight.expert:
            expert += _local(weight, dims) * experts_here
        else:
            dense += _local(weight, dims)
    layers = -(-model.layers // dims.pp)
    outer = first_stage_weights(model, dims.pp)
    dense_total = layers * dense + sum(_local(w, dims) for w in outer)
    return -(-dense_total // dense_shard) + -(-(layers * expert) // expert_shard)


def layer_activation_bytes(model: Model, options: Options, tp: int = 1, cp: int = 1) -> int:
    """Activation bytes one layer keeps for one micro-batch until its backward (Korthikanti et al. 2022).

    In units of ``sbh`` (2-byte activations, 1-byte dropout masks), for GPT-3's layer: 10 outside the
    tensor-parallel regions (the two norms' inputs, the attention's and the MLP's inputs, two dropout masks),
    24 inside (q, k, v, the attention output, the MLP's two ``4h`` activations), and ``5as/h`` for the
    attention scores (softmax output, dropout mask, dropout output), which selective recomputation drops.
    With context parallelism (``cp > 1``) ``s`` is the local share of the sequence, except for the keys and
    values, which the attention keeps all-gathered (``cp`` times the local ones).

    >>> from fmesh.plan.model import preset
    >>> m, gpt = preset("megatron-22b"), Options(flash_attention=False, dropout=True, recompute="none",
    ...                                          sequence_parallel=False)
    >>> s, b, h, a = 2048, 1, 6144, 64
    >>> layer_activation_bytes(m, gpt) == 34 * s * b * h + 5 * a * s * s * b
    True
    >>> layer_activation_bytes(m, attrs.evolve(gpt, recompute="selective", sequence_parallel=True), tp=8)
    53477376
    """
    s, b, h = model.seq_len // cp, model.micro_batch, model.hidden
    a, kv, ffn = model.heads, model.kv_dim, model.moe_ffn if model.experts else model.ffn
    width = model.dtype_bytes
    sbh = s * b * h
    sp = options.sequence_parallel and tp > 1
    if options.mode == "full":
        return width * sbh // (tp if sp else 1)
    masks = 2 * sbh if options.dropout else 0
    outside = 4 * width * sbh + masks  # the norm inputs and the attention's and the MLP's inputs
    tokens = s * b * (model.top_k if model.experts else 1)  # tokens an MLP sees (each routed k times)
    mlp = (4 if model.gated_mlp else 2) * width * tokens * ffn
    # q and the attention output; k and v as the attention keeps them: with context parallelism the keys and
    # values all-gathered over cp (the whole sequence), which the backward reads (fmesh.plan.traffic gathers
    # them once per forward); the MLP
    inside = width * s * b * (2 * h + 2 * kv * cp) + mlp
    # FlashAttention keeps only an fp32 log-sum-exp per row (its output, which its backward reads, is the output
    # projection's input: the kernel lays it out heads-last, so merging the heads is a view); otherwise the
    # scores (and their dropout)
    scores = 4 * a * s * b if options.flash_attention else (5 if options.dropout else 2) * a * s * s * b
    if options.mode == "selective":
        scores = 0
    outside = outside // tp if sp else outside
    return outside + (inside + scores) // tp


def _head(model: Model, dims: ParallelDims) -> int:
    """What the output layer keeps: the final norm's input and output, and the fp32 log-probabilities of the
    loss (split over ``tp`` with a vocabulary-parallel output layer)."""
    s, b = model.seq_len // dims.cp, model.micro_batch
    return 2 * model.dtype_bytes * s * b * model.hidden + 4 * s * b * model.vocab // (
        dims.tp if model.vocab_parallel else 1)


def memory(model: Model, options: Options, dims: ParallelDims) -> Memory:
    """Bytes per GPU on the first pipeline stage (see the module docstring for what each part counts).

    >>> from fmesh.plan.model import preset
    >>> m = memory(preset("llama3-70b"), Options(recompute="selective"),
    ...            ParallelDims(4096, dp_replicate=16, dp_shard=32, tp=8))
    >>> m.total < 80 * 2**30, round(m.optimizer / 2**30, 2)
    (True, 3.08)
    """
    owned = owned_parameters(model, dims)
    whole = owned_parameters(model, dims, sharded=False)
    layers = -(-model.layers // dims.pp)
    buffers = 0
    sharded = dims.dp_shard * dims.cp > 1
    counts = [(w, _local(w, dims) * (model.experts // dims.ep if w.expert else 1)) for w in layer_weights(model)]
    one_layer = sum(n for _, n in counts)
    gathered = sum(n * (1 if options.fp8 and w.fp8 else options.param_bytes) for w, n in counts)  # bytes
    if sharded and options.zero == 3:
        if dims.pp > 1:  # the pipeline keeps the stage's weights and gradients unsharded all step (traffic.py)
            buffers = layers * (gathered + one_layer * options.grad_bytes)
        else:
            buffers = 2 * gathered + one_layer * options.grad_bytes
    elif sharded and options.zero == 2:  # one layer's gradients before their reduce_scatter
        buffers = one_layer * options.grad_bytes
    weights = owned if options.zero == 3 else whole
    return Memory(
        weights=weights * options.param_bytes,
        gradients=(owned if options.zero >= 2 else whole) * options.grad_bytes,
        optimizer=owned * (options.master_bytes + options.moment_bytes),
        activations=activation_memory(model, options, dims),
        buffers=buffers,
    )


def activation_memory(model: Model, options: Options, dims: ParallelDims) -> int:
    """The activations part of :func:`memory`: the first stage's layers times the micro-batches in flight
    (module docstring), the layer being recomputed with full recomputation, the output layer's where it
    is.

    >>> from fmesh.plan.model import preset
    >>> dims = ParallelDims(8, tp=8)
    >>> options = Options(recompute="selective", flash_attention=False, dropout=True)
    >>> activation_memory(preset("megatron-22b"), options, dims) == memory(preset("megatron-22b"), options,
    ...                                                                    dims).activations
    True
    """
    layers = -(-model.layers // dims.pp)
    activations = layers * in_flight(dims.pp, micro_batches(model, dims), options.pipeline_interleave) // (
        options.pipeline_interleave) * layer_activation_bytes(model, options, dims.tp, dims.cp)
    if options.mode == "full":  # the layer being recomputed holds its whole activations once
        activations += layer_activation_bytes(model, attrs.evolve(options, recompute="none"), dims.tp, dims.cp)
    if dims.pp == 1:
        activations += _head(model, dims)
    return activations


def in_flight(pp: int, m: int, chunks: int = 1) -> int:
    """Model chunks' micro-batches whose activations the first stage holds at its peak: ``min(pp, m)`` with 1F1B
    (and ZB-H1), 1 without a pipeline; with ``chunks`` > 1 per rank (interleaved 1F1B, Megatron-LM's warm-up of
    ``2 (pp - 1) + (chunks - 1) pp`` chunk micro-batches, then one more), each of ``layers / chunks`` layers:
    ``pp (1 + (pp - 1) / (pp chunks))`` micro-batches' worth of the stage's layers when ``m >= pp`` (Korthikanti
    et al. 2022, section 4.2.3).

    >>> in_flight(8, 64), in_flight(8, 4), in_flight(8, 64, chunks=2), in_flight(1, 8)
    (8, 4, 23, 1)
    """
    if pp == 1:
        return 1
    if chunks == 1:
        return min(pp, m)
    return min(m * chunks, 2 * (pp - 1) + (chunks - 1) * pp + 1)


def with_communicators(used: Memory, dims: ParallelDims, gpus_per_node: int,
                       rank_order: RankOrder = "block") -> Memory:
    """``used`` with the NCCL buffers of every communicator a rank of the job joins (its manifest's
    ``per_rank`` GPU memory).

    >>> with_communicators(Memory(0, 0, 0, 0, 0), ParallelDims(16, tp=8), 8).communicators / 2**20
    882.0
    """
    degrees = {name: getattr(dims, name) for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")}
    manifest = plan_manifest(dims.world_size, gpus_per_node, rank_order=rank_order, **degrees)
    return attrs.evolve(used, communicators=manifest.per_rank_gpu_memory_bytes)
