"""The model-aware plan as text: what ``python -m fmesh plan --model NAME`` prints (:func:`format_model_plan`)."""

from __future__ import annotations

from fmesh.plan.costs import format_bytes, format_seconds
from fmesh.plan.memory import micro_batches
from fmesh.plan.model_plan import ModelPlan
from fmesh.plan.table import format_table

__all__ = ["format_model_plan"]


def format_model_plan(plan: ModelPlan) -> str:
    """The plan as text: layout, memory, bytes per axis, step time and assumptions, runners-up, changes, loss.

    >>> from fmesh.plan.hardware import hardware
    >>> from fmesh.plan.model import Options, preset
    >>> from fmesh.plan.model_plan import plan_model
    >>> text = format_model_plan(plan_model(preset("llama3-8b"), Options(), hardware("h100"), 16, 8,
    ...                                     degrees={"tp": 8}))
    >>> text.splitlines()[0]
    'llama3-8b on 16 GPUs (2 nodes of 8, H100 SXM 80GB (DGX H100: NVLink 4, 8 x 400 Gb/s NDR IB))'
    >>> format_model_plan(plan_model(preset("llama3-8b"), Options(), hardware("h100"), 8, 8,
    ...                              degrees={"tp": 8})).splitlines()[0].split("(")[1]
    '1 node of 8, H100 SXM 80GB '
    """
    dims, m, t = plan.dims, plan.memory, plan.time
    degrees = " ".join(f"{n}={getattr(dims, n)}" for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep"))
    nodes = dims.world_size // plan.gpus_per_node
    lines = [f"{plan.model.name} on {dims.world_size} GPUs ({nodes} node{'' if nodes == 1 else 's'} of "
             f"{plan.gpus_per_node}, {plan.hardware.name})",
             f"layout: {degrees}, rank order {plan.rank_order}, recompute {plan.recompute}",
             f"batch: {plan.model.global_batch} sequences of {plan.model.seq_len} tokens per step, micro-batch "
             f"{plan.model.micro_batch} ({micro_batches(plan.model, dims)} per data-parallel rank per step)",
             *(f"warning: {w}" for w in plan.warnings),
             f"memory per GPU (GiB = 2^30 bytes): {format_bytes(m.total)} of {format_bytes(plan.hardware.memory)} "
             f"usable (weights "
             f"{format_bytes(m.weights)}, gradients {format_bytes(m.gradients)}, optimizer "
             f"{format_bytes(m.optimizer)}, activations {format_bytes(m.activations)}, buffers "
             f"{format_bytes(m.buffers)}, communicators {format_bytes(m.communicators)})",
             f"step time: {format_seconds(t.total)} (compute {format_seconds(t.compute)} incl. bubble "
             f"{format_seconds(t.bubble)}, optimizer {format_seconds(t.optimizer)}, exposed collectives "
             f"{format_seconds(t.exposed_critical + t.exposed_overlapped)})", "", "bytes per step, one rank:"]
    seconds = {(a.axis, a.collective): a.seconds for a in t.collectives}
    rows = [["axis", "collective", "calls", "bytes", "time", "for"]]
    rows += [[x.axis, x.collective, str(x.calls), format_bytes(x.nbytes),
              format_seconds(seconds.get((x.axis, x.collective), 0.0)), x.purpose] for x in plan.moved]
    lines += format_table(rows, [False, False, True, True, True, False])
    lines += ["", "assumptions:", *(f"  {a}" for a in t.assumptions)]
    if plan.ranked:
        lines += ["", "the search's best layouts:"]
        lines += [f"  {i + 1}. {c.label}: {format_seconds(c.time.total)}, {format_bytes(c.memory.total)}/GPU"
                  for i, c in enumerate(plan.ranked)]
        lines += ["why the first wins:", *(f"  {r}" for r in plan.reasons)]
    if plan.changes:
        lines += ["", "changes worth trying:", *(f"  {text}: {delta:+.1%} step time" for text, delta in plan.changes)]
    if plan.loss is not None:
        loss = plan.loss
        small = " ".join(f"{n}={getattr(loss.dims, n)}" for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
                         if getattr(loss.dims, n) > 1)
        lines += ["", f"losing ranks {list(loss.lost)}: the job goes on with {loss.dims.world_size} GPUs ({small}); "
                      f"{loss.idle} healthy GPUs idle; global batch {loss.global_batch} sequences; memory per GPU "
                      f"{format_bytes(loss.memory.total)} ({'fits' if loss.fits else 'does not fit'}); step time "
                      f"{format_seconds(loss.step_seconds)} ({loss.step_seconds / t.total - 1:+.1%}), sequences per "
                      f"second {loss.global_batch * t.total / (plan.model.global_batch * loss.step_seconds) - 1:+.1%}",
                  *(f"  assumed: {a}" for a in loss.assumed)]
    return "\n".join(lines)
