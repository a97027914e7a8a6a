"""Bytes exact under a pipeline: FSDP2 inside torch's 1F1B schedule (``torch.distributed.pipelining``) gathers
every unit once and reduces its gradients once per step, however many micro-batches, as the planner
(``fmesh.plan.traffic``) counts them; and a stage's point-to-point traffic is the micro-batches' activations and
their gradients.

``examples/train.py``'s model is cut into ``pp`` stages (the first holds the embedding and the positions, the last
the final norm and the output layer), each stage ``fully_shard``-ed per layer and at its root with
``reshard_after_forward=False`` (torchtitan's choice under a pipeline), and trained by ``Schedule1F1B`` on real gloo
ranks. Every collective and every send and receive of rank 0 (the first stage) is recorded in the second step (the
first one also runs the schedule's start-up vote). The planner counts a middle stage's sends (activations forward,
gradients back, ``2 m`` messages); the first stage sends the activations and receives the gradients, so its sends
and receives together are compared with that count.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support import launch
from test_plan_bytes import Key, Recorder, group_names, train

import fmesh
from fmesh.plan.model import Model, Options
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.traffic import traffic

pytestmark = pytest.mark.slow  # 4 gloo ranks per configuration


class Stage(nn.Module):
    """Layers of ``examples/train.py``'s model, with the embedding (first stage) or the output layer (last)."""

    def __init__(self, full: Any, first: bool, last: bool, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.embed, self.position = full.embed, full.position
        self.blocks = nn.ModuleList(blocks)
        if last:
            self.norm, self.head = full.norm, full.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.position[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


class PointToPoint(Recorder):
    """:class:`Recorder`, and every send and receive."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in ("c10d.send", "c10d.recv_"):
            for tensor in args[0]:
                self._add(self._group(args[1]), "send" if name == "c10d.send" else "recv", tensor)
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def pipelined_step(ctx: fmesh.Context, pp: int, m: int, layers: int, dim: int, seq: int, batch: int
                   ) -> dict[Key, list[int]]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dims = ParallelDims(ctx.world_size, pp=pp)
    torch.manual_seed(0)
    full = train.LanguageModel(256, dim, 4, layers, seq)
    (index,) = dims.mesh("pp").coordinate(ctx.rank) or (0,)
    per = layers // pp
    part = Stage(full, index == 0, index == pp - 1, list(full.blocks[index * per:(index + 1) * per]))
    dp_mesh = ctx.device_mesh(dims.fsdp_mesh())
    for block in part.blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=False)
    (dp_index,) = dims.mesh("dp").coordinate(ctx.rank) or (0,)
    data = train.batches(0, batch, seq).chunk(dims.dp_shard)[dp_index]
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()  # torch 2.10's stage checks strides
    size = data.shape[0] // m
    example = inputs[:size] if index == 0 else torch.randn(size, seq, dim, requires_grad=True)
    shapes: dict[str, Any] = {"output_args": (torch.randn(size, seq, 256 if index == pp - 1 else dim),)}
    if "output_grads" in inspect.signature(PipelineStage).parameters:  # torch ≥ 2.11; 2.10 infers them
        if index != pp - 1:
            shapes["output_grads"] = (torch.randn(size, seq, dim),)
        if index != 0:
            shapes["input_grads"] = (torch.randn(size, seq, dim),)
    stage = PipelineStage(part, index, pp, torch.device("cpu"), input_args=(example,), group=ctx.group(dims.mesh("pp")),
                          **shapes)
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=lambda out, target: F.cross_entropy(
        out.float().reshape(-1, out.shape[-1]), target.reshape(-1)))
    recorder = PointToPoint(group_names(ctx, dims))

    def step() -> None:
        if index == 0:
            schedule.step(inputs)
        elif index == pp - 1:
            schedule.step(target=targets)
        else:
            schedule.step()

    step()  # the first step also runs the schedule's start-up vote
    with recorder:
        step()
    return recorder.seen


CONFIGS = [(4, 2, 4, 4), (4, 2, 2, 4), (8, 2, 8, 4), (8, 4, 4, 8), (8, 2, 4, 2)]  # world, pp, micro-batches, layers


@pytest.mark.parametrize(("world", "pp", "m", "layers"), CONFIGS)
def test_fsdp_under_a_pipeline_moves_what_the_planner_counts(world: int, pp: int, m: int, layers: int) -> None:
    dim, seq, batch = 64, 32, 32
    results = launch(lambda ctx: pipelined_step(ctx, pp, m, layers, dim, seq, batch), world, timeout=120)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    seen = results[0]
    dims = ParallelDims(world, pp=pp)
    model = Model("train.py", layers=layers, hidden=dim, heads=4, vocab=256, seq_len=seq, global_batch=batch,
                  micro_batch=batch // (dims.dp_shard * m), attention_biases=False, learned_positions=True,
                  fused_qkv=False, vocab_parallel=False, dtype_bytes=4)
    options = Options(recompute="none", sequence_parallel=False, param_bytes=4, grad_bytes=4, master_bytes=0,
                      loss_all_reduce=False)
    planned: dict[Key, list[int]] = {}
    for transfer in traffic(model, options, dims):
        entry = planned.setdefault((dims.mesh(transfer.axis).group(0), transfer.collective), [0, 0])
        entry[0] += transfer.calls
        entry[1] += transfer.nbytes
    pp_group = dims.mesh("pp").group(0)
    moved = [a + b for a, b in zip(seen.pop((pp_group, "send")), seen.pop((pp_group, "recv")), strict=True)]
    assert planned.pop((pp_group, "send")) == moved
    assert planned == seen
    shard = dims.mesh("dp_shard_cp").group(0)
    assert seen[(shard, "all_gather")][0] == layers // pp + 1  # once per unit per step, not per micro-batch
