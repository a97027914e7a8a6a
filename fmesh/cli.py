"""``python -m fmesh``: a short demo; ``python -m fmesh plan``: the meshes of a job before launching it
(``--manifest FILE`` also writes its communicator manifest; ``--lose RANKS`` prints the recovery plan after losing
those ranks instead; ``--model NAME [--hardware KIND] [--search]`` plans a model on the job: bytes per axis,
memory and step time, the search's best layouts); ``python -m fmesh diff A B``: two plans compared
(``--lose RANKS``: B is A after that loss).

Argument parsing and printing only: everything it prints is made in :mod:`fmesh.plan` (the plan
:mod:`~fmesh.plan.jobs`, the manifest :mod:`~fmesh.plan.manifest`, the diff :mod:`~fmesh.plan.manifest_diff`, the
recovery plan :mod:`~fmesh.plan.recovery`, the costs :mod:`~fmesh.plan.costs`) and written as text by one table
module each (:mod:`~fmesh.plan.job_table`, :mod:`~fmesh.plan.manifest_table`, :mod:`~fmesh.plan.diff_table`,
:mod:`~fmesh.plan.recovery_table`). Nothing here needs torch or creates a process group.

>>> import io; out = io.StringIO()
>>> main(["plan", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8"], stdout=out)
0
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import attrs

from fmesh.errors import CommandLineError
from fmesh.mesh import make_mesh
from fmesh.plan.costs import H100_IB, LOOPBACK, Links
from fmesh.plan.diff_table import format_diff
from fmesh.plan.hardware import HARDWARE, hardware
from fmesh.plan.job_table import format_plan
from fmesh.plan.jobs import DEFAULT_COST_BYTES, build_plan, job
from fmesh.plan.manifest import Manifest, dump_manifest, load_manifest, plan_manifest
from fmesh.plan.manifest_diff import compare
from fmesh.plan.manifest_table import format_manifest
from fmesh.plan.model import (
    GRADIENT_SYNCS,
    PIPELINE_SCHEDULES,
    PRESETS,
    RECOMPUTE_CHOICES,
    ZERO_STAGES,
    Model,
    Options,
    from_config,
    preset,
)
from fmesh.plan.model_plan import plan_model
from fmesh.plan.model_table import format_model_plan
from fmesh.plan.parallel import DEGREE_NAMES
from fmesh.plan.recovery import JobRecovery, recover_job, recover_manifests
from fmesh.plan.recovery_table import format_recovery
from fmesh.plan.rescale import ELASTIC_AXES
from fmesh.plan.search import MICRO_BATCHES

__all__ = ["LINKS", "demo", "main", "parse_bytes", "parse_ranks"]


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


LINKS: dict[str, Links] = {"h100-ib": H100_IB, "loopback": LOOPBACK}
"""The link profiles ``--links`` names (:mod:`fmesh.plan.costs`)."""

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def parse_bytes(text: str) -> int:
    """``"256MiB"``, ``"1g"``, ``"4096"``: a number of bytes (binary units).

    >>> parse_bytes("256MiB"), parse_bytes("1.5 GiB"), parse_bytes("100")
    (268435456, 1610612736, 100)
    """
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected bytes such as 4096, 256MiB or 1GiB, but got {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_ranks(text: str) -> tuple[int, ...]:
    """``"5,9"``: the ranks ``--lose`` names.

    >>> parse_ranks("5,9"), parse_ranks(" 3 ")
    ((5, 9), (3,))
    """
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"-?[0-9]+", part) for part in parts):
        raise argparse.ArgumentTypeError(f"expected ranks as comma-separated ints such as 5,9, but got {text!r}")
    return tuple(int(part) for part in parts)


def _parse_axes(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


def _add_lose_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--lose", metavar="RANKS", type=parse_ranks, help=what)
    parser.add_argument("--absorb", metavar="AXES", type=_parse_axes,
                        help="with --lose: the axes that may absorb the loss, in the order tried (default "
                             f"{','.join(ELASTIC_AXES)}; pp may be added)")


def _add_plan_arguments(plan: argparse.ArgumentParser) -> None:
    plan.add_argument("--world-size", type=int, required=True, help="total number of ranks")
    plan.add_argument("--gpus-per-node", type=int, required=True, help="ranks per host")
    for name in DEGREE_NAMES:
        default = -1 if name == "dp_shard" else 1
        plan.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=int, default=default,
            help=_DEGREE_HELP.get(name, f"degree (default {default})")
        )
    plan.add_argument(
        "--rank-order",
        choices=("block", "cyclic"),
        default="block",
        help="block: ranks 0..G-1 on host 0 (torchrun); cyclic: rank r on host r %% hosts",
    )
    plan.add_argument("--json", action="store_true", help="print JSON for scripts")
    plan.add_argument("--cost-bytes", type=parse_bytes, default=DEFAULT_COST_BYTES,
                      help="bytes of the collective the cost column times (default 256MiB)")
    plan.add_argument("--links", choices=tuple(LINKS), default="h100-ib",
                      help="link bandwidths and latencies of the cost model (default h100-ib)")
    plan.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                      help="backend of the communicators in the manifest (default nccl)")
    plan.add_argument("--manifest", metavar="FILE", help="also write the communicator manifest (JSON) to FILE")
    plan.add_argument("--model", metavar="NAME",
                      help=f"plan this model (one of {', '.join(PRESETS)}, or a JSON file of "
                           "fmesh.plan.model.Model's fields): bytes per axis, memory and step time")
    plan.add_argument("--hardware", choices=tuple(HARDWARE), default="h100",
                      help="with --model: the GPUs and links (default h100)")
    plan.add_argument("--search", action="store_true",
                      help="with --model: search every layout for --world-size GPUs instead of taking the degrees")
    batch = plan.add_argument_group("the batch (with --model; the preset's or the config file's by default)")
    batch.add_argument("--global-batch", type=int, metavar="N", help="sequences per step, the whole job")
    batch.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence")
    batch.add_argument("--micro-batch", type=int, metavar="N",
                       help="sequences per micro-batch; with --search it is kept (default: the search tries "
                            f"{', '.join(map(str, MICRO_BATCHES))})")
    model = plan.add_argument_group("training options (with --model; fmesh.plan.model.Options)")
    model.add_argument("--recompute", choices=RECOMPUTE_CHOICES,
                       help="activation recomputation: auto (default) takes the least that fits; a mode is kept, "
                            "and a layout that does not fit with it does not fit")
    model.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction,
                       help="with tp > 1, split the activations outside the tensor-parallel regions along the "
                            "sequence (all_gather/reduce_scatter instead of all_reduce; default on)")
    model.add_argument("--efficiency", type=float,
                       help="the fraction of the GPU's peak FLOP/s the matrix multiplies reach (default 0.5, a "
                            "stated guess; on A100s, bench/planner_validation.py --fit-all fits 0.71 with "
                            "--efficiency-half-width 175 --elementwise-bytes 269)")
    model.add_argument("--flash-attention", action=argparse.BooleanOptionalAction,
                       help="the s x s attention scores are never stored (default on)")
    model.add_argument("--dropout", action=argparse.BooleanOptionalAction,
                       help="dropout masks are stored (default off, as in Llama)")
    model.add_argument("--pipeline-interleave", type=int, metavar="V",
                       help="model chunks per pipeline rank (interleaved 1F1B; default 1: plain 1F1B)")
    model.add_argument("--pipeline-schedule", choices=PIPELINE_SCHEDULES,
                       help="1f1b (default; interleaved with --pipeline-interleave) or zb-h1 (zero-bubble: the "
                            "weight gradients fill the bubble, a third of 1F1B's, with 1F1B's memory)")
    model.add_argument("--pipeline-scatter-gather", action=argparse.BooleanOptionalAction,
                       help="without sequence parallelism, send 1/tp of the activations per tensor-parallel rank to "
                            "the next stage and all-gather them there (Megatron-LM's; default off, as torch)")
    model.add_argument("--zero", type=int, choices=ZERO_STAGES,
                       help="what the data-parallel shards split: 3 (default, FSDP: weights, gradients, optimizer), "
                            "2 (gradients and optimizer state), 1 (optimizer state)")
    model.add_argument("--fp8", action=argparse.BooleanOptionalAction,
                       help="the layers' linear layers in FP8 at the GPU's FP8 peak, their FSDP all-gather in FP8 "
                            "(default off; activations and optimizer state keep their dtypes)")
    model.add_argument("--efficiency-half-width", type=float, metavar="W",
                       help="matmul efficiency falls as w / (w + W) with the width per GPU w = hidden / tp (default 0: "
                            "constant; bench/planner_validation.py fits it)")
    model.add_argument("--link-efficiency", type=float, metavar="F",
                       help="the fraction of the links' peak bandwidth the collectives reach (default 1)")
    model.add_argument("--elementwise-bytes", type=float, metavar="B",
                       help="bytes the non-matmul operations move per token, hidden unit and layer in one pass over "
                            "the layers (3 a step, 4 with full recomputation), at the GPU's memory bandwidth "
                            "(default 0: not counted)")
    model.add_argument("--overlap-data-parallel", action=argparse.BooleanOptionalAction,
                       help="the FSDP/HSDP/loss collectives run beside the compute (default on); off: after the "
                            "backward, in full (Megatron-LM 2021-22)")
    model.add_argument("--gradient-sync", choices=GRADIENT_SYNCS,
                       help="without a pipeline, reduce the data-parallel gradients after every micro-batch "
                            "(micro_batch, FSDP2's default) or once per step (step); with pp > 1 once per step")
    for name, default, what in _BYTES_HELP:
        model.add_argument(f"--{name.replace('_', '-')}", type=int, metavar="N",
                           help=f"{what} (default {default})")


_DEGREE_HELP = {
    "dp_shard": "degree of FSDP sharding (default -1: what the other degrees leave)",
    "dp_replicate": "degree of replication over FSDP groups (default 1); with --dp-replicate R > 1 the job is "
                    "HSDP (R replicas of dp_shard-way FSDP), with 1 it is FSDP",
}
_BYTES_HELP = (
    ("param_bytes", 2, "bytes per weight in compute and in the FSDP all_gather"),
    ("grad_bytes", 4, "bytes per gradient (the FSDP reduce_scatter's dtype)"),
    ("master_bytes", 4, "bytes per parameter of the optimizer's master copy (0: none)"),
    ("moment_bytes", 8, "bytes per parameter of the optimizer's moments (Adam: two fp32)"),
)
_OPTION_NAMES = ("recompute", "sequence_parallel", "efficiency", "flash_attention", "dropout", "gradient_sync",
                 "pipeline_interleave", "efficiency_half_width", "link_efficiency", "elementwise_bytes",
                 "overlap_data_parallel", "pipeline_schedule", "pipeline_scatter_gather", "zero", "fp8",
                 *(name for name, _, _ in _BYTES_HELP))
_BATCH_NAMES = ("global_batch", "seq_len", "micro_batch")


def _options(args: argparse.Namespace) -> Options:
    """The :class:`~fmesh.plan.model.Options` the flags set (the others keep their defaults)."""
    return Options(**{name: getattr(args, name) for name in _OPTION_NAMES if getattr(args, name) is not None})


def _parser() -> _Parser:
    parser = _Parser(prog="python -m fmesh", description="Functional device meshes for PyTorch.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    plan = sub.add_parser("plan", help="print the meshes of a training job before launching it")
    _add_plan_arguments(plan)
    _add_lose_arguments(plan, "print the recovery plan after losing these ranks (e.g. 5,9) instead")
    diff = sub.add_parser(
        "diff",
        help="compare two plans: communicators shared, added, removed, and the ranks that change group",
        description="Each side is a manifest file (from plan --manifest) or the plan flags in one quoted "
                    "argument, e.g. diff old.json '--world-size 64 --gpus-per-node 8 --tp 4'.",
    )
    diff.add_argument("a", help="a manifest file, or quoted plan flags starting with --")
    diff.add_argument("b", help="a manifest file, or quoted plan flags starting with --")
    diff.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_lose_arguments(diff, "B is A after losing these ranks (e.g. 5,9): also print which communicators are "
                              "kept, shrunk or created")
    return parser


def _plan_parser() -> _Parser:
    parser = _Parser(prog="python -m fmesh plan")
    _add_plan_arguments(parser)
    return parser


def _degrees(args: argparse.Namespace) -> dict[str, int]:
    return {name: getattr(args, name) for name in DEGREE_NAMES}


def _manifest_of(args: argparse.Namespace) -> Manifest:
    return plan_manifest(args.world_size, args.gpus_per_node, rank_order=args.rank_order, backend=args.backend,
                         memory=None, **_degrees(args))


def _side(text: str, label: str) -> Manifest:
    """One side of ``diff``: quoted plan flags (starting with ``--``) or a manifest file."""
    if text.lstrip().startswith("--"):
        try:
            args = _plan_parser().parse_args(shlex.split(text))
        except ValueError as error:
            raise CommandLineError(f"{label} ({text!r}): {error}") from None
        if args.manifest or args.json:
            raise CommandLineError(f"{label} ({text!r}): --manifest and --json belong to plan, not to a diff side")
        if args.model is not None or args.search or any(getattr(args, n) is not None
                                                        for n in (*_OPTION_NAMES, *_BATCH_NAMES)):
            raise CommandLineError(f"{label} ({text!r}): --model, --search and the training options belong to plan, "
                                   "not to a diff side (a diff compares communicators)")
        try:
            return _manifest_of(args)
        except (ValueError, TypeError) as error:
            raise CommandLineError(f"{label} ({text!r}): {error.args[0] if error.args else error}") from None
    return Manifest.from_json(load_manifest(text), text)


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments, with a one-line message).

    >>> import io; out = io.StringIO()
    >>> main(["plan", "--world-size", "8", "--gpus-per-node", "3"], stderr=out), out.getvalue()
    (2, 'fmesh plan: error: world size 8 is not a multiple of 3 gpus per node: hosts must be full\\n')
    """
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list[:1] in (["plan"], ["diff"]) else None
    prefix = f"fmesh {command}" if command else "fmesh"
    try:
        args = _parser().parse_args(args_list)
        if args.command is None:
            print(demo(), file=out)
            return 0
        if args.absorb is not None and args.lose is None:
            raise CommandLineError("--absorb says which axes absorb a loss, so it goes with --lose RANKS")
        if args.command == "diff":
            return _diff(args, out)
        if args.model is not None:
            return _model(args, out)
        if args.search:
            raise CommandLineError("--search looks for the best layout of a model, so it goes with --model NAME")
        options = [f"--{name.replace('_', '-')}" for name in (*_OPTION_NAMES, *_BATCH_NAMES)
                   if getattr(args, name) is not None]
        if options:
            raise CommandLineError(f"{', '.join(options)} set how a model is trained, so they go with --model NAME")
        if args.lose is not None:
            return _lose(args, out)
        plan = build_plan(args.world_size, args.gpus_per_node, rank_order=args.rank_order,
                          cost_bytes=args.cost_bytes, links=LINKS[args.links], **_degrees(args))
        manifest = _manifest_of(args) if args.manifest else None
        if manifest is not None:
            _write(args.manifest, dump_manifest(manifest.to_json()))
    except (ValueError, TypeError, KeyError) as error:  # CommandLineError and ManifestError are ValueErrors
        message = error.args[0] if error.args else str(error)
        print(f"{prefix}: error: {message}", file=err)
        return 2
    print(json.dumps(plan.to_json(), indent=2) if args.json else format_plan(plan), file=out)
    if manifest is not None and not args.json:
        print(f"\nmanifest written to {args.manifest}:\n{format_manifest(manifest)}", file=out)
    return 0


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    a, b = _side(args.a, "A"), _side(args.b, "B")
    diff = compare(a, b)
    recovery = None if args.lose is None else recover_manifests(a, b, args.lose, axes=args.absorb or ELASTIC_AXES,
                                                                shrink_groups=b.backend == "nccl")
    if args.json:
        found = diff.to_json()
        if recovery is not None:
            found["recovery"] = recovery.to_json()
        print(json.dumps(found, indent=2), file=out)
    else:
        print(format_diff(diff), file=out)
        if recovery is not None:
            print(f"\nrecovery (B is A after losing ranks {list(recovery.lost)}):\n"
                  f"{format_recovery(recovery, b.backend)}", file=out)
    return 0


