"""Bytes exact: the planner's bytes per axis per step (``fmesh.plan.traffic``) equal every collective
``examples/train.py`` runs in one training step, recorded per group on torch's fake backend.

The script's own model, sharding (``shard_model``: FSDP2/HSDP + DTensor tensor parallelism) and step (forward,
backward, AdamW, the loss averaged over ``dp`` by the Context) run in this process as one rank of a fake world;
a ``TorchDispatchMode`` sees every c10d and functional collective with its tensors and its process group. Each
recorded call is keyed by the ranks of its group and its kind; the planner's :class:`Transfer` list is keyed
the same way through the job's meshes (``ParallelDims.mesh(axis).group(rank)``). The two must agree to the byte
and to the call. Rank 0 is recorded (one fake rank per configuration: DTensor caches its redistribution plans by
mesh, so a second rank of the same world in this process would reuse the first one's group names).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from paths import ROOT
from support import patience
from torch.utils._python_dispatch import TorchDispatchMode

import fmesh
from fmesh.plan.model import Model, Options
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.traffic import traffic

pytestmark = pytest.mark.slow  # 33 one-step trainings in a spawned process: ~30 s on two busy cores

_spec = importlib.util.spec_from_file_location("train_for_bytes", ROOT / "examples" / "train.py")
assert _spec is not None and _spec.loader is not None
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)

Key = tuple[tuple[int, ...], str]


class Recorder(TorchDispatchMode):
    """Every collective dispatched while active: (group ranks, kind) -> [calls, bytes]."""

    def __init__(self, names: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.names = names
        self.seen: dict[Key, list[int]] = {}

    def _add(self, ranks: tuple[int, ...], kind: str, tensor: torch.Tensor, scale: int = 1) -> None:
        entry = self.seen.setdefault((ranks, kind), [0, 0])
        entry[0] += 1
        entry[1] += tensor.numel() * tensor.element_size() * scale

    def _group(self, boxed: Any) -> tuple[int, ...]:
        return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(boxed)))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name == "c10d._allgather_base_":
            self._add(self._group(args[2]), "all_gather", args[0])
        elif name == "c10d._reduce_scatter_base_":
            self._add(self._group(args[2]), "reduce_scatter", args[1])
        elif name == "c10d.allreduce_":
            for tensor in args[0]:
                self._add(self._group(args[1]), "all_reduce", tensor)
        elif name == "_c10d_functional.all_reduce":
            self._add(self.names[args[2]], "all_reduce", args[0])
        elif name == "_c10d_functional.all_gather_into_tensor":
            self._add(self.names[args[2]], "all_gather", args[0], scale=args[1])
        elif name == "_c10d_functional.reduce_scatter_tensor":
            self._add(self.names[args[3]], "reduce_scatter", args[0])
        elif "c10d" in name and name not in ("_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd"):
            raise AssertionError(f"a collective the test does not count: {name}")
        return func(*args, **(kwargs or {}))


def train_model(args: argparse.Namespace, dims: ParallelDims, micro_batches: int = 1) -> Model:
    """``examples/train.py``'s ``LanguageModel`` as a planner :class:`Model`, its real sizes: a byte vocabulary,
    learned positions, LayerNorm, q/k/v/o without biases, a 4x GELU MLP with biases, an untied head, nothing
    split over tp outside the layers, fp32; the local batch in ``micro_batches`` micro-batches."""
    dp = dims.dp_replicate * dims.dp_shard
    return Model("train.py", layers=args.layers, hidden=args.dim, heads=args.heads, vocab=256, seq_len=args.seq_len,
                 global_batch=args.batch_size, micro_batch=args.batch_size // (dp * micro_batches),
                 attention_biases=False,
                 mlp_biases=True, learned_positions=True, fused_qkv=False, vocab_parallel=False,
                 dtype_bytes=2 if args.bf16 else 4)


TRAIN_OPTIONS = Options(recompute="none", sequence_parallel=False, param_bytes=4, grad_bytes=4, master_bytes=0)


def train_options(args: argparse.Namespace) -> Options:
    """fp32 throughout, or with ``--bf16`` FSDP2's mixed precision: bf16 weights gathered, fp32 gradients reduced."""
    return attrs.evolve(TRAIN_OPTIONS, param_bytes=2) if args.bf16 else TRAIN_OPTIONS


