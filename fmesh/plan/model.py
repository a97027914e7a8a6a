"""What is trained, and how: a decoder transformer by its config (:class:`Model`), the training choices that
change its memory and traffic (:class:`Options`), and presets for public configs (:data:`PRESETS`).

Pure values. A model is the sizes a person reads off a config file (layers, hidden size, heads and KV heads,
FFN size, vocabulary, sequence length, global batch, micro-batch; experts and top-k for a mixture of experts),
plus the few switches that change which tensors exist (a gated MLP, biases in the attention and in the MLP,
LayerNorm or RMSNorm, learned positions, tied embeddings, separate or fused q/k/v projections, an embedding
and output layer split over ``tp`` or not). :func:`layer_weights` and
:func:`outer_weights` list every weight tensor with the dimension tensor parallelism splits, which is what
the byte model (:mod:`fmesh.plan.traffic`) and the memory model (:mod:`fmesh.plan.memory`) read.

>>> m = preset("llama3-70b")
>>> m.layers, m.hidden, m.kv_heads, round(parameter_count(m) / 1e9, 1)
(80, 8192, 8, 70.6)
>>> round(parameter_count(preset("megatron-175b")) / 1e9, 1)
174.6
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs

from fmesh.layout.int_tuple import is_int

__all__ = [
    "GRADIENT_SYNCS",
    "PIPELINE_SCHEDULES",
    "PRESETS",
    "RECOMPUTE_CHOICES",
    "RECOMPUTE_MODES",
    "ZERO_STAGES",
    "GradientSync",
    "Model",
    "Options",
    "PipelineSchedule",
    "Recompute",
    "RecomputeChoice",
    "Weight",
    "active_parameter_count",
    "first_stage_weights",
    "from_config",
    "layer_weights",
    "outer_weights",
    "parameter_count",
    "preset",
]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
"""Activation recomputation: keep every activation, recompute the attention core only (Korthikanti et al.
2022's *selective*), or keep only each layer's input and recompute the layer (*full*)."""
GradientSync = Literal["micro_batch", "step"]
GRADIENT_SYNCS: tuple[GradientSync, ...] = ("micro_batch", "step")
"""When data-parallel gradients are reduced: after every micro-batch's backward, or once per step."""
PipelineSchedule = Literal["1f1b", "zb-h1"]
PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = ("1f1b", "zb-h1")
"""A pipeline's schedule: 1F1B (interleaved with ``Options.pipeline_interleave`` > 1), or Qi et al. 2023's
zero-bubble ZB-H1 (the backward split into its input and weight gradients, the weight gradients filling the
bubble, 1F1B's memory)."""
ZERO_STAGES: tuple[int, ...] = (1, 2, 3)
"""What the data-parallel shards hold (Rajbhandari et al. 2020): 1, the optimizer state; 2, the gradients too;
3, the weights too (FSDP)."""
RecomputeChoice = Literal["auto", "none", "selective", "full"]
RECOMPUTE_CHOICES: tuple[RecomputeChoice, ...] = ("auto", *RECOMPUTE_MODES)
"""What :class:`Options` takes: one of :data:`RECOMPUTE_MODES`, forced, or ``"auto"``: the least recomputation
with which the layout fits (:func:`fmesh.plan.search.fits` chooses)."""


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"expected {attribute.name} as a positive int, but got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value) or value < 0:
        raise ValueError(f"expected {attribute.name} as a non-negative int, but got {value!r}")


@attrs.frozen
class Model:
    """A decoder-only transformer: sizes, switches, and the batch it is trained on.

    ``kv_heads`` defaults to ``heads`` (multi-head attention), ``ffn`` to ``4 * hidden``. ``experts > 0`` makes
    every MLP a mixture of ``experts`` experts of size ``expert_ffn`` (``ffn`` when 0), ``top_k`` routed per
    token. ``global_batch`` and ``micro_batch`` are in sequences of ``seq_len`` tokens; ``dtype_bytes`` is the
    activations' and the compute weights' element size.

    >>> Model("tiny", layers=2, hidden=64, heads=4, vocab=256, seq_len=32, global_batch=8).ffn
    256
    >>> Model("bad", layers=2, hidden=64, heads=5, vocab=256, seq_len=32, global_batch=8)
    Traceback (most recent call last):
    ...
    ValueError: expected heads dividing hidden 64, but got heads=5
    """

    name: str
    layers: int = attrs.field(kw_only=True, validator=_positive)
    hidden: int = attrs.field(kw_only=True, validator=_positive)
    heads: int = attrs.field(kw_only=True, validator=_positive)
    vocab: int = attrs.field(kw_only=True, validator=_positive)
    seq_len: int = attrs.field(kw_only=True, validator=_positive)
    global_batch: int = attrs.field(kw_only=True, validator=_positive)
    micro_batch: int = attrs.field(default=1, kw_only=True, validator=_positive)
    kv_heads: int = attrs.field(kw_only=True, validator=_non_negative,
                                default=attrs.Factory(lambda self: self.heads, takes_self=True))
    ffn: int = attrs.field(kw_only=True, validator=_positive,
                           default=attrs.Factory(lambda self: 4 * self.hidden, takes_self=True))
    experts: int = attrs.field(default=0, kw_only=True, validator=_non_negative)
    top_k: int = attrs.field(default=1, kw_only=True, validator=_positive)
    expert_ffn: int = attrs.field(default=0, kw_only=True, validator=_non_negative)
    gated_mlp: bool = attrs.field(default=False, kw_only=True)
    attention_biases: bool = attrs.field(default=True, kw_only=True)
    mlp_biases: bool = attrs.field(default=True, kw_only=True)
    rms_norm: bool = attrs.field(default=False, kw_only=True)
    learned_positions: bool = attrs.field(default=False, kw_only=True)
    tied_embeddings: bool = attrs.field(default=False, kw_only=True)
    fused_qkv: bool = attrs.field(default=True, kw_only=True)
    vocab_parallel: bool = attrs.field(default=True, kw_only=True)
    dtype_bytes: int = attrs.field(default=2, kw_only=True, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"expected heads dividing hidden {self.hidden}, but got heads={self.heads}")
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"expected kv_heads dividing heads {self.heads}, but got kv_heads={self.kv_heads}")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"expected top_k <= experts {self.experts}, but got top_k={self.top_k}")

    @property
    def head_dim(self) -> int:
        """``hidden // heads``.

        >>> preset("llama3-8b").head_dim
        128
        """
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: ``kv_heads * head_dim``.

        >>> preset("llama3-8b").kv_dim
        1024
        """
        return self.kv_heads * self.head_dim

    @property
    def moe_ffn(self) -> int:
        """One expert's FFN size (``expert_ffn``, or ``ffn`` when that is 0).

        >>> preset("mixtral-8x7b").moe_ffn
        14336
        """
        return self.expert_ffn or self.ffn


@attrs.frozen
class Options:
    """How the model is trained: what changes memory and bytes, not the model.

    * ``recompute``: ``"auto"`` (the default: the planner picks the least recomputation that fits), or one of
      :data:`RECOMPUTE_MODES`, which the planner keeps (a layout that does not fit with it does not fit);
      :func:`~fmesh.plan.memory.memory`, :func:`~fmesh.plan.traffic.traffic` and
      :func:`~fmesh.plan.step.step_time` need a mode (:meth:`mode`);
    * ``sequence_parallel``: with ``tp > 1``, activations outside the tensor-parallel regions are split along
      the sequence (all_gather / reduce_scatter instead of all_reduce, Korthikanti et al. 2022);
    * ``param_bytes``: the weights' element size in compute (2: bf16) and in the FSDP all_gather;
      ``grad_bytes``: the gradients' (4: fp32, Megatron's main grads; the FSDP reduce_scatter's dtype);
      ``master_bytes`` and ``moment_bytes``: Adam's fp32 master copy (0 when the weights are fp32 already) and
      its two moments: 2 + 4 + 4 + 8 = 18 bytes per parameter by default;
    * ``flash_attention``: the ``s x s`` attention scores are never stored (FlashAttention); the Megatron
      paper's models store them (``False``);
    * ``dropout``: dropout masks are stored (GPT-3 style models; Llama has no dropout);
    * ``loss_all_reduce``: the step's loss is averaged over the data-parallel ranks (one scalar);
    * ``gradient_sync``: when the data-parallel gradients are reduced with several micro-batches and no pipeline:
      ``"micro_batch"`` (FSDP2's default in a plain accumulation loop: every backward) or ``"step"`` (once, after
      the last micro-batch: Megatron-LM's DDP, FSDP2 with ``set_requires_gradient_sync(False)`` until then).
      With a pipeline (``pp > 1``) torch's schedules and Megatron-LM both reduce once per step, whatever this says;
    * ``efficiency``: the fraction of the GPU's peak FLOP/s the matrix multiplies reach (:mod:`fmesh.plan.step`);
      ``efficiency_half_width``: with it above 0, narrow matrix multiplies reach less: the fraction is
      ``efficiency * w / (w + efficiency_half_width)`` for ``w = hidden / tp``, the width one GPU multiplies
      (:func:`fmesh.plan.step.compute_efficiency`);
    * ``link_efficiency``: the fraction of the links' peak bandwidth the collectives reach;
    * ``pipeline_interleave``: the model chunks each pipeline rank holds (Narayanan et al. 2021's interleaved
      1F1B: ``v`` chunks cut the bubble to ``(pp - 1) / (v m)`` and send ``v`` times as often); 1: plain 1F1B;
    * ``elementwise_bytes``: bytes the non-matmul operations (norms, activations, dropout, residuals, softmax)
      read and write per token, per hidden unit, per layer, in one pass over the layers, at the GPU's memory
      bandwidth; a step makes 3 passes (the forward, the backward at two), 4 with full recomputation
      (:func:`fmesh.plan.step.elementwise_seconds`; 0: not counted);
    * ``overlap_data_parallel``: the data-parallel collectives (FSDP's, HSDP's and the loss's) run beside the
      compute (FSDP2 prefetches; only what exceeds the compute counts); off, they count in full (Megatron-LM's
      gradient all-reduce of 2021-22, after the backward);
    * ``zero``: what the data-parallel shards (``dp_shard * cp``, ``efsdp`` for experts) split
      (:data:`ZERO_STAGES`): 3, FSDP (weights gathered per use); 2, gradients and optimizer state (the weights
      replicated, the gradients reduce-scattered after every micro-batch's backward, the updated weights
      all-gathered once per step); 1, the optimizer state alone (the gradients accumulated whole and
      reduce-scattered once per step, the weights all-gathered once per step: Megatron-LM's distributed optimizer);
    * ``fp8``: the layers' linear layers multiply in FP8 (torchao's float8 training, as torchtitan applies it): at
      the GPU's FP8 peak (``Hardware.fp8_flops``) times the same ``efficiency``; the attention core and the output
      layer stay in bf16; with FSDP their weights are all-gathered in FP8 (1 byte; torchtitan's float8 all-gather)
      and held gathered in FP8. The activations saved for the backward, the tp/cp/ep/pp traffic and the optimizer
      state keep their dtypes (torchao keeps the high-precision inputs for the backward by default);
    * ``pipeline_schedule``: :data:`PIPELINE_SCHEDULES` (``"zb-h1"`` only with ``pipeline_interleave == 1``);
    * ``pipeline_scatter_gather``: without sequence parallelism, each tensor-parallel rank sends ``1 / tp`` of the
      (replicated) activations to the next stage and the receivers all-gather them over ``tp`` (Megatron-LM's
      scatter/gather optimisation, Narayanan et al. 2021 section 4.1: the pipeline's bytes cross the hosts'
      NICs once, not ``tp`` times); off, every rank sends them whole (torch's pipeline schedules).

    ``efficiency``, ``efficiency_half_width``, ``link_efficiency`` and ``elementwise_bytes`` are the free
    parameters ``bench/planner_validation.py`` fits on published runs; the defaults are stated guesses.

    >>> Options().recompute, Options(recompute="full").recompute
    ('auto', 'full')
    >>> Options(recompute="some")
    Traceback (most recent call last):
    ...
    ValueError: expected recompute among ('auto', 'none', 'selective', 'full'), but got 'some'
    """

    recompute: RecomputeChoice = attrs.field(default="auto")
    sequence_parallel: bool = attrs.field(default=True)
    param_bytes: int = attrs.field(default=2, validator=_positive)
    grad_bytes: int = attrs.field(default=4, validator=_positive)
    master_bytes: int = attrs.field(default=4, validator=_non_negative)
    moment_bytes: int = attrs.field(default=8, validator=_non_negative)
    flash_attention: bool = attrs.field(default=True)
    dropout: bool = attrs.field(default=False)
    loss_all_reduce: bool = attrs.field(default=True)
    gradient_sync: GradientSync = attrs.field(default="micro_batch")
    efficiency: float = attrs.field(default=0.5)
    efficiency_half_width: float = attrs.field(default=0.0)
    link_efficiency: float = attrs.field(default=1.0)
    elementwise_bytes: float = attrs.field(default=0.0)
    pipeline_interleave: int = attrs.field(default=1, validator=_positive)
    overlap_data_parallel: bool = attrs.field(default=True)
    zero: int = attrs.field(default=3)
    fp8: bool = attrs.field(default=False)
    pipeline_schedule: PipelineSchedule = attrs.field(default="1f1b")
    pipeline_scatter_gather: bool = attrs.field(default=False)

    def __attrs_post_init__(self) -> None:
        if not is_int(self.zero) or self.zero not in ZERO_STAGES:  # True == 1, but is no stage
            raise ValueError(f"expected zero among {ZERO_STAGES}, but got {self.zero!r}")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ValueError(f"expected pipeline_schedule among {PIPELINE_SCHEDULES}, but got "
                             f"{self.pipeline_schedule!r}")
        if self.pipeline_schedule == "zb-h1" and self.pipeline_interleave != 1:
            raise ValueError(f"expected pipeline_interleave 1 with the zb-h1 schedule (ZB-H1 is not interleaved), "
                             f"but got {self.pipeline_interleave}")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise ValueError(f"expected recompute among {RECOMPUTE_CHOICES}, but got {self.recompute!r}")
        if self.gradient_sync not in GRADIENT_SYNCS:
            raise ValueError(f"expected gradient_sync among {GRADIENT_SYNCS}, but got {self.gradient_sync!r}")
        for name in ("efficiency", "link_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"expected {name} in (0, 1], but got {value!r}")
        for name in ("efficiency_half_width", "elementwise_bytes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1e6:
                raise ValueError(f"expected {name} as a non-negative number, but got {value!r}")

    @property
    def mode(self) -> Recompute:
        """The recomputation mode the memory, byte and time models use: ``recompute``, which must be chosen
        (not ``"auto"``; :func:`fmesh.plan.search.fits` chooses it).

        >>> Options(recompute="full").mode
        'full'
        >>> Options().mode
        Traceback (most recent call last):
        ...
        ValueError: expected a recompute mode among ('none', 'selective', 'full') for the memory, byte and time \
models, but got 'auto' (fmesh.plan.search.fits chooses one: the least that fits)
        """
        if self.recompute == "auto":
            raise ValueError(f"expected a recompute mode among {RECOMPUTE_MODES} for the memory, byte and time "
                             "models, but got 'auto' (fmesh.plan.search.fits chooses one: the least that fits)")
        return self.recompute


@attrs.frozen
class Weight:
    """One weight tensor: its name, shape (``nn.Linear`` order: out, in) and the dimension tensor parallelism
    splits (``None``: replicated over ``tp``); ``expert``: one of each expert's (``shape`` is one expert's).

    >>> Weight("q", (64, 64), tp_dim=0).local_shape(2)
    (32, 64)
    """

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = None
    expert: bool = False

    def local_shape(self, tp: int) -> tuple[int, ...]:
        """The shape one tensor-parallel rank holds.

        >>> Weight("o", (64, 64), tp_dim=1).local_shape(4), Weight("norm", (64,)).local_shape(4)
        ((64, 16), (64,))
        """
        if self.tp_dim is None or tp == 1:
            return self.shape
        return tuple(n // tp if d == self.tp_dim else n for d, n in enumerate(self.shape))

    @property
    def fp8(self) -> bool:
        """Whether ``Options.fp8`` casts this weight to FP8: a layer's linear weight matrix (not a norm, a bias, the
        MoE router, the embedding, the positions or the output layer).

        >>> Weight("up.weight", (256, 64), 0).fp8, Weight("norm1.weight", (64,)).fp8, Weight("head.weight", (8, 4)).fp8
        (True, False, False)
        """
        return len(self.shape) == 2 and self.name.split(".")[0] not in ("router", "embed", "position", "head")

    @property
    def numel(self) -> int:
        """Elements of the whole tensor.

        >>> Weight("q", (64, 32)).numel
        2048
        """
        total = 1
        for n in self.shape:
            total *= n
        return total


def _norm(model: Model, name: str) -> list[Weight]:
    weight = [Weight(f"{name}.weight", (model.hidden,))]
    return weight if model.rms_norm else [*weight, Weight(f"{name}.bias", (model.hidden,))]


def _linear(name: str, out: int, inp: int, tp_dim: int, bias: bool, expert: bool = False) -> list[Weight]:
    """A colwise (``tp_dim=0``) or rowwise (``tp_dim=1``) linear; a rowwise bias is replicated."""
    weight = Weight(f"{name}.weight", (out, inp), tp_dim, expert)
    if not bias:
        return [weight]
    return [weight, Weight(f"{name}.bias", (out,), 0 if tp_dim == 0 else None, expert)]


def _mlp(model: Model, prefix: str, ffn: int, expert: bool) -> list[Weight]:
    h, b = model.hidden, model.mlp_biases
    if model.gated_mlp:
        return [*_linear(f"{prefix}gate", ffn, h, 0, b, expert), *_linear(f"{prefix}up", ffn, h, 0, b, expert),
                *_linear(f"{prefix}down", h, ffn, 1, b, expert)]
    return [*_linear(f"{prefix}up", ffn, h, 0, b, expert), *_linear(f"{prefix}down", h, ffn, 1, b, expert)]


def layer_weights(model: Model) -> tuple[Weight, ...]:
    """Every weight of one transformer layer, in the order ``examples/train.py``'s ``Block`` registers them
    (norms first); q/k/v are one fused tensor unless ``fused_qkv`` is off.

    >>> [w.name for w in layer_weights(Model("t", layers=1, hidden=8, heads=2, vocab=4, seq_len=4, global_batch=1,
    ...                                       attention_biases=False, mlp_biases=False, rms_norm=True))]
    ['norm1.weight', 'norm2.weight', 'attention.qkv.weight', 'attention.o.weight', 'up.weight', 'down.weight']
    """
    return _layer_weights(model)


@functools.lru_cache(maxsize=256)
def _layer_weights(model: Model) -> tuple[Weight, ...]:
    """:func:`layer_weights`, remembered per model: the search asks for one model's a hundred thousand times."""
    h, b = model.hidden, model.attention_biases
    weights = [*_norm(model, "norm1"), *_norm(model, "norm2")]
    if model.fused_qkv:
        weights += _linear("attention.qkv", h + 2 * model.kv_dim, h, 0, b)
    else:
        for name, out in (("q", h), ("k", model.kv_dim), ("v", model.kv_dim)):
            weights += _linear(f"attention.{name}", out, h, 0, b)
    weights += _linear("attention.o", h, h, 1, b)
    if model.experts:
        weights.append(Weight("router.weight", (model.experts, h)))
        weights += _mlp(model, "experts.", model.moe_ffn, expert=True)
    else:
        weights += _mlp(model, "", model.ffn, expert=False)
    return tuple(weights)


def outer_weights(model: Model) -> tuple[Weight, ...]:
    """The weights outside the layers, in ``examples/train.py``'s order: the embedding (split over ``tp`` along
    the vocabulary when ``vocab_parallel``, as Megatron's vocab-parallel embedding), the
    learned positions, the final norm and the output projection (absent when tied).

    >>> [w.name for w in outer_weights(preset("llama3-8b"))]
    ['embed.weight', 'norm.weight', 'head.weight']
    """
    split = 0 if model.vocab_parallel else None
    weights = [Weight("embed.weight", (model.vocab, model.hidden), split)]
    if model.learned_positions:
        weights.append(Weight("position", (model.seq_len, model.hidden)))
    weights += _norm(model, "norm")
    if not model.tied_embeddings:
        weights.append(Weight("head.weight", (model.vocab, model.hidden), split))
    return tuple(weights)


def first_stage_weights(model: Model, pp: int) -> tuple[Weight, ...]:
    """The weights outside the layers that the first of ``pp`` pipeline stages holds: all of them with one
    stage, else the embedding and the learned positions (the final norm and the output layer are the last
    stage's).

    >>> [w.name for w in first_stage_weights(preset("llama3-8b"), 4)]
    ['embed.weight']
    """
    outer = outer_weights(model)
    return outer if pp == 1 else tuple(w for w in outer if w.name in ("embed.weight", "position"))


def _count(weights: tuple[Weight, ...], experts: int) -> int:
    return sum(w.numel * (experts if w.expert else 1) for w in weights)


def parameter_count(model: Model) -> int:
    """Every parameter, all experts included.

    >>> round(parameter_count(preset("mixtral-8x7b")) / 1e9, 1), round(parameter_count(preset("llama3-405b")) / 1e9)
    (46.7, 406)
    """
    return model.layers * _count(layer_weights(model), model.experts) + _count(outer_weights(model), 1)


def active_parameter_count(model: Model) -> int:
    """The parameters one token passes through (``top_k`` experts of each MoE layer), the embedding excluded
    (a lookup, not a multiply): what sets the matrix-multiply FLOPs per token.

    >>> round(active_parameter_count(preset("mixtral-8x7b")) / 1e9, 1)
    12.7
    """
    per_layer = _count(layer_weights(model), model.top_k if model.experts else 1)
    head = model.vocab * model.hidden
    return model.layers * per_layer + head


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int) -> Model:
    """Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, Table 3): RMSNorm, SwiGLU, no biases, GQA with 8 KV
    heads, vocabulary 128,256, 8,192-token sequences; torchtitan's separate q/k/v and global batch of
    1,024 sequences (~8M tokens), micro-batch 1."""
    return Model(name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=128256,
                 seq_len=8192, global_batch=1024, gated_mlp=True, attention_biases=False,
                 mlp_biases=False, rms_norm=True, fused_qkv=False)


def _megatron(name: str, layers: int, hidden: int, heads: int, batch: int) -> Model:
    """Korthikanti et al. 2022, Table 3: GPT-3-style, 4h FFN, LayerNorm, biases, vocabulary 51,200, s=2048,
    micro-batch 1, fused q/k/v (Megatron-LM)."""
    return Model(name, layers=layers, hidden=hidden, heads=heads, vocab=51200, seq_len=2048, global_batch=batch,
                 micro_batch=1, tied_embeddings=True)


PRESETS: Mapping[str, Model] = MappingProxyType({
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248),
    # Mixtral 8x7B (Mistral AI, "Mixtral of Experts", 2024): Mistral 7B's layers with 8 experts, top 2.
    "mixtral-8x7b": Model("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                          seq_len=4096, global_batch=1024, experts=8, top_k=2, gated_mlp=True,
                          attention_biases=False, mlp_biases=False, rms_norm=True, fused_qkv=False),
    "megatron-22b": _megatron("megatron-22b", 48, 6144, 64, 4),
    "megatron-175b": _megatron("megatron-175b", 96, 12288, 96, 64),
    "megatron-530b": _megatron("megatron-530b", 105, 20480, 128, 280),
    "megatron-1t": _megatron("megatron-1t", 128, 25600, 160, 512),
})
"""Public configurations by name (see each builder's docstring for the source)."""


