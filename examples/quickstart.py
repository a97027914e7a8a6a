# torchrun --nproc-per-node 4 examples/quickstart.py  (plain python: a world of one)
import torch

import fmesh

with fmesh.Context.from_env() as ctx:  # gloo on CPU, NCCL on GPUs
    tp = 2 if ctx.world_size % 2 == 0 else 1
    mesh = fmesh.make_mesh((ctx.world_size // tp, tp), ("dp", "tp"))
    if ctx.rank == 0:
        print(fmesh.render(mesh, highlight="tp", rank=0))

    x = torch.full((2,), float(ctx.rank))
    summed = ctx.all_reduce(x, mesh, "tp")  # over this rank's tp group
    mean = ctx.all_reduce(x, mesh, "dp", op="avg")  # over its dp group
    tp_group, dp_group = mesh.group(ctx.rank, "tp"), mesh.group(ctx.rank, "dp")
    print(f"rank {ctx.rank}: tp group {tp_group} sums to {summed[0].item():g}, "
          f"dp group {dp_group} averages {mean[0].item():g}")
