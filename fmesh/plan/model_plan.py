"""A model on a job, in one value: :func:`plan_model` (what ``python -m fmesh plan --model NAME`` prints).

For given degrees, or the fastest layout :func:`~fmesh.plan.search.search` finds, a :class:`ModelPlan` holds the
bytes per axis per step (:mod:`fmesh.plan.traffic`), the memory per GPU (:mod:`fmesh.plan.memory`), the step time
and its assumptions (:mod:`fmesh.plan.step`), the runners-up with the reason the layout beats each, the changes
worth trying, and what losing ``lose`` ranks costs: the job :func:`fmesh.plan.rescale.scale_down` leaves, the
healthy GPUs it idles, and its step time. :func:`fmesh.plan.model_table.format_model_plan` writes it as text,
:meth:`ModelPlan.to_json` as JSON.

>>> from fmesh.plan.hardware import hardware
>>> from fmesh.plan.model import Options, preset
>>> p = plan_model(preset("llama3-8b"), Options(), hardware("h100"), 64, 8, degrees={"dp_shard": 8, "tp": 8})
>>> p.dims.tp, p.recompute
(8, 'none')
>>> plan_model(preset("llama3-8b"), Options(recompute="full"), hardware("h100"), 64, 8,
...            degrees={"dp_shard": 8, "tp": 8}).recompute
'full'
>>> plan_model(preset("llama3-70b"), Options(), hardware("h100"), 64, 8, degrees={"dp_shard": 4, "tp": 16})
Traceback (most recent call last):
...
ValueError: expected tp dividing the 64 heads, the 8 KV heads and the FFN size 28672 of llama3-70b \
(tp in 1, 2, 4, 8), but got tp=16
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fmesh.plan.costs import format_bytes
from fmesh.plan.hardware import Hardware
from fmesh.plan.jobs import build_plan, job
from fmesh.plan.memory import Memory, memory, micro_batches, with_communicators
from fmesh.plan.model import RECOMPUTE_MODES, Model, Options, Recompute
from fmesh.plan.parallel import DEGREE_NAMES, ParallelDims
from fmesh.plan.rescale import ELASTIC_AXES, scale_down
from fmesh.plan.search import Candidate, alternatives, check_degrees, degree_fits, fits, reason, search
from fmesh.plan.step import StepTime, step_time
from fmesh.plan.topology import RankOrder, Topology
from fmesh.plan.traffic import Transfer, traffic

__all__ = ["LossCost", "ModelPlan", "plan_model"]


@attrs.frozen
class LossCost:
    """Losing ``lost`` ranks: the smaller job (its degrees, and the global batch it trains on: ``global_batch``
    sequences, ``micro_batches`` micro-batches per data-parallel rank per step), the healthy GPUs it leaves idle,
    its memory per GPU (communicators included) and whether it fits, its step time, and ``assumed``: what it
    does with the batch (and, where the survivors do not fill whole hosts, how they are placed)."""

    lost: tuple[int, ...]
    dims: ParallelDims
    idle: int
    global_batch: int
    micro_batches: int
    memory: Memory
    fits: bool
    step_seconds: float
    assumed: tuple[str, ...]


@attrs.frozen
class ModelPlan:
    """Everything :func:`plan_model` found (module docstring)."""

    model: Model
    options: Options
    hardware: Hardware
    dims: ParallelDims
    rank_order: RankOrder
    gpus_per_node: int
    recompute: Recompute
    memory: Memory
    time: StepTime
    moved: tuple[Transfer, ...]
    ranked: tuple[Candidate, ...]
    reasons: tuple[str, ...]
    changes: tuple[tuple[str, float], ...]
    loss: LossCost | None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the plan.

        >>> from fmesh.plan.hardware import hardware
        >>> from fmesh.plan.model import preset
        >>> p = plan_model(preset("llama3-8b"), Options(), hardware("h100"), 16, 8, degrees={"tp": 8})
        >>> sorted(p.to_json())[:4]
        ['assumptions', 'bytes_per_step', 'changes', 'collective_seconds']
        """
        return {
            "model": self.model.name,
            "hardware": self.hardware.name,
            "degrees": {n: getattr(self.dims, n) for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")},
            "world_size": self.dims.world_size,
            "global_batch": self.model.global_batch,
            "seq_len": self.model.seq_len,
            "micro_batch": self.model.micro_batch,
            "micro_batches": micro_batches(self.model, self.dims),
            "warnings": list(self.warnings),
            "gpus_per_node": self.gpus_per_node,
            "rank_order": self.rank_order,
            "recompute": self.recompute,
            "options": attrs.asdict(self.options),
            "gpu_memory_bytes": self.hardware.memory,
            "memory_bytes": attrs.asdict(self.memory) | {"total": self.memory.total},
            "bytes_per_step": [attrs.asdict(t) for t in self.moved],
            "step_seconds": {"total": self.time.total, "compute": self.time.compute, "bubble": self.time.bubble,
                             "optimizer": self.time.optimizer, "exposed_critical": self.time.exposed_critical,
                             "exposed_overlapped": self.time.exposed_overlapped},
            "collective_seconds": [attrs.asdict(t) for t in self.time.collectives],
            "assumptions": list(self.time.assumptions),
            "ranked": [{"layout": c.label, "micro_batch": c.micro_batch, "recompute": c.recompute,
                        "across_hosts": list(c.crossing), "step_seconds": c.time.total,
                        "memory_bytes": c.memory.total} for c in self.ranked],
            "reasons": list(self.reasons),
            "changes": [{"change": text, "step_time_change": delta} for text, delta in self.changes],
            "loss": None if self.loss is None else {
                "lost": list(self.loss.lost), "world_size": self.loss.dims.world_size, "idle_gpus": self.loss.idle,
                "degrees": {n: getattr(self.loss.dims, n) for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp",
                                                                    "ep")},
                "global_batch": self.loss.global_batch, "micro_batches": self.loss.micro_batches,
                "memory_bytes": attrs.asdict(self.loss.memory) | {"total": self.loss.memory.total},
                "fits": self.loss.fits, "step_seconds": self.loss.step_seconds, "assumed": list(self.loss.assumed)},
        }


