"""The recovery plan as text: what ``python -m fmesh plan --lose`` and ``python -m fmesh diff --lose`` print.

>>> import fmesh
>>> from fmesh.plan.recovery import recover_job
>>> print(format_recovery(recover_job(fmesh.ParallelDims(8, dp_shard=4, tp=2), [2])).splitlines()[0])
lost ranks [2] of 8: world 8 -> 6 (1 lost -> 1 healthy GPUs idle)
"""

from __future__ import annotations

from collections.abc import Sequence

from fmesh.mesh import new_rank
from fmesh.plan.communicators import SHRINK_NCCL, SHRINK_TORCH
from fmesh.plan.manifest import Backend
from fmesh.plan.parallel import DEGREE_NAMES
from fmesh.plan.recovery import JobRecovery
from fmesh.plan.table import format_table

__all__ = ["format_recovery"]

_SHOWN = 8  # shards and ranks a text shows before an ellipsis


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:4]) + (f", +{len(names) - 4}" if len(names) > 4 else "")


def format_recovery(job: JobRecovery, backend: Backend = "nccl") -> str:
    """A readable account of :func:`~fmesh.plan.recovery.recover_job`: the jobs, the axis and why, the
    communicators and the data.

    >>> import fmesh
    >>> from fmesh.plan.recovery import recover_job
    >>> print(format_recovery(recover_job(fmesh.ParallelDims(8, dp_shard=4, tp=2), [2])).splitlines()[2])
    absorbed by dp_shard: dp_replicate=1 could not (the lost ranks lie in all 1 of its slices); dp_shard 4 -> 3: \
the parameters and optimizer state are resharded over fewer ranks
    """
    plan, counts = job.plan, job.plan.counts
    idle = job.before.world_size - job.after.world_size - len(job.lost)
    lines = [f"lost ranks {list(job.lost)} of {job.before.world_size}: world {job.before.world_size} -> "
             f"{job.after.world_size} ({len(job.lost)} lost -> {idle} healthy GPUs idle)",
             " -> ".join(" ".join(f"{n}={getattr(d, n)}" for n in DEGREE_NAMES) for d in (job.before, job.after)),
             f"absorbed by {job.axis}: {job.reason}",
             f"communicators: {counts['keep']} keep, {counts['shrink']} shrink, {counts['create']} create; "
             f"{counts['dropped']} old ones dropped"]
    if plan.shrink_groups:
        lines.append(f"{backend}: a communicator that lost members is shrunk (torch.distributed.shrink_group; "
                     f"torch >= {SHRINK_TORCH[0]}.{SHRINK_TORCH[1]}, NCCL >= {'.'.join(map(str, SHRINK_NCCL[:2]))})")
    else:
        lines.append(f"{backend}: cannot shrink a communicator, so one that lost members is created anew")
    rows = [("order", "action", "size", "groups", "shrunk", "from", "names")]
    for c in plan.communicators:
        source = "-" if c.source is None else f"{c.source.order} ({_names(c.source.names)})"
        rows.append((str(c.order), c.action, str(c.size), str(c.num_groups), str(c.groups_shrunk), source,
                     _names(c.names)))
    lines += format_table(rows, (True, False, True, True, True, False, False))
    for old in plan.dropped:
        lines.append(f"dropped: {old.order} ({_names(old.names)}), size {old.size}")
    lines += _format_data(job)
    return "\n".join(lines)


def _format_data(job: JobRecovery) -> list[str]:
    resharding = job.resharding
    if resharding is None:
        stages = f"{job.after.pp} stage" + ("s" if job.after.pp > 1 else "")
        return [f"data: the layers are re-split over {stages}; each rank loads its stage's layers "
                "from a checkpoint"]
    ranks = job.after.world_size // resharding.new_shards
    if resharding.identity:  # only dp_replicate keeps the shard count, and then every rank keeps its shard index
        return [f"data: nothing moves: every rank keeps its old rank's shard ({resharding.old_shards} shards "
                "before and after)"]
    lines = [f"data: {resharding.old_shards} shards -> {resharding.new_shards} (fsdp = dp_shard x cp); new shard j "
             f"covers [j/{resharding.new_shards}, (j+1)/{resharding.new_shards}) of each stage's and part's state, "
             f"{ranks} ranks each"]
    rows = [("new shard", "old shards [part]")]
    for j in range(resharding.new_shards):
        if j < _SHOWN - 1 or j == resharding.new_shards - 1:
            rows.append((str(j), ", ".join(map(str, resharding.pieces[j]))))
        elif j == _SHOWN - 1:
            rows.append(("…", f"({resharding.new_shards - _SHOWN} shards not shown)"))
    lines += format_table(rows, (True, False))
    lost = set(job.lost)
    sample = min(job.after.world_size, _SHOWN // 2)
    lines.append(f"what each new rank loads (a sample: the first {sample} of {job.after.world_size} new ranks; a piece "
                 "whose every holder is lost comes from the checkpoint):")
    for load in map(job.load, range(sample)):
        parts = []
        for piece, holders in zip(load.pieces, load.holders, strict=True):
            shown_holders = ", ".join(_holder(job, h, lost) for h in holders)
            alive = any(h not in lost for h in holders)  # a dropped holder is alive and can still send its piece
            parts.append(f"{piece} from {shown_holders}" + ("" if alive else ": from the checkpoint"))
        lines.append(f"  new rank {load.rank} (old {load.old_rank}): " + "; ".join(parts))
    return lines


def _holder(job: JobRecovery, rank: int, lost: set[int]) -> str:
    if rank in lost:
        return f"{rank} (lost)"
    now = new_rank(job.after.world_mesh, rank)
    return f"{rank} (dropped)" if now is None else f"{rank} (new {now})"