def group_names(ctx: fmesh.Context, dims: ParallelDims) -> dict[str, tuple[int, ...]]:
    """Group name -> ranks, for every group the step can use (the functional collectives name their group)."""
    names = {}
    for mesh in dims.meshes().values():
        if mesh.size > 1:
            group = ctx.group(mesh)
            names[group.group_name] = tuple(dist.get_process_group_ranks(group))
    return names


def recorded_step(world: int, rank: int, argv: list[str], micro_batches: int = 1
                  ) -> tuple[dict[Key, list[int]], argparse.Namespace, ParallelDims]:
    """One step of ``examples/train.py``'s loop, as rank ``rank`` of a fake world of ``world``; with
    ``micro_batches > 1`` the local batch is split and each part's gradients accumulate (forward and backward
    per part, FSDP2's defaults: reshard after forward, reduce every backward), then one optimizer step."""
    args = train.parse(argv)
    with fmesh.Context.fake(world, rank=rank) as ctx:
        dims = train.check_degrees(args, world)
        torch.manual_seed(args.seed)
        model = train.LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len)
        train.shard_model(model, ctx, dims, mixed_precision=args.bf16)
        seen = training_step(ctx, model, dims, args, micro_batches)
    return seen, args, dims


def training_step(ctx: fmesh.Context, model: Any, dims: ParallelDims, args: argparse.Namespace, micro_batches: int,
                  start: int = 0, length: int | None = None,
                  before: Callable[[int], None] | None = None) -> dict[Key, list[int]]:
    """``examples/train.py``'s step, recorded: the data-parallel rank's share of the batch in ``micro_batches``
    parts (forward and backward each), AdamW, the loss averaged over ``dp``; each rank trains on the ``length``
    tokens from ``start`` of every sequence (all of them by default; a part of them with context parallelism);
    ``before(i)`` runs before the ``i``-th micro-batch (FSDP2's settings for it)."""
    length = args.seq_len if length is None else length
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dp_mesh = dims.mesh("dp")
    (dp_index,) = dp_mesh.coordinate(ctx.rank) or (0,)
    recorder = Recorder(group_names(ctx, dims))
    with recorder:
        local = train.batches(args.seed, args.batch_size, args.seq_len).chunk(dp_mesh.size)[dp_index]
        for index, part in enumerate(local.chunk(micro_batches)):
            if before is not None:
                before(index)
            logits = model(part[:, start:start + length])
            targets = part[:, start + 1:start + length + 1]
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            (loss / micro_batches).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.all_reduce(loss.detach(), dp_mesh, op="avg")
    return recorder.seen


def planned(args: argparse.Namespace, dims: ParallelDims, rank: int, micro_batches: int = 1) -> dict[Key, list[int]]:
    found: dict[Key, list[int]] = {}
    for transfer in traffic(train_model(args, dims, micro_batches), train_options(args), dims):
        entry = found.setdefault((dims.mesh(transfer.axis).group(rank), transfer.collective), [0, 0])
        entry[0] += transfer.calls
        entry[1] += transfer.nbytes
    return found


def flags(**degrees: int) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in degrees.items()]


# (world, flags): the degree sets torchtitan launches (FSDP, HSDP, TP, 2-D, 3-D, DDP) and model sizes whose
# weights do not split evenly (FSDP2 pads each shard).
CONFIGS: list[tuple[int, list[str]]] = [
    (2, flags(dp_shard=2)),
    (4, flags(dp_shard=4)),
    (8, flags(dp_shard=8)),
    (4, flags(tp=2)),
    (4, flags(tp=4)),
    (8, flags(tp=2)),
    (8, flags(tp=4)),
    (8, flags(dp_replicate=2, tp=2)),
    (8, flags(dp_replicate=2, dp_shard=4)),
    (8, flags(dp_replicate=4, dp_shard=2)),
    (4, flags(dp_replicate=4, dp_shard=1)),
    (8, flags(dp_replicate=2, dp_shard=1, tp=4)),
    (16, flags(dp_replicate=2, dp_shard=2, tp=4)),
    (16, flags(dp_shard=4, tp=4)),
    (16, flags(dp_replicate=4, dp_shard=2, tp=2)),
    (3, [*flags(dp_shard=3), "--batch-size=6", "--seq-len=30"]),
    (6, [*flags(dp_shard=3, tp=2), "--batch-size=12", "--dim=96", "--heads=6"]),
    (12, [*flags(dp_replicate=2, dp_shard=3, tp=2), "--batch-size=12", "--dim=40", "--heads=2", "--layers=3"]),
    (5, [*flags(dp_shard=5), "--batch-size=10", "--dim=48", "--seq-len=20"]),
    (8, [*flags(dp_shard=4, tp=2), "--layers=1", "--seq-len=16"]),
    (8, [*flags(dp_shard=2, tp=4), "--dim=128", "--heads=8", "--layers=3"]),
    (2, [*flags(tp=2), "--batch-size=3", "--heads=2"]),
    (6, [*flags(dp_replicate=3, dp_shard=2), "--batch-size=12", "--dim=72", "--heads=3"]),
    (16, [*flags(dp_shard=16), "--batch-size=16", "--seq-len=24"]),
    # bf16: FSDP2's mixed precision (bf16 weights gathered, fp32 gradients reduced, bf16 activations over tp)
    (4, [*flags(dp_shard=4), "--bf16"]),
    (8, [*flags(dp_shard=2, tp=4), "--bf16"]),
    (8, [*flags(dp_replicate=2, dp_shard=2, tp=2), "--bf16"]),
    (6, [*flags(dp_replicate=3, dp_shard=2), "--batch-size=12", "--dim=72", "--heads=3", "--bf16"]),
]


