"""Launched by tests/system/test_torchrun.py with ``torchrun --nproc-per-node 4``: an all_reduce along each
axis of a 2x2 mesh through ``fmesh.Context.from_env()``; one line per rank on success."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fmesh


def say(line: str) -> None:
    """One write per line: the 4 ranks share torchrun's stdout, and with PYTHONUNBUFFERED print()
    writes the text and its newline separately, so lines of different ranks could run together."""
    os.write(1, (line + "\n").encode())


def main() -> int:
    with fmesh.Context.from_env(backend="gloo", timeout=60) as ctx:  # gloo on the CPU, on a GPU machine too
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
        results = []
        for axis in ("dp", "tp"):
            got = ctx.all_reduce(torch.tensor([float(ctx.rank)]), mesh, axis)
            want = float(sum(mesh.group(ctx.rank, axis)))
            if got.item() != want:
                say(f"fmesh-torchrun rank {ctx.rank} FAILED along {axis}: {got.item()} != {want}")
                return 1
            results.append(f"{axis}={got.item():g}")
        ctx.barrier()
        say(
            f"fmesh-torchrun rank {ctx.rank}/{ctx.world_size} local_rank {os.environ['LOCAL_RANK']} "
            f"{ctx.backend} {' '.join(results)} ok"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
