"""``python -m fmesh``: a short demo, and ``python -m fmesh plan``: the meshes of a job before launching it.

Everything here is pure layout arithmetic: a plan for a million ranks prints at once,
and no process group is ever created.

>>> print(format_plan(build_plan(16, 8, tp=8)).splitlines()[0])
world 16 = 2 hosts x 8 ranks (block order); pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=8; data parallel: fsdp
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from fmesh.mesh import Mesh, make_mesh
from fmesh.parallel import DEGREE_NAMES, WORLD_AXES, ParallelDims
from fmesh.topology import Topology, check_placement

__all__ = ["build_plan", "demo", "format_plan", "main"]

_HEAD = 6  # ranks shown before an ellipsis
_FULL = 12  # groups up to this size are shown whole


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


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
        cells = [cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(row, widths, aligned)]
        lines.append("  ".join(cells).rstrip())
    for warning in plan["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def demo() -> str:
    """A 2x2x4 (dp, cp, tp) mesh and its groups along each axis.

    >>> print(demo().splitlines()[0])
    Mesh(dp=2, cp=2, tp=4; world=16)
    """
    mesh = make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    lines = [repr(mesh), f"ranks: {mesh.ranks().tolist()}"]
    for axes in [*((n,) for n in mesh.axis_names), ("dp", "cp")]:
        groups = " ".join("[" + ",".join(map(str, g)) + "]" for g in mesh.groups(axes))
        lines.append(f"groups along {'x'.join(axes):6} {groups}")
    lines.append("plan a job: python -m fmesh plan --world-size 64 --gpus-per-node 8 --tp 8 [--json]")
    return "\n".join(lines)


def _parser() -> _Parser:
    parser = _Parser(prog="python -m fmesh", description="Functional device meshes for PyTorch.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    plan = sub.add_parser("plan", help="print the meshes of a training job before launching it")
    plan.add_argument("--world-size", type=int, required=True, help="total number of ranks")
    plan.add_argument("--gpus-per-node", type=int, required=True, help="ranks per host")
    for name in DEGREE_NAMES:
        default = -1 if name == "dp_shard" else 1
        plan.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=int, default=default, help=f"degree (default {default})"
        )
    plan.add_argument(
        "--rank-order",
        choices=("block", "cyclic"),
        default="block",
        help="block: ranks 0..G-1 on host 0 (torchrun); cyclic: rank r on host r %% hosts",
    )
    plan.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments, with a one-line message).

    >>> import io; out = io.StringIO()
    >>> main(["plan", "--world-size", "8", "--gpus-per-node", "3"], stderr=out), out.getvalue()
    (2, 'fmesh plan: error: world size 8 is not a multiple of 3 gpus per node: hosts must be full\\n')
    """
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = "plan" if args_list[:1] == ["plan"] else None
    prefix = f"fmesh {command}" if command else "fmesh"
    try:
        args = _parser().parse_args(args_list)
        if args.command is None:
            print(demo(), file=out)
            return 0
        degrees = {name: getattr(args, name) for name in DEGREE_NAMES}
        plan = build_plan(args.world_size, args.gpus_per_node, rank_order=args.rank_order, **degrees)
    except _UsageError as error:
        print(f"{prefix}: error: {error}", file=err)
        return 2
    except (ValueError, TypeError, KeyError) as error:
        message = error.args[0] if error.args else str(error)
        print(f"{prefix}: error: {message}", file=err)
        return 2
    print(json.dumps(plan, indent=2) if args.json else format_plan(plan), file=out)
    return 0