CASES = [pytest.param(world, argv, id=f"{world}:{' '.join(argv)}") for world, argv in CONFIGS]


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[concurrent.futures.Executor]:
    """A spawned process for the steps: a process that ran this step's backward (FSDP2 on the fake backend) cannot
    fork the gloo ranks that later tests of the same worker launch, on torch's CUDA builds (2.10 and 2.15 in CI:
    "Unable to handle autograd's threading in combination with fork-based multiprocessing")."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


@pytest.mark.parametrize(("world", "argv"), CASES)
def test_planned_bytes_equal_recorded_bytes(elsewhere: concurrent.futures.Executor, world: int,
                                            argv: list[str]) -> None:
    seen, args, dims = elsewhere.submit(recorded_step, world, 0, argv).result(timeout=patience(300))
    assert seen, "the step ran no collective: nothing was compared"
    assert planned(args, dims, 0) == seen


# (world, flags, micro-batches per step): gradient accumulation over FSDP, HSDP and TP
MICRO_CONFIGS: list[tuple[int, list[str], int]] = [
    (4, flags(dp_shard=4), 2),
    (8, [*flags(dp_replicate=2, dp_shard=2, tp=2), "--batch-size=16"], 4),
    (4, [*flags(tp=4), "--batch-size=6"], 3),
    (6, [*flags(dp_shard=3, tp=2), "--batch-size=12", "--dim=96", "--heads=6"], 2),
    (8, [*flags(dp_shard=4, tp=2), "--batch-size=16", "--bf16"], 2),
]


@pytest.mark.parametrize(("world", "argv", "micro_batches"), [
    pytest.param(world, argv, m, id=f"{world}:{' '.join(argv)} x{m}") for world, argv, m in MICRO_CONFIGS])
def test_planned_bytes_equal_recorded_bytes_with_micro_batches(elsewhere: concurrent.futures.Executor, world: int,
                                                               argv: list[str], micro_batches: int) -> None:
    seen, args, dims = elsewhere.submit(recorded_step, world, 0, argv, micro_batches).result(timeout=patience(300))
    assert planned(args, dims, 0, micro_batches) == seen
    assert planned(args, dims, 0) != seen  # one micro-batch would be wrong: the count matters


def sequence_parallel(model: Any, ctx: fmesh.Context, dims: ParallelDims) -> None:
    """``examples/train.py``'s model under tensor parallelism with sequence parallelism, as Megatron-LM and
    torchtitan lay it out: the norms on a part of the sequence (``SequenceParallel``), the attention's and the
    MLP's inputs gathered once each, the row-parallel outputs reduce-scattered along the sequence; the residual
    stream split from the first layer on, and gathered again for the output layer (which, like the embedding, is
    not split over tp in this model)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {
        "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)),
        "norm": SequenceParallel(),
        "head": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                   use_local_output=True),
    }
    for i in range(len(model.blocks)):
        plan |= {f"blocks.{i}.norm1": SequenceParallel(), f"blocks.{i}.norm2": SequenceParallel(),
                 f"blocks.{i}.attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                                             desired_input_layouts=(Replicate(),)),
                 **{f"blocks.{i}.attention.{n}": ColwiseParallel() for n in ("q", "k", "v")},
                 f"blocks.{i}.attention.o": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                 f"blocks.{i}.up": ColwiseParallel(input_layouts=Shard(1)),
                 f"blocks.{i}.down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
    parallelize_module(model, ctx.device_mesh(dims.mesh("tp")), plan)


def recorded_sequence_parallel_step(world: int, argv: list[str], micro_batches: int, fsdp: bool = False
                                    ) -> tuple[dict[Key, list[int]], argparse.Namespace, ParallelDims]:
    """One step of the sequence-parallel model (:func:`sequence_parallel`, tensor parallelism alone) as rank 0:
    ``micro_batches`` forwards and backwards, then the norms' gradients (partial sums over the sequence's
    parts) summed over tp in one all_reduce, as Megatron-LM does once per step, and AdamW. With ``fsdp``, the
    model is ``fully_shard``-ed per layer and at the root over the data-parallel mesh too and trained by
    :func:`training_step` (FSDP2 sums the norms' partial gradients itself)."""
    from torch.distributed.fsdp import fully_shard

    args = train.parse(argv)
    with fmesh.Context.fake(world, rank=0) as ctx:
        dims = train.check_degrees(args, world)
        torch.manual_seed(args.seed)
        model = train.LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len)
        sequence_parallel(model, ctx, dims)
        if fsdp:
            dp_mesh = ctx.device_mesh(dims.fsdp_mesh())
            for block in model.blocks:
                fully_shard(block, mesh=dp_mesh)
            fully_shard(model, mesh=dp_mesh)
            return training_step(ctx, model, dims, args, micro_batches), args, dims
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        recorder = Recorder(group_names(ctx, dims))
        with recorder:
            for part in train.batches(args.seed, args.batch_size, args.seq_len).chunk(micro_batches):
                logits = model(part[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), part[:, 1:].reshape(-1))
                (loss / micro_batches).backward()
            norms = [p for name, p in model.named_parameters() if ".norm" in f".{name}" and p.grad is not None]
            summed = ctx.all_reduce(torch.cat([p.grad.to_local().flatten() for p in norms]), dims.mesh("tp"))
            offset = 0
            for p in norms:
                local = p.grad.to_local()
                local.copy_(summed[offset:offset + local.numel()].view_as(local))
                offset += local.numel()
            optimizer.step()
    return recorder.seen, args, dims


