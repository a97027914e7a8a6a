"""The best layouts of a model on N GPUs, before any GPU is touched: :func:`search`, and for a given layout the
changes worth trying: :func:`alternatives`.

:func:`search` lists every combination of the degrees ``(pp, dp_replicate, dp_shard, cp, tp)`` whose product is
the number of GPUs (``tp`` dividing the heads and the KV heads, ``cp`` the sequence, ``pp`` at most the layers,
the data-parallel degree dividing the global batch; for a mixture of experts, every ``ep`` dividing the
experts and ``dp_shard * cp * tp``), every micro-batch size of :data:`MICRO_BATCHES` that divides each
data-parallel rank's share of the batch (or the model's own, when given), with each rank order (``block``:
torchrun's, ``cyclic``), keeps the ones that fit in the GPU's memory with the least recomputation that makes
them fit (none, then selective, then full: more recomputation costs compute and saves no time in this model, so
for each micro-batch the least that fits is the one worth costing), and ranks them by estimated step time
(:mod:`fmesh.plan.step`). Memory is checked first (arithmetic only); the step time, which places every group
on the hosts, is computed only for the layouts that fit, and each layout's groups are placed once per rank
order whatever its micro-batch; the communicators' NCCL buffers (from the job's manifest) are added last,
walking the ranking from the fastest until ``top`` layouts fit with them. Every layout names the
bandwidth-hungry axes (tp, cp, ep) whose groups cross hosts.

>>> from fmesh.plan.hardware import hardware
>>> from fmesh.plan.model import Options, preset
>>> best = search(preset("llama3-8b"), Options(), 64, 8, hardware("h100"), top=3)
>>> len(best), best[0].dims.world_size
(3, 64)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

import attrs

from fmesh.mesh import Mesh
from fmesh.plan.costs import format_seconds
from fmesh.plan.hardware import Hardware
from fmesh.plan.memory import Memory, activation_memory, memory, with_communicators
from fmesh.plan.model import RECOMPUTE_MODES, ZERO_STAGES, Model, Options, Recompute
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.step import StepTime, compute_seconds, step_time
from fmesh.plan.topology import HUNGRY_AXES, ORDERS, AxisSpan, RankOrder, Topology
from fmesh.plan.traffic import Transfer, traffic

__all__ = ["DEGREE_AXES", "MICRO_BATCHES", "RANK_ORDERS", "Candidate", "alternatives", "candidates",
           "check_degrees", "crossing_axes", "degree_fits", "differences", "fits", "micro_batch_choices", "reason",
           "search"]

RANK_ORDERS = ORDERS  # every rank order the search tries
MICRO_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16)
"""The micro-batch sizes (sequences) the search tries, each where it divides a data-parallel rank's share."""


