"""``python -m fmesh``: a short demo, and ``python -m fmesh plan``: the meshes of a job before launching it.

Argument parsing and printing only; the plan itself is :mod:`fmesh.planning`. Nothing here needs
torch or creates a process group.

>>> import io; out = io.StringIO()
>>> main(["plan", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8"], stdout=out)
0
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from fmesh.errors import CommandLineError
from fmesh.mesh import make_mesh
from fmesh.parallel import DEGREE_NAMES
from fmesh.planning import build_plan, format_plan

__all__ = ["demo", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit; we say one line
        raise CommandLineError(message)


def demo() -> str:
    """A 2x2x4 (dp, cp, tp) mesh and its groups along each axis.

    >>> print(demo().splitlines()[0])
    Mesh(dp=2, cp=2, tp=4; world=16)
    """
    mesh = make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    lines = [repr(mesh), f"ranks: {mesh.rank_grid()}"]
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
    except (ValueError, TypeError, KeyError) as error:  # CommandLineError is a ValueError
        message = error.args[0] if error.args else str(error)
        print(f"{prefix}: error: {message}", file=err)
        return 2
    print(json.dumps(plan, indent=2) if args.json else format_plan(plan), file=out)
    return 0
