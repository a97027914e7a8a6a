"""Recovery in place on Ray: a data-parallel job of 4 Ray actors loses one, the survivors recover and train on.

    python bench/ray_recovery.py                # a local Ray cluster of 4 CPUs; rank 3 dies at step 3 of 8
    python bench/ray_recovery.py --address auto # an existing cluster (ray start --head ...)

Prints each survivor's losses, and the time from the death to the next step finished on every survivor. torchrun
cannot do this: its agent stops every worker when one fails, and the job restarts from its checkpoint (31 s on this
machine in docs/guides/elastic.md, mostly torchrun's own restart). Needs ray (pip install 'fmesh[ray]').
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import torch

import fmesh
from fmesh.context import ray_actors

BATCH, FEATURES = 12, 8  # the global batch divides by 4 and by 3 ranks


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def step_of(ctx: fmesh.Context, net: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> float:
    """One data-parallel step: this rank's share of the global batch, gradients averaged over every rank."""
    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    inputs, targets = (part.chunk(ctx.world_size)[ctx.rank] for part in batch(step))
    loss = torch.nn.functional.mse_loss(net(inputs), targets)
    loss.backward()
    for parameter in net.parameters():
        assert parameter.grad is not None
        parameter.grad = ctx.all_reduce(parameter.grad, mesh, "dp", op="avg")
    optimizer.step()
    optimizer.zero_grad()
    return float(ctx.all_reduce(loss.detach(), mesh, "dp", op="avg").item())


def train(ctx: fmesh.Context, steps: int, lose: int, at: int, directory: str) -> Any:
    """Train ``steps`` steps; rank ``lose`` dies at the start of step ``at``; the survivors recover in place (every
    one holds the whole model: nothing to reload) and redo that step in the smaller world."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses: list[float] = []
    finished_after_death = None
    step = 0
    while step < steps:
        if step == at and ctx.rank == lose and ctx.world_size > lose:
            pathlib.Path(directory, "death").write_text(repr(time.time()))
            os._exit(9)
        try:
            losses.append(step_of(ctx, net, optimizer, step))
        except fmesh.RankLostError:
            optimizer.zero_grad()  # the failed step's gradients: its update never happened
            renewed = ctx.recover([lose])
            assert renewed is not None
            ctx = renewed
            continue
        if finished_after_death is None and ctx.world_size < 4:
            finished_after_death = time.time()
        step += 1
    ctx.close()
    return losses, finished_after_death, ctx.world_size


def one_process(steps: int) -> list[float]:
    """The same training in one process on the whole global batch: the losses data parallelism must give, in any
    world (equal shards: the average of the shards' losses and gradients is the whole batch's)."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        inputs, targets = batch(step)
        loss = torch.nn.functional.mse_loss(net(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.item()))
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4, help="ranks (Ray actors), default 4")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--at", type=int, default=3, help="the step at whose start the last rank dies")
    parser.add_argument("--address", default=None, help="an existing Ray cluster's address ('auto'); default: a "
                                                        "local one with a CPU per worker")
    args = parser.parse_args(argv)
    import ray

    if args.address:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    else:
        ray_actors.start_local_cluster(num_cpus=args.workers)
    lose = args.workers - 1
    try:
        with tempfile.TemporaryDirectory() as directory:
            started = time.monotonic()
            results = ray_actors.launch(lambda ctx: train(ctx, args.steps, lose, args.at, directory), args.workers,
                                        timeout=180, on_rank_loss="continue", context_options={"creation_timeout": 30})
            died = float(pathlib.Path(directory, "death").read_text())
    finally:
        ray.shutdown()
    print(f"{args.workers} Ray actors, {args.steps} steps, rank {lose} dies at step {args.at}: "
          f"{time.monotonic() - started:.1f} s in all")
    lost = results[lose]
    print(f"rank {lose}: {type(lost).__name__}: {lost}")
    survivors = results[:lose]
    for rank, (losses, _, size) in enumerate(survivors):
        print(f"rank {rank}: world {size} after the loss; losses {' '.join(f'{x:.4f}' for x in losses)}")
    expected = one_process(args.steps)
    agree = all(len(result[0]) == args.steps and all(abs(a - b) < 1e-5 for a, b in zip(result[0], expected,
                                                                                          strict=True))
                for result in survivors)
    print(f"one process on the whole batch: losses {' '.join(f'{x:.4f}' for x in expected)}")
    print(f"every survivor's losses equal those, within 1e-5, before and after the loss: {agree}")
    recovered = max(result[1] for result in survivors) - died
    print(f"death -> next step on every survivor: {recovered:.2f} s")
    return 0 if agree and isinstance(lost, fmesh.LaunchError) else 1


if __name__ == "__main__":
    sys.exit(main())
