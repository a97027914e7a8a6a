"""Train a small transformer language model with several parallelisms at once, on fmesh meshes.

    torchrun --nproc-per-node 4 examples/train.py --tp 2            # tp 2 x dp_shard 2, CPU and gloo
    python examples/train.py                                        # one process, no launcher
    torchrun --nproc-per-node 4 examples/train.py --tp 2 --steps 40 --checkpoint-dir /tmp/ckpt
    torchrun --nproc-per-node 4 examples/train.py --tp 2 --steps 60 --checkpoint-dir /tmp/ckpt --resume
    python examples/train.py --processes 4 --batch-size 12 --steps 20 --checkpoint-every 5 \
        --checkpoint-dir /tmp/ckpt --lose-rank 3 --at-step 8            # elastic: rank 3 dies, 3 go on

The world mesh comes from ``fmesh.ParallelDims``; ``fmesh.Context.from_env()`` owns the process
groups (NCCL and one GPU per process when GPUs are present, gloo on the CPU otherwise, with no code
change; ``--backend gloo`` keeps a GPU machine on the CPU). The meshes name no device: what torch
receives is on the context's device. FSDP2 (``fully_shard``)
shards over the data-parallel shard mesh (HSDP when ``--dp-replicate`` > 1), tensor parallelism
(``parallelize_module``) splits attention heads and MLP columns over ``tp``, and the loss is averaged
with the context over the data-parallel mesh. Checkpoints use ``torch.distributed.checkpoint``.

Elastic mode (``--processes N --lose-rank R --at-step K``): ``fmesh.launch`` runs N gloo ranks in this
process and lets the others live on when one dies (``on_rank_loss="continue"``); rank R exits at step K;
the survivors' next collective fails, they call ``ctx.recover([R], smaller.world_mesh)`` with the job
``fmesh.plan.rescale.scale_down`` computes (a data-parallel degree absorbs the loss), shard the model over the new
meshes, load the last checkpoint (resharded by ``torch.distributed.checkpoint``) and train on.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import fmesh
from fmesh.plan.job_table import format_plan
from fmesh.plan.jobs import build_plan

# A tiny shipped corpus (character level); the model learns its spelling quickly.
CORPUS = (
    "A mesh is a value: a universe of ranks and one layout per named axis. Slicing, flattening and "
    "unflattening are pure functions that cost nothing at any world size. The context owns the process "
    "groups, creates each one the first time a collective needs it, and shares it between every mesh that "
    "puts the same ranks together. Tensor parallelism splits the heads; the data-parallel ranks shard the "
    "weights and see different slices of the batch; the loss is averaged over the data-parallel mesh. "
) * 8


class UsageError(Exception):
    """Bad flags or a checkpoint that does not fit: one line on rank 0, a clean exit everywhere."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints on every rank and exits; we report once
        raise UsageError(message)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(prog="train.py", description=__doc__.splitlines()[0])
    for degree in ("pp", "dp-replicate", "dp-shard", "cp", "tp"):
        parser.add_argument(f"--{degree}", type=int, default=-1 if degree == "dp-shard" else 1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8, help="global batch, in sequences")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true",
                        help="FSDP2 mixed precision: bf16 weights in compute and in the all-gather, fp32 gradient "
                             "reduction and optimizer (needs a data-parallel degree above 1)")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--checkpoint-dir", type=pathlib.Path)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    parser.add_argument("--losses-to", type=pathlib.Path, help="write the step losses (JSON) here, from rank 0")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="auto: NCCL when GPUs are present, else gloo (default)")
    parser.add_argument("--processes", type=int, help="run this many gloo ranks here (fmesh.launch), no torchrun")
    parser.add_argument("--lose-rank", type=int, help="elastic mode: this rank's process exits at --at-step")
    parser.add_argument("--at-step", type=int, default=0, help="the step at which --lose-rank exits")
    parser.add_argument("--elastic", action="store_true",
                        help="under torchrun --nnodes MIN:MAX: resume from --checkpoint-dir whenever it holds a "
                             "checkpoint, resharded over this world (after a node is lost, torchrun restarts us)")
    args = parser.parse_args(argv)
    if args.pp != 1 or args.cp != 1:
        raise UsageError(f"--pp {args.pp} --cp {args.cp}: this example trains with pp=1 and cp=1 (tp and dp only)")
    if args.elastic and args.checkpoint_dir is None:
        raise UsageError("--elastic needs --checkpoint-dir")
    if args.resume and args.checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir")
    if args.lose_rank is not None:
        if args.processes is None or args.checkpoint_dir is None:
            raise UsageError("--lose-rank needs --processes (ranks in this process) and --checkpoint-dir (to resume)")
        if not 0 <= args.lose_rank < args.processes:
            raise UsageError(f"--lose-rank {args.lose_rank}: expected a rank in 0..{args.processes - 1}")
    for name in ("steps", "batch_size", "seq_len", "dim", "heads", "layers"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


# --------------------------------------------------------------------- model


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q, k, v = (proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(seed: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """Global batch ``step`` -> tokens; the same on every rank for the same seed and step."""
    data = torch.tensor(list(CORPUS.encode()), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])


# ------------------------------------------------------------------ training


def device_meshes(ctx: fmesh.Context, dims: fmesh.ParallelDims) -> tuple[Any, Any]:
    """torch's tp mesh and data-parallel mesh (``None`` where the degree is 1), on the context's device."""
    tp_mesh = ctx.device_mesh(dims.mesh("tp")) if dims.tp > 1 else None
    # 1-D for FSDP, (dp_replicate, dp_shard_cp) for HSDP
    dp_mesh = ctx.device_mesh(dims.fsdp_mesh()) if dims.world_size // dims.tp > 1 else None
    return tp_mesh, dp_mesh


def shard_model(model: LanguageModel, ctx: fmesh.Context, dims: fmesh.ParallelDims,
                mixed_precision: bool = False) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_mesh, dp_mesh = device_meshes(ctx, dims)
    if tp_mesh is not None:
        plan = {f"blocks.{i}.{name}": ColwiseParallel() for i in range(len(model.blocks))
                for name in ("attention.q", "attention.k", "attention.v", "up")}
        plan |= {f"blocks.{i}.{name}": RowwiseParallel() for i in range(len(model.blocks))
                 for name in ("attention.o", "down")}
        parallelize_module(model, tp_mesh, plan)
    if dp_mesh is not None:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        policy = {"mp_policy": bf16} if mixed_precision else {}
        for block in model.blocks:
            fully_shard(block, mesh=dp_mesh, **policy)
        fully_shard(model, mesh=dp_mesh, **policy)


def check_degrees(args: argparse.Namespace, world_size: int) -> fmesh.ParallelDims:
    try:
        dims = fmesh.ParallelDims(world_size, dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, tp=args.tp)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from None
    dp = dims.world_size // dims.tp
    if args.heads % dims.tp or args.dim % args.heads:
        raise UsageError(f"--heads {args.heads} must divide --dim {args.dim} and be divisible by --tp {dims.tp}")
    if args.batch_size % dp:
        raise UsageError(f"--batch-size {args.batch_size} must be divisible by the data-parallel size {dp}")
    if args.bf16 and dp == 1:
        raise UsageError("--bf16 is FSDP2's mixed precision, so it needs a data-parallel degree above 1")
    return dims


def args_model(args: argparse.Namespace) -> list[int]:
    return [args.dim, args.heads, args.layers, args.seq_len]


def describe(dims: fmesh.ParallelDims, args: argparse.Namespace) -> dict[str, Any]:
    return {"degrees": dict(dims.degrees), "world_size": dims.world_size, "model": args_model(args)}


def checked_checkpoint(directory: pathlib.Path, dims: fmesh.ParallelDims, args: argparse.Namespace,
                       reshard: bool) -> dict[str, Any]:
    """The checkpoint's metadata, once it is known to fit this run (a ``UsageError`` otherwise): read before the
    model is built, so every rank refuses it at the same moment (rank 0, which reports it, leaves last)."""
    meta_path = directory / "fmesh.json"
    if not meta_path.exists():
        raise UsageError(f"--resume: no checkpoint in {directory} (missing {meta_path.name})")
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    saved, now = (meta["mesh"], describe(dims, args)) if not reshard else (meta["mesh"]["model"], args_model(args))
    if saved != now:
        raise UsageError(f"checkpoint in {directory} was saved with {meta['mesh']}, "
                         f"but this run has {describe(dims, args)}; resume with the same degrees and model")
    return meta


def load_checkpoint(directory: pathlib.Path, dims: fmesh.ParallelDims, args: argparse.Namespace,
                    model: nn.Module, optimizer: torch.optim.Optimizer, reshard: bool = False) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = checked_checkpoint(directory, dims, args, reshard)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory / meta.get("state", "state")))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return int(meta["step"])