def _model(args: argparse.Namespace, out: TextIO) -> int:
    if args.manifest:
        raise CommandLineError("--model prints the model's plan and writes no manifest; write it without --model")
    ignored = [flag for flag, given in (("--cost-bytes", args.cost_bytes != DEFAULT_COST_BYTES),
                                        ("--links", args.links != "h100-ib"), ("--backend", args.backend != "nccl"))
               if given]
    if ignored:
        raise CommandLineError(f"--model times every collective of the step on --hardware's links, so it takes no "
                               f"{', '.join(ignored)}; choose the GPUs and links with --hardware")
    given = {name: value for name, value in _degrees(args).items() if value != (-1 if name == "dp_shard" else 1)}
    if args.search and given:
        raise CommandLineError(f"--search chooses the degrees, but got {given}: give either --search or degrees")
    if args.world_size < 1 or args.gpus_per_node < 1 or args.world_size % args.gpus_per_node:
        raise CommandLineError(f"expected --world-size a positive multiple of --gpus-per-node {args.gpus_per_node}, "
                               f"but got {args.world_size}")
    gpu = hardware(args.hardware)
    if args.fp8 and not gpu.fp8_flops:
        raise CommandLineError(f"expected --hardware with FP8 tensor cores for --fp8 "
                               f"({', '.join(n for n, h in HARDWARE.items() if h.fp8_flops)}), but got "
                               f"{args.hardware}")
    model = _model_of(args.model)
    batch = {name: getattr(args, name) for name in _BATCH_NAMES if getattr(args, name) is not None}
    model = attrs.evolve(model, **batch) if batch else model
    plan = plan_model(model, _options(args), gpu, args.world_size, args.gpus_per_node,
                      degrees=None if args.search else _degrees(args), rank_order=args.rank_order, lose=args.lose,
                      absorb=args.absorb or ELASTIC_AXES,
                      micro_batches=None if args.micro_batch is None else [args.micro_batch])
    print(json.dumps(plan.to_json(), indent=2) if args.json else format_model_plan(plan), file=out)
    return 0


