"""The meshes of a training job, before launching it: what ``python -m fmesh plan`` prints.

:func:`build_plan` takes a world, the ranks per host and the parallelism degrees, and answers with
every mesh the job uses, its groups, rank 0's group and how many hosts each group touches, as
JSON-ready data; :func:`format_plan` makes a table of it. Everything is layout arithmetic: a plan
for a million ranks takes a fraction of a second, and no process group is ever created.

>>> print(format_plan(build_plan(16, 8, tp=8)).splitlines()[0])
world 16 = 2 hosts x 8 ranks (block order); pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=8; data parallel: fsdp
"""

from __future__ import annotations

from typing import Any

from fmesh.mesh import Mesh
from fmesh.parallel import DEGREE_NAMES, WORLD_AXES, ParallelDims
from fmesh.topology import Topology, check_placement

__all__ = ["build_plan", "format_plan"]

_HEAD = 6  # ranks shown before an ellipsis
_FULL = 12  # groups up to this size are shown whole


def _rank0_group(mesh: Mesh) -> tuple[list[int], bool]:
    """Rank 0's group along all axes of ``mesh``: the first few ranks and the last, and whether that is all."""
    if mesh.size <= _FULL or mesh.frame or mesh.pinned.size > 1:
        group = mesh.group(0)
        if len(group) <= _FULL:
            return list(group), True
        return [*group[:_HEAD], group[-1]], False
    # Without enumerating: rank 0's group is base + layout(i), read through the universe's rank map.
    layout = mesh.axes_layout()
    _, base = layout.decompose(mesh.universe.slot_of(0))
    indices = [*range(_HEAD), mesh.size - 1]
    return [mesh.universe.rank_of(base + layout(i)) for i in indices], False


def _group_text(ranks: list[int], complete: bool, size: int) -> str:
    if complete:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:-1])) + f", ..., {ranks[-1]}] ({size} ranks)"


def build_plan(
    world_size: int,
    gpus_per_node: int,
    *,
    rank_order: str = "block",
    **degrees: int,
) -> dict[str, Any]:
    """The plan as JSON-ready data: degrees, each mesh with its groups and hosts, and warnings.

    ``degrees`` are :class:`~fmesh.ParallelDims` keywords (``pp``, ``dp_replicate``,
    ``dp_shard``, ``cp``, ``tp``, ``ep``, ``etp``).

    >>> plan = build_plan(16, 8, dp_replicate=2, tp=8)
    >>> [(m["name"], m["placement"]) for m in plan["meshes"]][:5]
    [('pp', 'intra-host'), ('dp_replicate', 'inter-host'), ('dp_shard', 'intra-host'), ('cp', 'intra-host'), \
('tp', 'intra-host')]
    """
    for key in degrees:
        if key not in DEGREE_NAMES:
            raise TypeError(f"unknown degree {key!r}: valid degrees are {DEGREE_NAMES}")
    if not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool) or gpus_per_node < 1:
        raise ValueError(f"gpus per node must be a positive int, got {gpus_per_node!r}")
    dims = ParallelDims(
        world_size,
        pp=degrees.get("pp", 1),
        dp_replicate=degrees.get("dp_replicate", 1),
        dp_shard=degrees.get("dp_shard", -1),
        cp=degrees.get("cp", 1),
        tp=degrees.get("tp", 1),
        ep=degrees.get("ep", 1),
        etp=degrees.get("etp", 1),
    )
    if world_size % gpus_per_node != 0:
        raise ValueError(
            f"world size {world_size} is not a multiple of {gpus_per_node} gpus per node: hosts must be full"
        )
    topo = Topology(world_size // gpus_per_node, gpus_per_node, rank_order)
    meshes = {
        name: mesh for name, mesh in dims.meshes().items() if dims.ep_enabled or name not in ("ep", "efsdp", "etp")
    }
    spans = topo.spans(meshes)
    fsdp = dims.fsdp_mesh()
    rows: list[tuple[str, Mesh]] = [*meshes.items(), ("fsdp_mesh", fsdp)]
    if dims.ep_enabled:
        rows.append(("expert_fsdp_mesh", dims.expert_fsdp_mesh()))
    entries = []
    for name, mesh in rows:
        span = spans[name] if name in spans else topo.span(mesh, name=name)
        ranks, complete = _rank0_group(mesh)
        entries.append(
            {
                "name": name,
                "axes": dict(mesh.shape),
                "size": mesh.size,
                "num_groups": span.num_groups,
                "rank0_group": ranks,
                "rank0_group_complete": complete,
                "hosts_per_group": span.hosts_max,
                "hosts_per_group_min": span.hosts_min,
                "placement": span.placement,
            }
        )
    return {
        "world_size": world_size,
        "gpus_per_node": gpus_per_node,
        "hosts": topo.hosts,
        "rank_order": rank_order,
        "degrees": {**{n: getattr(dims, n) for n in DEGREE_NAMES}, "efsdp": dims.efsdp},
        "data_parallel": dims.data_parallel,
        "meshes": entries,
        "warnings": list(check_placement(spans)),
    }


def format_plan(plan: dict[str, Any]) -> str:
    """A readable table of a :func:`build_plan` result.

    >>> format_plan(build_plan(8, 4, dp_shard=2, tp=4)).splitlines()[6].split()
    ['tp', '4', '2', '[0,', '1,', '2,', '3]', '1', 'intra-host']
    """
    degrees = plan["degrees"]
    world = " ".join(f"{n}={degrees[n]}" for n in WORLD_AXES)
    if degrees["ep"] > 1:
        world += f" ep={degrees['ep']} etp={degrees['etp']} efsdp={degrees['efsdp']}"
    lines = [
        f"world {plan['world_size']} = {plan['hosts']} hosts x {plan['gpus_per_node']} ranks "
        f"({plan['rank_order']} order); {world}; data parallel: {plan['data_parallel']}",
    ]
    table = [("mesh", "size", "groups", "rank 0's group", "hosts", "placement")]
    for entry in plan["meshes"]:
        name = entry["name"]
        if name.endswith("_mesh"):
            name += "(" + ", ".join(entry["axes"]) + ")"
        hosts = entry["hosts_per_group"]
        hosts_text = str(hosts) if hosts == entry["hosts_per_group_min"] else f"{entry['hosts_per_group_min']}..{hosts}"
        group = _group_text(entry["rank0_group"], entry["rank0_group_complete"], entry["size"])
        table.append((name, str(entry["size"]), str(entry["num_groups"]), group, hosts_text, entry["placement"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    aligned = (0, 1, 1, 0, 1, 0)  # 1: right-aligned numbers
    for row in table:
        cells = [cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(row, widths, aligned, strict=True)]
        lines.append("  ".join(cells).rstrip())
    for warning in plan["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