@attrs.frozen
class Candidate:
    """One layout: its degrees, rank order, micro-batch size and recomputation, what it costs (memory per GPU,
    step time), and the bandwidth-hungry axes whose groups cross hosts (:func:`crossing_axes`)."""

    dims: ParallelDims
    rank_order: RankOrder
    recompute: Recompute
    memory: Memory
    time: StepTime
    micro_batch: int = 1
    crossing: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The degrees that are not 1, the rank order, the micro-batch and the recomputation, in one line, and
        the axes that cross hosts.

        >>> from fmesh.plan.hardware import hardware
        >>> from fmesh.plan.model import preset
        >>> search(preset("llama3-8b"), Options(), 8, 8, hardware("h100"), top=1)[0].label
        'dp_shard=8 block, micro-batch 1, recompute none'
        """
        degrees = " ".join(f"{n}={getattr(self.dims, n)}" for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
                           if getattr(self.dims, n) > 1) or "single GPU"
        across = f" ({', '.join(self.crossing)} across hosts)" if self.crossing else ""
        return f"{degrees} {self.rank_order}, micro-batch {self.micro_batch}, recompute {self.recompute}{across}"


def crossing_axes(spans: Mapping[str, AxisSpan]) -> tuple[str, ...]:
    """The bandwidth-hungry axes (tp, etp, cp, ep) among ``spans`` whose groups cross hosts: what every output
    of the planner names (a crossing tp or ep is rarely what one wants).

    >>> from fmesh.plan.topology import AxisSpan
    >>> crossing_axes({"tp": AxisSpan("tp", size=16, num_groups=1, hosts_min=2, hosts_max=2),
    ...                "dp_shard_cp": AxisSpan("dp_shard_cp", size=2, num_groups=8, hosts_min=2, hosts_max=2)})
    ('tp',)
    """
    return tuple(a for a in HUNGRY_AXES if a in spans and spans[a].size > 1 and not spans[a].intra_host)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


DEGREE_AXES: tuple[str, ...] = ("tp", "cp", "pp", "dp", "ep")
"""The degrees :func:`degree_fits` judges against a model (``dp``: ``dp_replicate * dp_shard``)."""


def degree_fits(model: Model, axis: str, degree: int) -> bool:
    """Whether ``degree`` along ``axis`` (one of :data:`DEGREE_AXES`) suits ``model``: ``tp`` divides the heads,
    the KV heads and the FFN size (each expert's too); ``cp`` divides the sequence; ``pp`` is at most the
    layers; ``dp`` divides the global batch into micro-batches; ``ep`` divides the experts (1 for a dense
    model). The rules :func:`candidates` generates with and :func:`check_degrees` checks given degrees with.

    >>> from fmesh.plan.model import preset
    >>> degree_fits(preset("llama3-70b"), "tp", 8), degree_fits(preset("llama3-70b"), "tp", 16)
    (True, False)
    """
    if axis == "tp":
        return not (model.heads % degree or model.kv_heads % degree or model.ffn % degree
                    or (model.experts and model.moe_ffn % degree))
    if axis == "cp":
        return model.seq_len % degree == 0
    if axis == "pp":
        return degree <= model.layers
    if axis == "dp":
        return model.global_batch % (degree * model.micro_batch) == 0
    if axis == "ep":
        return model.experts % degree == 0 if model.experts else degree == 1
    raise ValueError(f"expected an axis among {DEGREE_AXES}, but got {axis!r}")


def _rule(model: Model, axis: str) -> str:
    """What :func:`degree_fits` asks of ``axis``, in words."""
    if axis == "tp":
        moe = f" and each expert's {model.moe_ffn}" if model.experts and model.moe_ffn != model.ffn else ""
        return (f"tp dividing the {model.heads} heads, the {model.kv_heads} KV heads and the FFN size "
                f"{model.ffn}{moe}")
    if axis == "cp":
        return f"cp dividing the {model.seq_len}-token sequence"
    if axis == "pp":
        return f"pp at most the {model.layers} layers"
    if axis == "dp":
        return (f"dp = dp_replicate x dp_shard dividing the global batch of {model.global_batch} sequences into "
                f"micro-batches of {model.micro_batch}")
    return (f"ep dividing the {model.experts} experts" if model.experts
            else "ep 1 (it has no experts)")


def check_degrees(model: Model, dims: ParallelDims) -> None:
    """Raise ``ValueError`` naming the first degree of ``dims`` that does not suit ``model``
    (:func:`degree_fits`), and the degrees that would on these GPUs.

    >>> from fmesh.plan.model import preset
    >>> check_degrees(preset("llama3-70b"), ParallelDims(64, tp=16))
    Traceback (most recent call last):
    ...
    ValueError: expected tp dividing the 64 heads, the 8 KV heads and the FFN size 28672 of llama3-70b \
(tp in 1, 2, 4, 8), but got tp=16
    """
    for axis in DEGREE_AXES:
        degree = dims.dp_replicate * dims.dp_shard if axis == "dp" else getattr(dims, axis)
        if not degree_fits(model, axis, degree):
            fitting = ", ".join(str(d) for d in _divisors(dims.world_size) if degree_fits(model, axis, d))
            got = (f"dp={degree} (dp_replicate={dims.dp_replicate} x dp_shard={dims.dp_shard})" if axis == "dp"
                   else f"{axis}={degree}")
            raise ValueError(f"expected {_rule(model, axis)} of {model.name} ({axis} in {fitting}), but got {got}")


def candidates(model: Model, gpus: int) -> Iterator[ParallelDims]:
    """Every valid degree set for ``gpus`` GPUs: :func:`degree_fits` for each degree, and ``ep`` dividing
    ``dp_shard * cp * tp`` (module docstring).

    >>> from fmesh.plan.model import preset
    >>> len(list(candidates(preset("llama3-8b"), 16)))
    69
    """
    for tp in _divisors(gpus):
        if not degree_fits(model, "tp", tp):
            continue
        for cp in _divisors(gpus // tp):
            if not degree_fits(model, "cp", cp):
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if not degree_fits(model, "pp", pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if not degree_fits(model, "dp", dp):
                    continue
                for replicate in _divisors(dp):
                    region = dp // replicate * cp * tp  # where ep is carved from (etp = 1)
                    for ep in _divisors(max(1, model.experts)):
                        if region % ep == 0 and degree_fits(model, "ep", ep):
                            yield ParallelDims(gpus, pp=pp, dp_replicate=replicate, dp_shard=dp // replicate, cp=cp,
                                               tp=tp, ep=ep)


def micro_batch_choices(model: Model, dims: ParallelDims, sizes: Sequence[int] = MICRO_BATCHES) -> tuple[int, ...]:
    """The micro-batch sizes among ``sizes`` that divide each data-parallel rank's share of the global batch.

    >>> from fmesh.plan.model import preset
    >>> micro_batch_choices(preset("llama3-8b"), ParallelDims(256, dp_shard=128, tp=2))
    (1, 2, 4, 8)
    """
    share = model.global_batch // (dims.dp_replicate * dims.dp_shard)
    return tuple(b for b in sizes if share % b == 0)


def fits(model: Model, options: Options, dims: ParallelDims, hardware: Hardware) -> tuple[Recompute, Memory] | None:
    """The recomputation with which ``dims`` fits in the GPU's memory, and that memory; ``None`` if it does not.
    With ``options.recompute == "auto"``, the least recomputation that fits (none, then selective, then full);
    with a mode, that mode or ``None``.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> fits(preset("llama3-70b"), Options(), ParallelDims(8, tp=8, dp_shard=1), hardware("h100")) is None
    True
    >>> fits(preset("llama3-8b"), Options(recompute="full"), ParallelDims(8, tp=8), hardware("h100"))[0]
    'full'
    """
    for mode in RECOMPUTE_MODES if options.recompute == "auto" else (options.mode,):
        used = memory(model, attrs.evolve(options, recompute=mode), dims)
        if used.total <= hardware.memory:
            return mode, used
    return None


def _fitting(sized: Mapping[int, Model], chosen: Mapping[Recompute, Options], dims: ParallelDims,
             hardware: Hardware, sizes: Sequence[int]) -> Iterator[tuple[int, Recompute, Memory]]:
    """Each micro-batch of ``sizes`` with the least recomputation that fits, and its memory: :func:`fits`,
    with the parts that depend on neither (weights, gradients, optimizer, buffers) computed once. ``sized``: the
    model with each micro-batch; ``chosen``: the options with each recomputation mode to try, in order."""
    modes = list(chosen)
    fixed = memory(sized[sizes[0]], chosen[modes[0]], dims) if sizes else None
    for size in sizes:
        for mode in modes:
            activations = activation_memory(sized[size], chosen[mode], dims)
            if fixed is not None and fixed.total - fixed.activations + activations <= hardware.memory:
                yield size, mode, attrs.evolve(fixed, activations=activations)
                break


def search(model: Model, options: Options, gpus: int, gpus_per_node: int, hardware: Hardware, top: int = 5,
           micro_batches: Sequence[int] | None = None) -> tuple[Candidate, ...]:
    """The ``top`` fastest layouts that fit (module docstring), fastest first; empty when none fits.
    ``micro_batches``: the micro-batch sizes to try (default :data:`MICRO_BATCHES`; ``[model.micro_batch]``
    keeps the model's)."""
    hosts = max(1, gpus // gpus_per_node)
    sizes = MICRO_BATCHES if micro_batches is None else tuple(micro_batches)
    one = attrs.evolve(model, micro_batch=1)  # the data-parallel degree divides the batch; sizes are chosen below
    topologies = [Topology(hosts, gpus_per_node, rank_order=order) for order in RANK_ORDERS]
    # Branch and bound: every (degrees, micro-batch) that fits, by its compute time (a lower bound of its step
    # time); its collectives are costed, for both rank orders, only while some layout not yet ranked could
    # still beat the `top`-th that fits with its communicators. The answer is the exhaustive ranking's.
    sized = {size: attrs.evolve(model, micro_batch=size) for size in sizes}
    chosen = {mode: attrs.evolve(options, recompute=mode)
              for mode in (RECOMPUTE_MODES if options.recompute == "auto" else (options.mode,))}
    bounded = []
    for index, dims in enumerate(candidates(one if micro_batches is None else model, gpus)):
        for size, mode, used in _fitting(sized, chosen, dims, hardware, micro_batch_choices(model, dims, sizes)):
            bounded.append((compute_seconds(sized[size], chosen[mode], dims, hardware), index, size, dims, mode,
                            used))
    bounded.sort(key=lambda entry: entry[:3])
    placed: dict[int, list[tuple[RankOrder, Topology, dict[str, AxisSpan]]]] = {}
    costed: list[tuple[float, tuple[int, int, int], Candidate]] = []  # a heap: (step time, generation order, ...)
    kept: list[Candidate] = []

    def rank_below(bound: float) -> bool:
        """Keep, fastest first, the costed layouts no layout yet to cost can beat; True when ``top`` are kept."""
        while costed and costed[0][0] <= bound:
            candidate = heapq.heappop(costed)[2]
            with_buffers = with_communicators(candidate.memory, candidate.dims, gpus_per_node, candidate.rank_order)
            if with_buffers.total <= hardware.memory:
                kept.append(attrs.evolve(candidate, memory=with_buffers))
                if len(kept) == top:
                    return True
        return False

    for bound, index, size, dims, mode, used in bounded:
        if rank_below(bound):
            return tuple(kept)
        moved = traffic(sized[size], chosen[mode], dims)
        if index not in placed:
            meshes = _meshes(model, dims, moved)
            placed[index] = [(order, topology, {axis: topology.span(mesh, axis) for axis, mesh in meshes.items()})
                             for order, topology in zip(RANK_ORDERS, topologies, strict=True)]
        for number, (order, topology, spans) in enumerate(placed[index]):
            time = step_time(sized[size], chosen[mode], dims, hardware, topology, moved, spans)
            heapq.heappush(costed, (time.total, (index, number, sizes.index(size)),
                                    Candidate(dims, order, mode, used, time, size, crossing_axes(spans))))
    rank_below(math.inf)
    return tuple(kept)


def _meshes(model: Model, dims: ParallelDims, moved: Sequence[Transfer]) -> dict[str, Mesh]:
    """The 1-D mesh of every axis that moves bytes (``moved``), and of every bandwidth-hungry axis (placed once
    per rank order)."""
    hungry = {axis for axis in HUNGRY_AXES if getattr(dims, axis) > 1 and (axis != "ep" or model.experts)}
    return {axis: dims.mesh(axis) for axis in {t.axis for t in moved} | hungry}


def differences(best: Candidate, other: Candidate) -> tuple[str, ...]:
    """What ``best`` does differently from ``other``: each degree, the rank order, the micro-batch and the
    recomputation that differ, as ``"tp 8 instead of 4"``.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> a, b = search(preset("llama3-8b"), Options(), 64, 8, hardware("h100"), top=2)
    >>> differences(a, a), len(differences(a, b)) > 0
    ((), True)
    """
    found = [f"{n} {getattr(best.dims, n)} instead of {getattr(other.dims, n)}"
             for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
             if getattr(best.dims, n) != getattr(other.dims, n)]
    for name, mine, theirs in (("rank order", best.rank_order, other.rank_order),
                               ("micro-batch", best.micro_batch, other.micro_batch),
                               ("recompute", best.recompute, other.recompute)):
        if mine != theirs:
            found.append(f"{name} {mine} instead of {theirs}")
    return tuple(found)


def reason(best: Candidate, other: Candidate) -> str:
    """Why ``best`` beats ``other``, in one line: what it does differently (:func:`differences`) and the
    biggest of the differences in their step times that this buys.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> a, b = search(preset("llama3-8b"), Options(), 64, 8, hardware("h100"), top=2)
    >>> reason(a, b).startswith("-")
    True
    """
    parts = {
        "compute": other.time.compute - best.time.compute,
        "exposed tp/cp/ep/pp collectives": other.time.exposed_critical - best.time.exposed_critical,
        "FSDP/DP collectives beyond the compute": other.time.exposed_overlapped - best.time.exposed_overlapped,
        "optimizer step": other.time.optimizer - best.time.optimizer,
    }
    biggest = max(parts, key=lambda name: parts[name])
    saved = other.time.total - best.time.total
    share = saved / other.time.total if other.time.total else 0.0
    changed = ", ".join(differences(best, other)) or "the same layout"
    return (f"-{share:.1%} step time vs {other.label}: {changed}, {format_seconds(parts[biggest])} less "
            f"{biggest}")


def _sharding(stage: int) -> str:
    return "FSDP (ZeRO-3)" if stage == 3 else f"ZeRO-{stage}"


def alternatives(model: Model, options: Options, dims: ParallelDims, gpus_per_node: int, hardware: Hardware,
                 rank_order: RankOrder = "block") -> tuple[tuple[str, float], ...]:
    """Changes worth trying for a given layout: a factor of 2 moved between two axes (``ep`` kept), ``ep``
    doubled or halved (a mixture of experts), the micro-batch doubled or halved, another ZeRO stage (with
    data-parallel sharding), the zero-bubble schedule (for a plain 1F1B pipeline), or the other rank order, each
    with its change in step time (negative: faster), best first; only changes that help and fit, the
    communicators' buffers included (:func:`~fmesh.plan.memory.with_communicators`). A change names every
    degree it changes (``ep`` and ``etp`` included).

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import preset
    >>> changes = alternatives(preset("llama3-8b"), Options(), ParallelDims(64, dp_shard=4, tp=16), 8,
    ...                        hardware("h100"))
    >>> changes[0][0]
    'tp 8 instead of 16, pp 2 instead of 1'
    """
    hosts = max(1, dims.world_size // gpus_per_node)
    topology = Topology(hosts, gpus_per_node, rank_order=rank_order)
    fit = fits(model, options, dims, hardware)
    mode: Recompute = fit[0] if fit else ("full" if options.recompute == "auto" else options.mode)
    base = step_time(model, attrs.evolve(options, recompute=mode), dims, hardware, topology).total
    axes = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")
    valid = {tuple(getattr(d, n) for n in axes): d for d in candidates(model, dims.world_size)}
    degrees = [getattr(dims, n) for n in axes]
    moves: list[tuple[int, int]] = [(i, j) for i in range(5) for j in range(5) if i != j]
    if model.experts:
        moves += [(5, -1), (-1, 5)]  # ep halved, ep doubled
    found: list[tuple[str, float]] = []

    def costed(text: str, other_model: Model, other: ParallelDims, other_options: Options = options) -> None:
        other_fit = fits(other_model, other_options, other, hardware)
        if other_fit is None:
            return
        if with_communicators(other_fit[1], other, gpus_per_node, rank_order).total > hardware.memory:
            return
        seconds = step_time(other_model, attrs.evolve(other_options, recompute=other_fit[0]), other, hardware,
                            topology).total
        found.append((text, seconds / base - 1))

    for i, j in moves:
        changed = list(degrees)
        if i >= 0:
            if changed[i] % 2:
                continue
            changed[i] //= 2
        if j >= 0:
            changed[j] *= 2
        other = valid.get(tuple(changed))
        if other is None:
            continue
        text = ", ".join(f"{axes[k]} {changed[k]} instead of {degrees[k]}" for k in (i, j) if k >= 0)
        if model.experts and 5 not in (i, j):
            text += f" (ep {dims.ep} kept)"
        costed(text, model, other)
    share = model.global_batch // (dims.dp_replicate * dims.dp_shard)
    for size in (model.micro_batch // 2 if model.micro_batch % 2 == 0 else 0, model.micro_batch * 2):
        if size and share % size == 0:
            costed(f"micro-batch {size} instead of {model.micro_batch}", attrs.evolve(model, micro_batch=size), dims)
    if dims.dp_shard * dims.cp > 1:  # what the data-parallel shards split
        for stage in (z for z in ZERO_STAGES if z != options.zero):
            costed(f"{_sharding(stage)} instead of {_sharding(options.zero)}", model, dims,
                   attrs.evolve(options, zero=stage))
    if dims.pp > 1 and options.pipeline_schedule == "1f1b" and options.pipeline_interleave == 1:
        costed("pipeline schedule zb-h1 instead of 1f1b", model, dims, attrs.evolve(options, pipeline_schedule="zb-h1"))
    flipped: RankOrder = "cyclic" if rank_order == "block" else "block"
    seconds = step_time(model, attrs.evolve(options, recompute=mode), dims, hardware,
                        Topology(hosts, gpus_per_node, rank_order=flipped)).total
    used = with_communicators(fit[1], dims, gpus_per_node, flipped) if fit else None
    if used is not None and used.total <= hardware.memory:
        found.append((f"rank order {flipped} instead of {rank_order}", seconds / base - 1))
    return tuple(sorted((f for f in found if f[1] < 0), key=lambda f: f[1]))
