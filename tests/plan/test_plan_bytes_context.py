"""Bytes exact with context parallelism, with sequence parallelism under FSDP, and with ZeRO-1 and ZeRO-2's
collectives: the planner's bytes per axis per step (``fmesh.plan.traffic``) equal every collective one
fake-backend step records.

**Context parallelism** as the planner models it (all-gather K/V, Llama 3's and torchtitan's ``allgather``
rotation): ``examples/train.py``'s model with each rank of a ``cp`` group holding ``seq_len / cp`` tokens (and
their positions); every attention concatenates its local keys and values and all-gathers them over ``cp`` along
the sequence (``all_gather_tensor_autograd``: its backward reduce-scatters their gradients), the queries attend
causally to the whole gathered sequence; FSDP2 shards over ``dp_shard_cp`` (the cp ranks hold different tokens,
so their gradients are reduced together with the data-parallel ones), tensor parallelism splits the heads.

**Sequence parallelism with FSDP**: :func:`test_plan_bytes.sequence_parallel`'s tensor-parallel plan, then
``fully_shard`` per layer and at the root over the data-parallel mesh; FSDP2 itself sums each norm's weight
gradient (a partial sum over the sequence's parts) over ``tp``, one ``all_reduce`` per parameter before each
reduce-scatter, where tensor parallelism alone leaves it to the training loop (once per step).

**ZeRO-1 and ZeRO-2** (``Options.zero``) move, per step, what FSDP2 moves when it keeps every unit's weights
gathered all step (``set_reshard_after_forward(False)``, ``set_reshard_after_backward(False)``): one all-gather per
unit per step, and its gradients reduce-scattered once (ZeRO-1: the sync held to the last micro-batch,
``set_requires_gradient_sync``) or after every micro-batch's backward (ZeRO-2). ZeRO shards differently in memory
(its weights are never sharded; FSDP2 keeps a sharded copy too) and gathers the updated weights after the optimizer
step where FSDP2 gathers them before the first forward, but each step's calls and bytes per group are the same.

Rank 0 of each fake world is recorded by :class:`test_plan_bytes.Recorder` (which refuses any collective it does
not count), in a spawned process as in ``test_plan_bytes.py``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from test_plan_bytes import (
    TRAIN_OPTIONS,
    Key,
    flags,
    recorded_sequence_parallel_step,
    train,
    train_model,
    training_step,
)

import fmesh
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.traffic import traffic

pytestmark = pytest.mark.slow  # 13 one-step trainings in a spawned process: ~10 s on two busy cores


def context_parallel_attention(attention: Any, cp_mesh: Any, cp_index: int, cp: int) -> None:
    """Make ``attention`` (``examples/train.py``'s ``Attention``) attend over the whole sequence from its local
    part: K and V concatenated, all-gathered over ``cp_mesh`` along the sequence, split again; the causal mask
    offset by the local part's start."""
    from torch.distributed._functional_collectives import all_gather_tensor_autograd  # torch 2.10 has no *_single_*

    def forward(x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, -1, attention.head_dim) for proj in
                   (attention.q, attention.k, attention.v))
        kv = all_gather_tensor_autograd(torch.cat([k, v], dim=-1), gather_dim=1, group=cp_mesh)
        k, v = kv.split(attention.head_dim, dim=-1)
        rows = torch.arange(length).unsqueeze(1) + cp_index * length
        mask = torch.arange(length * cp).unsqueeze(0) <= rows
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask)
        return attention.o(out.transpose(1, 2).reshape(batch, length, -1))

    attention.forward = forward


def recorded_context_parallel_step(world: int, argv: list[str], cp: int, micro_batches: int
                                   ) -> tuple[dict[Key, list[int]], argparse.Namespace, ParallelDims]:
    """One step of ``examples/train.py``'s model with context parallelism ``cp`` (module docstring), as rank 0 of
    a fake world: ``micro_batches`` forwards and backwards of the local batch's local sequence part, AdamW, the
    loss averaged over ``dp``."""
    args = train.parse(argv)
    with fmesh.Context.fake(world, rank=0) as ctx:
        dims = ParallelDims(world, dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, cp=cp, tp=args.tp)
        torch.manual_seed(args.seed)
        model = train.LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len)
        (cp_index,) = dims.mesh("cp").coordinate(ctx.rank) or (0,)
        cp_mesh = ctx.device_mesh(dims.mesh("cp"))
        for block in model.blocks:
            context_parallel_attention(block.attention, cp_mesh, cp_index, cp)
        local_len = args.seq_len // cp
        start = cp_index * local_len

        def local_forward(tokens: torch.Tensor) -> torch.Tensor:  # the local part's positions
            x = model.embed(tokens) + model.position[start:start + local_len]
            for block in model.blocks:
                x = block(x)
            return model.head(model.norm(x))

        model.forward = local_forward
        train.shard_model(model, ctx, dims, mixed_precision=args.bf16)
        seen = training_step(ctx, model, dims, args, micro_batches, start, local_len)
    return seen, args, dims