def _no_fit(model: Model, hardware: Hardware, gpus: int, gpus_per_node: int, options: Options) -> ValueError:
    for more in (2, 4, 8, 16):
        if search(model, options, gpus * more, gpus_per_node, hardware, top=1):
            hint = f"it fits on {gpus * more} GPUs"
            break
    else:
        hint = f"it does not fit on {gpus * 16} GPUs either"
    how = "" if options.recompute == "auto" else f" with recompute {options.recompute}"
    return ValueError(f"expected a layout of {model.name} that fits in {format_bytes(hardware.memory)} per GPU on "
                      f"{gpus} GPUs{how}, but none does ({hint}; or use GPUs with more memory)")


def _loss_cost(model: Model, options: Options, hardware: Hardware, dims: ParallelDims, gpus_per_node: int,
               rank_order: RankOrder, lose: Sequence[int], absorb: Sequence[str]) -> LossCost:
    """The smaller job :func:`scale_down` leaves, on one consistent batch (:class:`LossCost`)."""
    smaller = scale_down(dims, lose, axes=absorb)
    dp, m, micro = smaller.dp_replicate * smaller.dp_shard, micro_batches(model, dims), model.micro_batch
    batches = model.global_batch // micro
    if degree_fits(model, "dp", dp):
        small_model, small_m = model, batches // dp
        assumed = [f"keeps the global batch of {model.global_batch} sequences: {small_m} micro-batch(es) of {micro} "
                   f"per data-parallel rank (was {m}), {dp} ranks"]
    else:
        small_m = m
        small_model = attrs.evolve(model, global_batch=dp * m * micro)
        keep = max(d for d in range(1, dp + 1) if batches % d == 0)
        assumed = [f"dp={dp} does not divide the global batch of {model.global_batch} sequences in micro-batches of "
                   f"{micro} (uneven shares are not allowed), so each of the {dp} data-parallel ranks keeps its {m} "
                   f"micro-batch(es) per step and the global batch becomes {small_model.global_batch} sequences; "
                   f"keeping {model.global_batch} needs a dp dividing {batches} (at most {keep} of these {dp} ranks)"]
    per_node = gpus_per_node if smaller.world_size % gpus_per_node == 0 else math.gcd(smaller.world_size,
                                                                                          gpus_per_node)
    if per_node != gpus_per_node:
        assumed.append(f"the {smaller.world_size} survivors do not fill hosts of {gpus_per_node}: costed on "
                       f"{smaller.world_size // per_node} hosts of {per_node}")
    used = with_communicators(memory(small_model, options, smaller), smaller, per_node, rank_order)
    topology = Topology(smaller.world_size // per_node, per_node, rank_order=rank_order)
    seconds = step_time(small_model, options, smaller, hardware, topology).total
    if used.total > hardware.memory:
        assumed.append(f"it needs {format_bytes(used.total)} per GPU of {format_bytes(hardware.memory)} with "
                       f"recompute {options.mode}: it must recompute more or take smaller micro-batches")
    return LossCost(tuple(lose), smaller, dims.world_size - len(lose) - smaller.world_size,
                    small_model.global_batch, small_m, used, used.total <= hardware.memory, seconds, tuple(assumed))


def plan_model(model: Model, options: Options, hardware: Hardware, world_size: int, gpus_per_node: int, *,
               degrees: Mapping[str, int] | None = None, rank_order: RankOrder = "block", top: int = 5,
               lose: Sequence[int] | None = None, absorb: Sequence[str] = ELASTIC_AXES,
               micro_batches: Sequence[int] | None = None) -> ModelPlan:
    """The plan of ``model`` on ``world_size`` GPUs: with ``degrees`` (keywords of
    :class:`~fmesh.ParallelDims`), that layout and ``model.micro_batch``; without, the fastest the search finds
    (``top`` listed), its micro-batch among ``micro_batches`` (default
    :data:`~fmesh.plan.search.MICRO_BATCHES`; the plan's ``model`` has the chosen one).
    ``options.recompute``: ``"auto"`` takes the least recomputation that fits, a mode is kept. ``warnings``
    name every bandwidth-hungry axis whose groups cross hosts, as ``python -m fmesh plan`` prints them.

    ``lose``: ranks whose loss to cost, absorbed by the first axis of ``absorb`` that can
    (:func:`~fmesh.plan.rescale.scale_down`), on one consistent batch (:class:`LossCost`). ``ValueError``
    names the value when nothing fits, when a given degree does not suit the model
    (:func:`~fmesh.plan.search.check_degrees`), or the given degrees do not fit (with the search's best).
    """
    hosts = max(1, world_size // gpus_per_node)
    ranked = (search(model, options, world_size, gpus_per_node, hardware, top=top, micro_batches=micro_batches)
              if degrees is None else ())
    if degrees is None:
        if not ranked:
            raise _no_fit(model, hardware, world_size, gpus_per_node, options)
        best = ranked[0]
        dims, rank_order, recompute, used = best.dims, best.rank_order, best.recompute, best.memory
        model = attrs.evolve(model, micro_batch=best.micro_batch)
        reasons = tuple(reason(best, other) for other in ranked[1:])
    else:
        dims, _ = job(world_size, gpus_per_node, rank_order=rank_order, **degrees)
        check_degrees(model, dims)
        fit = fits(model, options, dims, hardware)
        if fit is None:
            found = search(model, options, world_size, gpus_per_node, hardware, top=1)
            instead = f"{found[0].label} fits" if found else "no layout on these GPUs fits"
            how = "any recomputation" if options.recompute == "auto" else f"recompute {options.recompute}"
            raise ValueError(f"expected degrees whose memory fits in {format_bytes(hardware.memory)} per GPU, but "
                             f"{dims!r} does not with {how} ({instead})")
        recompute, used = fit
        used = with_communicators(used, dims, gpus_per_node, rank_order)
        for more in RECOMPUTE_MODES[RECOMPUTE_MODES.index(recompute) + 1:] if options.recompute == "auto" else ():
            if used.total <= hardware.memory:
                break  # the communicators' buffers fit too; else recompute more (auto only)
            recompute = more
            used = with_communicators(memory(model, attrs.evolve(options, recompute=more), dims), dims,
                                      gpus_per_node, rank_order)
        if used.total > hardware.memory:
            raise ValueError(f"expected degrees whose memory fits in {format_bytes(hardware.memory)} per GPU, but "
                             f"{dims!r} needs {format_bytes(used.total)} with its communicators' buffers")
        reasons = ()
    chosen = attrs.evolve(options, recompute=recompute)
    moved = traffic(model, chosen, dims)
    time = step_time(model, chosen, dims, hardware, Topology(hosts, gpus_per_node, rank_order=rank_order), moved)
    changes = alternatives(model, options, dims, gpus_per_node, hardware, rank_order)[:3]
    loss = _loss_cost(model, chosen, hardware, dims, gpus_per_node, rank_order, lose, absorb) if lose else None
    placed = build_plan(world_size, gpus_per_node, rank_order=rank_order, links=hardware.links,
                        **{name: getattr(dims, name) for name in DEGREE_NAMES})
    return ModelPlan(model, options, hardware, dims, rank_order, gpus_per_node, recompute, used, time, moved, ranked,
                     reasons, changes, loss, placed.warnings)
