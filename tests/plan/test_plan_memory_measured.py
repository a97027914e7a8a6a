"""Memory you can check: the planner's memory per GPU (``fmesh.plan.memory``) against the bytes a real training
step of ``examples/train.py``'s model holds on one rank, with the same parallel degrees, on torch's fake backend.

No GPU is needed, so no ``torch.cuda.max_memory_allocated``: the step runs on the CPU as rank 0 of a fake world
(the collectives are torch's fake ones) and counts what the planner's parts stand for, each from the tensors
themselves: the weights (every parameter's local shard after FSDP2 and DTensor tensor parallelism), the gradients
(every ``.grad``'s local shard after the backward), AdamW's state (its ``exp_avg`` and ``exp_avg_sq`` after the
step), and the activations (every tensor autograd saves for the backward during the forward, seen by
``torch.autograd.graph.saved_tensors_hooks``, each storage once, the weights it saves left out). Each part must be
within 3% of the planner's, and so must their sum.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_plan_bytes import train, train_model
from torch.distributed.tensor import DTensor

import fmesh
from fmesh.plan.memory import memory
from fmesh.plan.model import Options
from fmesh.plan.parallel import ParallelDims

pytestmark = pytest.mark.slow  # one-step trainings in a spawned process: a few seconds

# fp32 weights and gradients, AdamW's two fp32 moments, no master copy; the CPU's SDPA is a flash kernel
TRAIN_OPTIONS = Options(recompute="none", sequence_parallel=False, param_bytes=4, grad_bytes=4, master_bytes=0,
                        moment_bytes=8, flash_attention=True, dropout=False)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _bytes(tensors: Any) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def measured_step(world: int, argv: list[str]) -> tuple[dict[str, int], ParallelDims, Any]:
    """One step of ``examples/train.py``'s model as rank 0 of a fake world: the bytes of each part (module
    docstring), its degrees and its arguments."""
    args = train.parse(argv)
    with fmesh.Context.fake(world, rank=0) as ctx:
        dims = train.check_degrees(args, world)
        torch.manual_seed(args.seed)
        model = train.LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len)
        train.shard_model(model, ctx, dims)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        weights = _bytes(model.parameters())
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            local = _local(tensor)
            storage = local.untyped_storage()
            params = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
            if storage.data_ptr() not in params:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        dp_mesh = dims.mesh("dp")
        (dp_index,) = dp_mesh.coordinate(ctx.rank) or (0,)
        local_batch = train.batches(args.seed, args.batch_size, args.seq_len).chunk(dp_mesh.size)[dp_index]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logits = model(local_batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), local_batch[:, 1:].reshape(-1))
        activations = sum(saved.values())
        loss.backward()
        gradients = _bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.step()
        state = _bytes(t for s in optimizer.state.values() for name, t in s.items() if name != "step")
    return {"weights": weights, "gradients": gradients, "optimizer": state, "activations": activations}, dims, args


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[concurrent.futures.Executor]:
    """A spawned process for the steps (see tests/plan/test_plan_bytes.py: a process that ran FSDP2's backward on
    the fake backend cannot fork gloo ranks later)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


def flags(**degrees: int) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in degrees.items()]


SIZES = ["--dim=256", "--heads=4", "--layers=4", "--seq-len=128", "--batch-size=16"]
CONFIGS = [
    (1, flags(dp_shard=1)),
    (4, flags(dp_shard=4)),
    (4, flags(tp=4)),
    (8, flags(dp_shard=2, tp=4)),
    (8, flags(dp_replicate=2, dp_shard=2, tp=2)),
]


@pytest.mark.parametrize(("world", "argv"), [pytest.param(w, a, id=f"{w}:{' '.join(a)}") for w, a in CONFIGS])
def test_planned_memory_is_within_3_percent_of_the_measured(elsewhere: concurrent.futures.Executor, world: int,
                                                            argv: list[str]) -> None:
    measured, dims, args = elsewhere.submit(measured_step, world, [*argv, *SIZES]).result(timeout=300)
    planned = memory(train_model(args, dims), TRAIN_OPTIONS, dims)
    for part, value in measured.items():
        assert getattr(planned, part) == pytest.approx(value, rel=0.03), (part, getattr(planned, part), value)
    total = sum(measured.values())
    assert planned.weights + planned.gradients + planned.optimizer + planned.activations == pytest.approx(
        total, rel=0.03)