SEQUENCE_PARALLEL = [(2, flags(tp=2), 1), (4, flags(tp=4), 1), (4, [*flags(tp=4), "--layers=3"], 2),
                     (2, [*flags(tp=2), "--batch-size=12", "--dim=96", "--heads=6"], 3)]


@pytest.mark.parametrize(("world", "argv", "micro_batches"), [
    pytest.param(world, argv, m, id=f"{world}:{' '.join(argv)} SP x{m}") for world, argv, m in SEQUENCE_PARALLEL])
def test_planned_bytes_equal_recorded_bytes_with_sequence_parallelism(
        elsewhere: concurrent.futures.Executor, world: int, argv: list[str], micro_batches: int) -> None:
    seen, args, dims = elsewhere.submit(recorded_sequence_parallel_step, world, argv, micro_batches).result(
        timeout=300)
    model = attrs.evolve(train_model(args, dims, micro_batches), micro_batch=args.batch_size // micro_batches)
    planned: dict[Key, list[int]] = {}
    for transfer in traffic(model, attrs.evolve(TRAIN_OPTIONS, sequence_parallel=True), dims):
        entry = planned.setdefault((dims.mesh(transfer.axis).group(0), transfer.collective), [0, 0])
        entry[0] += transfer.calls
        entry[1] += transfer.nbytes
    assert {collective for _, collective in seen} == {"all_gather", "reduce_scatter", "all_reduce"}
    assert planned == seen


def test_the_comparison_sees_a_missing_collective(elsewhere: concurrent.futures.Executor) -> None:
    seen, args, dims = elsewhere.submit(recorded_step, 8, 0, flags(dp_replicate=2, tp=2)).result(timeout=patience(300))
    plan = planned(args, dims, 0)
    assert plan == seen
    tp_group = dims.mesh("tp").group(0)
    plan[(tp_group, "all_reduce")][1] -= 4  # four bytes off: the test must notice
    assert plan != seen