def preset(name: str) -> Model:
    """The preset ``name`` (one of :data:`PRESETS`).

    >>> preset("llama3-8b").layers
    32
    >>> preset("llama-70b")
    Traceback (most recent call last):
    ...
    KeyError: "expected a model among ('llama3-8b', 'llama3-70b', 'llama3-405b', 'mixtral-8x7b', 'megatron-22b', \
'megatron-175b', 'megatron-530b', 'megatron-1t'), but got 'llama-70b'"
    """
    if name not in PRESETS:
        raise KeyError(f"expected a model among {tuple(PRESETS)}, but got {name!r}")
    return PRESETS[name]


def from_config(config: Mapping[str, Any]) -> Model:
    """A :class:`Model` from a mapping of its fields (a JSON config file's contents); ``name`` defaults to
    ``"custom"``.

    >>> from_config({"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32, "global_batch": 8}).ffn
    256
    >>> from_config({"layers": 2, "width": 64})
    Traceback (most recent call last):
    ...
    ValueError: expected model fields among ('name', 'layers', 'hidden', 'heads', 'vocab', 'seq_len', 'global_batch', \
'micro_batch', 'kv_heads', 'ffn', 'experts', 'top_k', 'expert_ffn', 'gated_mlp', 'attention_biases', 'mlp_biases', \
'rms_norm', 'learned_positions', 'tied_embeddings', 'fused_qkv', 'vocab_parallel', 'dtype_bytes'), but got ['width']
    """
    known = tuple(field.name for field in attrs.fields(Model))
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"expected model fields among {known}, but got {unknown}")
    missing = [name for name in ("layers", "hidden", "heads", "vocab", "seq_len", "global_batch") if name not in config]
    if missing:
        raise ValueError(f"expected the model fields {missing} in the config, but got only {sorted(config)}")
    fields = dict(config)
    return Model(str(fields.pop("name", "custom")), **fields)
