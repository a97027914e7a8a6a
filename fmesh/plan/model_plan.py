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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fmesh.plan.costs import format_bytes
from fmesh.plan.hardware import Hardware
from fmesh.plan.jobs import job
from fmesh.plan.memory import Memory, with_communicators
from fmesh.plan.model import Model, Options, Recompute
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.rescale import ELASTIC_AXES, scale_down
from fmesh.plan.search import Candidate, alternatives, fits, reason, search
from fmesh.plan.step import StepTime, step_time
from fmesh.plan.topology import RankOrder, Topology
from fmesh.plan.traffic import Transfer, traffic

__all__ = ["LossCost", "ModelPlan", "plan_model"]


@attrs.frozen
class LossCost:
    """Losing ``lost`` ranks: the smaller job's degrees, the healthy GPUs it leaves idle, its step time."""

    lost: tuple[int, ...]
    dims: ParallelDims
    idle: int
    step_seconds: float


@attrs.frozen
class ModelPlan:
    """Everything :func:`plan_model` found (module docstring)."""

    model: Model
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
            "gpus_per_node": self.gpus_per_node,
            "rank_order": self.rank_order,
            "recompute": self.recompute,
            "memory_bytes": attrs.asdict(self.memory) | {"total": self.memory.total},
            "bytes_per_step": [attrs.asdict(t) for t in self.moved],
            "step_seconds": {"total": self.time.total, "compute": self.time.compute, "bubble": self.time.bubble,
                             "optimizer": self.time.optimizer, "exposed_critical": self.time.exposed_critical,
                             "exposed_overlapped": self.time.exposed_overlapped},
            "collective_seconds": [attrs.asdict(t) for t in self.time.collectives],
            "assumptions": list(self.time.assumptions),
            "ranked": [{"layout": c.label, "step_seconds": c.time.total, "memory_bytes": c.memory.total}
                       for c in self.ranked],
            "reasons": list(self.reasons),
            "changes": [{"change": text, "step_time_change": delta} for text, delta in self.changes],
            "loss": None if self.loss is None else {
                "lost": list(self.loss.lost), "world_size": self.loss.dims.world_size, "idle_gpus": self.loss.idle,
                "step_seconds": self.loss.step_seconds},
        }


def _no_fit(model: Model, hardware: Hardware, gpus: int, gpus_per_node: int, options: Options) -> ValueError:
    for more in (2, 4, 8, 16):
        if search(model, options, gpus * more, gpus_per_node, hardware, top=1):
            hint = f"it fits on {gpus * more} GPUs"
            break
    else:
        hint = f"it does not fit on {gpus * 16} GPUs either"
    return ValueError(f"expected a layout of {model.name} that fits in {format_bytes(hardware.memory)} per GPU on "
                      f"{gpus} GPUs, but none does ({hint}; or use GPUs with more memory)")


def plan_model(model: Model, options: Options, hardware: Hardware, world_size: int, gpus_per_node: int, *,
               degrees: Mapping[str, int] | None = None, rank_order: RankOrder = "block", top: int = 5,
               lose: Sequence[int] | None = None, absorb: Sequence[str] = ELASTIC_AXES) -> ModelPlan:
    """The plan of ``model`` on ``world_size`` GPUs: with ``degrees`` (keywords of
    :class:`~fmesh.ParallelDims`), that layout; without, the fastest the search finds (``top`` listed).

    ``lose``: ranks whose loss to cost, absorbed by the first axis of ``absorb`` that can
    (:func:`~fmesh.plan.rescale.scale_down`). ``ValueError`` names the value when nothing fits, or the given
    degrees do not fit (with the search's best).
    """
    hosts = max(1, world_size // gpus_per_node)
    ranked = search(model, options, world_size, gpus_per_node, hardware, top=top) if degrees is None else ()
    if degrees is None:
        if not ranked:
            raise _no_fit(model, hardware, world_size, gpus_per_node, options)
        best = ranked[0]
        dims, rank_order, recompute, used = best.dims, best.rank_order, best.recompute, best.memory
        reasons = tuple(reason(best, other) for other in ranked[1:])
    else:
        dims, _ = job(world_size, gpus_per_node, rank_order=rank_order, **degrees)
        fit = fits(model, options, dims, hardware)
        if fit is None:
            found = search(model, options, world_size, gpus_per_node, hardware, top=1)
            instead = f"{found[0].label} fits" if found else "no layout on these GPUs fits"
            raise ValueError(f"expected degrees whose memory fits in {format_bytes(hardware.memory)} per GPU, but "
                             f"{dims!r} does not with any recomputation ({instead})")
        recompute, used = fit
        used = with_communicators(used, dims, gpus_per_node, rank_order)
        if used.total > hardware.memory:
            raise ValueError(f"expected degrees whose memory fits in {format_bytes(hardware.memory)} per GPU, but "
                             f"{dims!r} needs {format_bytes(used.total)} with its communicators' buffers")
        reasons = ()
    chosen = attrs.evolve(options, recompute=recompute)
    moved = traffic(model, chosen, dims)
    time = step_time(model, chosen, dims, hardware, Topology(hosts, gpus_per_node, rank_order=rank_order), moved)
    changes = alternatives(model, options, dims, gpus_per_node, hardware, rank_order)[:3]
    loss = None
    if lose:
        smaller = scale_down(dims, lose, axes=absorb)
        small_hosts = max(1, smaller.world_size // gpus_per_node)
        seconds = step_time(model, chosen, smaller, hardware,
                            Topology(small_hosts, min(gpus_per_node, smaller.world_size))).total
        loss = LossCost(tuple(lose), smaller, dims.world_size - len(lose) - smaller.world_size, seconds)
    return ModelPlan(model, hardware, dims, rank_order, gpus_per_node, recompute, used, time, moved, ranked,
                     reasons, changes, loss)