def _model_of(name: str) -> Model:
    """A preset by name, or a config file (``.json``) of the model's fields."""
    if not name.endswith(".json"):
        return preset(name)
    try:
        config = json.loads(pathlib.Path(name).read_text())
    except OSError as error:
        raise CommandLineError(f"cannot read the model config {name}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise CommandLineError(f"expected a JSON object in the model config {name}, but got: {error}") from None
    if not isinstance(config, dict):
        raise CommandLineError(f"expected a JSON object of model fields in {name}, but got {type(config).__name__}")
    return from_config(config)


def _lose(args: argparse.Namespace, out: TextIO) -> int:
    if args.manifest:
        raise CommandLineError("--lose prints the recovery plan and writes no manifest; write each job's manifest "
                               "with its own plan --manifest, and compare them with diff --lose")
    dims, _ = job(args.world_size, args.gpus_per_node, rank_order=args.rank_order, **_degrees(args))
    recovery: JobRecovery = recover_job(dims, args.lose, axes=args.absorb or ELASTIC_AXES,
                                        shrink_groups=args.backend == "nccl")
    print(json.dumps(recovery.to_json(), indent=2) if args.json else format_recovery(recovery, args.backend),
          file=out)
    return 0


def _write(path: str, text: str) -> None:
    try:
        pathlib.Path(path).write_text(text)
    except OSError as error:
        raise CommandLineError(f"cannot write the manifest to {path}: {error.strerror or error}") from None
