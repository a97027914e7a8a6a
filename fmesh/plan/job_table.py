"""The job plan as text: what ``python -m fmesh plan`` prints.

>>> from fmesh.plan.jobs import build_plan
>>> print(format_plan(build_plan(16, 8, tp=8)).splitlines()[0])
world 16 = 2 hosts x 8 ranks (block order); pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=8; data parallel: fsdp
"""

from __future__ import annotations

from collections.abc import Sequence

from fmesh.plan.costs import format_bytes, format_seconds
from fmesh.plan.jobs import DEFAULT_COST_BYTES, JobPlan
from fmesh.plan.parallel import WORLD_AXES
from fmesh.plan.table import format_table

__all__ = ["format_plan"]

def _group_text(ranks: Sequence[int], complete: bool, size: int) -> str:
    if complete:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:-1])) + f", ..., {ranks[-1]}] ({size} ranks)"


def format_plan(plan: JobPlan) -> str:
    """A readable table of a :func:`~fmesh.plan.jobs.build_plan` result.

    >>> from fmesh.plan.jobs import build_plan
    >>> format_plan(build_plan(8, 4, dp_shard=2, tp=4)).splitlines()[6].split()
    ['tp', '4', '2', '[0,', '1,', '2,', '3]', '1', 'intra-host', 'all_reduce', '924', 'µs']
    """
    degrees = dict(plan.degrees)
    world = " ".join(f"{n}={degrees[n]}" for n in WORLD_AXES)
    if degrees["ep"] > 1:
        world += f" ep={degrees['ep']} etp={degrees['etp']} efsdp={degrees['efsdp']}"
    lines = [
        f"world {plan.world_size} = {plan.hosts} hosts x {plan.gpus_per_node} ranks "
        f"({plan.rank_order} order); {world}; data parallel: {plan.data_parallel}",
    ]
    nbytes = plan.meshes[0].cost.nbytes if plan.meshes else DEFAULT_COST_BYTES
    table = [("mesh", "size", "groups", "rank 0's group", "hosts", "placement", f"cost of {format_bytes(nbytes)}")]
    for entry in plan.meshes:
        name = entry.name
        if name.endswith("_mesh"):
            name += "(" + ", ".join(axis for axis, _ in entry.axes) + ")"
        hosts = entry.hosts_per_group
        hosts_text = str(hosts) if hosts == entry.hosts_per_group_min else f"{entry.hosts_per_group_min}..{hosts}"
        group = _group_text(entry.rank0_group, entry.rank0_group_complete, entry.size)
        cost_text = f"{entry.cost.collective} {format_seconds(entry.cost.seconds)}"
        table.append((name, str(entry.size), str(entry.num_groups), group, hosts_text, entry.placement, cost_text))
    lines += format_table(table, (False, True, True, False, True, False, False))  # numbers right-aligned
    lines.append(f"cost: one collective per group, {plan.links} (fmesh.cost)")
    for warning in plan.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