def planned(model: Any, options: Any, dims: ParallelDims) -> dict[Key, list[int]]:
    found: dict[Key, list[int]] = {}
    for transfer in traffic(model, options, dims):
        entry = found.setdefault((dims.mesh(transfer.axis).group(0), transfer.collective), [0, 0])
        entry[0] += transfer.calls
        entry[1] += transfer.nbytes
    return found


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[concurrent.futures.Executor]:
    """A spawned process for the steps (see ``test_plan_bytes.elsewhere``)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


# (world, flags, cp, micro-batches per step): cp alone, with FSDP, with tp, with HSDP, in bf16, accumulating
CONTEXT_PARALLEL: list[tuple[int, list[str], int, int]] = [
    (2, flags(dp_shard=1), 2, 1),
    (4, flags(dp_shard=2), 2, 1),
    (8, flags(dp_shard=2, tp=2), 2, 1),
    (8, [*flags(dp_replicate=2, dp_shard=1), "--layers=3"], 4, 1),
    (8, [*flags(dp_shard=2), "--bf16"], 4, 2),
]


@pytest.mark.parametrize(("world", "argv", "cp", "micro_batches"), [
    pytest.param(world, argv, cp, m, id=f"{world}:{' '.join(argv)} cp{cp} x{m}")
    for world, argv, cp, m in CONTEXT_PARALLEL])
def test_planned_bytes_equal_recorded_bytes_with_context_parallelism(
        elsewhere: concurrent.futures.Executor, world: int, argv: list[str], cp: int, micro_batches: int) -> None:
    seen, args, dims = elsewhere.submit(recorded_context_parallel_step, world, argv, cp, micro_batches).result(
        timeout=300)
    options = attrs.evolve(TRAIN_OPTIONS, param_bytes=2) if args.bf16 else TRAIN_OPTIONS
    assert (dims.mesh("cp").group(0), "all_gather") in seen  # the K/V gathers ran
    assert planned(train_model(args, dims, micro_batches), options, dims) == seen


SEQUENCE_PARALLEL_FSDP = [(4, flags(dp_shard=2, tp=2), 1), (8, [*flags(dp_shard=2, tp=4), "--layers=3"], 2),
                          (8, flags(dp_replicate=2, dp_shard=2, tp=2), 1),
                          (4, [*flags(dp_shard=2, tp=2), "--batch-size=12"], 3)]


@pytest.mark.parametrize(("world", "argv", "micro_batches"), [
    pytest.param(world, argv, m, id=f"{world}:{' '.join(argv)} SP x{m}") for world, argv, m in SEQUENCE_PARALLEL_FSDP])
def test_planned_bytes_equal_recorded_bytes_with_sequence_parallelism_and_fsdp(
        elsewhere: concurrent.futures.Executor, world: int, argv: list[str], micro_batches: int) -> None:
    seen, args, dims = elsewhere.submit(recorded_sequence_parallel_step, world, argv, micro_batches, True).result(
        timeout=300)
    options = attrs.evolve(TRAIN_OPTIONS, sequence_parallel=True)
    assert (dims.mesh("tp").group(0), "reduce_scatter") in seen
    assert planned(train_model(args, dims, micro_batches), options, dims) == seen


def recorded_zero_step(world: int, argv: list[str], zero: int, micro_batches: int
                       ) -> tuple[dict[Key, list[int]], argparse.Namespace, ParallelDims]:
    """One step of ``examples/train.py``'s model and sharding with FSDP2 set to move what ZeRO-1 or ZeRO-2 moves
    (module docstring), as rank 0 of a fake world."""
    args = train.parse(argv)
    with fmesh.Context.fake(world, rank=0) as ctx:
        dims = train.check_degrees(args, world)
        torch.manual_seed(args.seed)
        model = train.LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len)
        train.shard_model(model, ctx, dims, mixed_precision=args.bf16)
        model.set_reshard_after_forward(False)
        model.set_reshard_after_backward(False)

        def sync(index: int) -> None:
            model.set_requires_gradient_sync(zero == 2 or index == micro_batches - 1)

        seen = training_step(ctx, model, dims, args, micro_batches, before=sync)
    return seen, args, dims


# (world, flags, zero stage, micro-batches per step)
ZERO = [(4, [*flags(dp_shard=4), "--batch-size=12"], 1, 3), (4, [*flags(dp_shard=4), "--batch-size=12"], 2, 3),
        (8, [*flags(dp_replicate=2, dp_shard=2, tp=2), "--batch-size=16"], 1, 2),
        (8, [*flags(dp_shard=4, tp=2), "--batch-size=16", "--bf16"], 2, 2)]


@pytest.mark.parametrize(("world", "argv", "zero", "micro_batches"), [
    pytest.param(world, argv, zero, m, id=f"{world}:{' '.join(argv)} ZeRO-{zero} x{m}")
    for world, argv, zero, m in ZERO])
def test_planned_bytes_equal_recorded_bytes_with_zero_1_and_2(
        elsewhere: concurrent.futures.Executor, world: int, argv: list[str], zero: int, micro_batches: int) -> None:
    seen, args, dims = elsewhere.submit(recorded_zero_step, world, argv, zero, micro_batches).result(timeout=300)
    options = attrs.evolve(TRAIN_OPTIONS, param_bytes=2 if args.bf16 else 4, zero=zero)
    model = train_model(args, dims, micro_batches)
    assert planned(model, options, dims) == seen
    assert planned(model, attrs.evolve(options, zero=3), dims) != seen  # FSDP's count would be wrong