def save_checkpoint(directory: pathlib.Path, step: int, ctx: fmesh.Context, dims: fmesh.ParallelDims,
                    args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # Each step's state in a directory of its own, and fmesh.json, which names it, replaced whole once every rank
    # saved: a job killed while it saves resumes from the last checkpoint complete (one directory written over at
    # each step was found half-written by a resume, EOFError, when a node was killed during the next save).
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = f"state-{step}"
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / state))
    ctx.barrier()
    if ctx.rank == 0:
        meta_path = directory / "fmesh.json"
        previous = json.loads(meta_path.read_text()).get("state") if meta_path.exists() else None
        written = directory / "fmesh.json.tmp"
        written.write_text(json.dumps({"step": step, "mesh": describe(dims, args), "state": state}))
        os.replace(written, meta_path)
        if previous and previous != state:
            shutil.rmtree(directory / previous, ignore_errors=True)
    ctx.barrier()


def train(args: argparse.Namespace, ctx: fmesh.Context) -> list[float]:
    dims = check_degrees(args, ctx.world_size)
    if ctx.rank == 0 and args.elastic:
        print(f"world {ctx.world_size} (torchrun restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}): "
              f"{dict(dims.degrees)}", flush=True)
    if ctx.rank == 0 and not (args.resume and args.lose_rank is not None):  # a recovered job printed its degrees
        print(format_plan(build_plan(ctx.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)),
                                     dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp)))
    resharding = args.lose_rank is not None or args.elastic
    if args.elastic and (args.checkpoint_dir / "fmesh.json").exists():
        args.resume = True
    if args.resume:  # refused here, before the model is built: every rank at once (built first, they drifted apart)
        checked_checkpoint(args.checkpoint_dir, dims, args, resharding)
    torch.manual_seed(args.seed)
    model = LanguageModel(256, args.dim, args.heads, args.layers, args.seq_len).to(ctx.device)
    shard_model(model, ctx, dims, mixed_precision=args.bf16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    if args.resume:
        start = load_checkpoint(args.checkpoint_dir, dims, args, model, optimizer, reshard=resharding)
        if ctx.rank == 0:
            print(f"resumed from step {start} in {args.checkpoint_dir}")
    dp_mesh = dims.mesh("dp")
    (dp_index,) = dp_mesh.coordinate(ctx.rank) or (0,)
    losses: list[float] = []
    tokens_per_step = args.batch_size * args.seq_len
    for step in range(start, args.steps):
        if step == args.at_step and ctx.rank == args.lose_rank and not args.resume:
            print(f"rank {ctx.rank}: exits at step {step} (--lose-rank)", flush=True)
            if args.checkpoint_dir:  # when it died, for the survivors' "death -> next step" (one machine's clock)
                (args.checkpoint_dir / "died_at").write_text(repr(time.time()))
            os._exit(1)  # gone without a word, as a crashed process
        began = time.perf_counter()
        batch = batches(args.seed * 1_000_003 + step, args.batch_size, args.seq_len)
        local = batch.chunk(dp_mesh.size)[dp_index].to(ctx.device)  # this data-parallel rank's slice
        logits = model(local[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), local[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        global_loss = ctx.all_reduce(loss.detach(), dp_mesh, op="avg").item()
        losses.append(global_loss)
        died = args.checkpoint_dir / "died_at" if args.checkpoint_dir else None
        if step == start and args.lose_rank is not None and args.resume and ctx.rank == 0 and died and died.exists():
            # the figure the elastic guide promises: detection, recover, the checkpoint's reload and this step
            print(f"death -> next step: {time.time() - float(died.read_text()):.2f} s", flush=True)
        if ctx.rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            rate = tokens_per_step / (time.perf_counter() - began)
            print(f"step {step:>4}  loss {global_loss:.4f}  {rate:,.0f} tokens/s", flush=True)
        if args.checkpoint_dir and ((step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps):
            save_checkpoint(args.checkpoint_dir, step + 1, ctx, dims, args, model, optimizer)
    if ctx.rank == 0:
        stats = ctx.stats()
        print(f"groups created by the context: {stats['groups_created']} (cache hits {stats['cache_hits']})")
        for ranks, backend in stats["groups"]:
            print(f"  {backend} group of rank 0: {list(ranks)}")
        if args.losses_to:
            args.losses_to.write_text(json.dumps({"start": start, "losses": losses}))
    return losses


def train_elastic(args: argparse.Namespace, ctx: fmesh.Context) -> list[float]:
    """``train``; when a rank is lost (``--lose-rank``), the survivors recover onto the smaller job and train on
    from the last checkpoint."""
    try:
        return train(args, ctx)
    except (fmesh.RankLostError, RuntimeError):  # FSDP's own collectives raise the backend's RuntimeError
        if args.lose_rank is None:
            raise
    lost, began = [args.lose_rank], time.perf_counter()
    smaller = fmesh.plan.rescale.scale_down(check_degrees(args, ctx.world_size), lost)
    renewed = ctx.recover(lost, smaller.world_mesh)
    if renewed is None:  # a survivor outside the smaller job (its whole slice was dropped): it leaves
        return []
    with renewed:
        if renewed.rank == 0:
            print(f"lost rank {args.lose_rank}: recovered in {time.perf_counter() - began:.2f} s onto "
                  f"{dict(smaller.degrees)} ({smaller.world_size} ranks); resuming from {args.checkpoint_dir}",
                  flush=True)
        resumed = argparse.Namespace(**{**vars(args), "resume": True, "dp_replicate": smaller.dp_replicate,
                                        "dp_shard": smaller.dp_shard, "tp": smaller.tp})
        return train(resumed, renewed)


def run_here(args: argparse.Namespace) -> int:
    """``--processes N``: N gloo ranks in this process (``fmesh.launch``); a rank that dies leaves the others
    running, so that they can recover."""
    results = fmesh.launch(lambda ctx: train_elastic(args, ctx), args.processes, timeout=600,
                           on_rank_loss="continue", return_exceptions=True)
    failed = [r for r, result in enumerate(results) if isinstance(result, BaseException) and r != args.lose_rank]
    for rank in failed:
        print(f"train.py: rank {rank} failed: {results[rank]}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def open_context(args: argparse.Namespace) -> fmesh.Context:
    """``Context.from_env``; under ``--elastic``, the default group meets in a namespace of the launcher's store of
    its own per torchrun restart: torchrun's c10d rendezvous hands every round the same store, and a restarted
    gloo default group would otherwise read the dead round's addresses (its keys are not per round)."""
    backend = None if args.backend == "auto" else args.backend
    if not args.elastic or "MASTER_ADDR" not in os.environ:
        return fmesh.Context.from_env(backend=backend)
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return fmesh.Context(backend=backend or "gloo", rank=int(os.environ["RANK"]),
                         world_size=int(os.environ["WORLD_SIZE"]),
                         store=dist.PrefixStore(f"fmesh-restart-{restart}", store))


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    rank = int(os.environ.get("RANK", "0"))
    try:
        args = parse(argv)
        if args.processes is not None:
            return run_here(args)
        # Under plain `python` (no launcher variables) the context is a world of one, and says so.
        with open_context(args) as ctx:
            check_degrees(args, ctx.world_size)  # every rank checks the same pure numbers: no hang
            train(args, ctx)
    except UsageError as error:
        # Every rank sees the same error (the checks are pure, or read the same files): rank 0 reports
        # it and fails the job; the others leave quietly, so the launcher has nobody to kill.
        if rank == 0:
            print(f"train.py: error: {error}", file=sys.stderr, flush=True)
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                time.sleep(1.0)  # leave last: a launcher kills the ranks still running when one fails
            return 2
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
