"""Stress: 8 gloo processes create many groups over many meshes in a random, SPMD-consistent order,
with collectives between; and the same run with one rank's meshes changed ends in MeshMismatchError
on every rank. Bounded by the launch timeout."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
import torch
from support import patience

import fmesh
from fmesh import Context, Mesh

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

WORLD = 8
STEPS = 36


def universes(rank_maps: list[list[int] | None]) -> list[Mesh]:
    """Three universes of 8 ranks (identity, and two permutations) and meshes derived every which way."""
    cube = fmesh.make_mesh((2, 2, 2), ("a", "b", "c"), rank_map=rank_maps[0])
    grid = fmesh.make_mesh((2, 4), ("x", "y"), rank_map=rank_maps[1])
    line = fmesh.make_mesh((8,), ("w",), rank_map=rank_maps[2])
    return [
        cube,
        fmesh.flatten(cube, ("c", "a"), "ca"),
        fmesh.slice(cube, "c", "b"),
        fmesh.rename(cube, {"a": "pp"}),
        grid,
        fmesh.unflatten(grid, "y", {"y0": 2, "y1": 2}),
        fmesh.concat(grid["y"], grid["x"]),
        fmesh.select(grid, x=1),
        line,
        fmesh.unflatten(line, "w", {"p": 2, "q": 2, "r": 2}),
        fmesh.flatten(fmesh.unflatten(line, "w", {"p": 4, "q": 2}), ("q", "p"), "qp"),
    ]


def program(seed: int) -> list[tuple[int, tuple[str, ...]]]:
    """The same random sequence of (mesh index, axes) on every rank (SPMD)."""
    meshes = universes([None, None, None])
    rng = random.Random(seed)
    steps = []
    for _ in range(STEPS):
        index = rng.randrange(len(meshes))
        names = list(meshes[index].axis_names)
        axes = tuple(rng.sample(names, rng.randint(1, min(2, len(names)))))
        steps.append((index, axes))
    return steps


def rank_maps(seed: int) -> list[list[int] | None]:
    rng = random.Random(seed)
    return [None, rng.sample(range(WORLD), WORLD), rng.sample(range(WORLD), WORLD)]


def run_program(ctx: Context, seed: int, odd_rank: int | None) -> dict[str, Any]:
    maps = rank_maps(seed)
    if ctx.rank == odd_rank:  # this rank alone builds every mesh from other rank maps
        maps = rank_maps(seed + 1)
    meshes = universes(maps)
    used: set[tuple[int, ...]] = set()
    problems: list[str] = []
    for step, (index, axes) in enumerate(program(seed)):
        mesh = meshes[index]
        if mesh.coordinate(ctx.rank) is None:
            continue  # select() left this rank out
        group = mesh.group(ctx.rank, axes)
        if len(group) > 1:
            used.add(group)
        got = ctx.all_reduce(torch.tensor([float(ctx.rank)]), mesh, axes).item()
        if got != sum(group):
            problems.append(f"step {step} all_reduce {axes} of {mesh!r}: {got} != {sum(group)}")
        if step % 4 == 0:
            gathered = ctx.all_gather(torch.tensor([ctx.rank]), mesh, axes).tolist()
            if gathered != list(group):
                problems.append(f"step {step} all_gather {axes} of {mesh!r}: {gathered} != {list(group)}")
    # Last, every rank joins one new group of the whole world (reversed, so no earlier group is it).
    finale = fmesh.make_mesh((WORLD,), ("all",), rank_map=list(range(WORLD - 1, -1, -1)))
    ctx.all_reduce(torch.ones(1), finale, "all")
    used.add(finale.group(ctx.rank, "all"))
    stats = ctx.stats()
    return {"problems": problems, "created": stats["groups_created"], "distinct": len(used),
            "hits": stats["cache_hits"]}


def stress(seed: int, odd_rank: int | None = None) -> list[Any]:
    return fmesh.launch(functools.partial(run_program, seed=seed, odd_rank=odd_rank), WORLD,
                        timeout=patience(240, WORLD),
                        context_options={"timeout": patience(120, WORLD), "creation_timeout": patience(90, WORLD)},
                        return_exceptions=True)


def test_many_meshes_in_random_order_make_exactly_the_groups_used() -> None:
    for seed in (1, 2):
        for rank, result in enumerate(stress(seed)):
            assert not isinstance(result, BaseException), f"seed {seed} rank {rank}: {result!r}"
            assert result["problems"] == [], (seed, rank)
            assert result["created"] == result["distinct"], (seed, rank, result)
            assert result["hits"] > 0


def test_one_rank_with_other_meshes_ends_in_a_mismatch_on_every_rank() -> None:
    results = stress(seed=1, odd_rank=5)
    for rank, result in enumerate(results):
        assert isinstance(result, fmesh.MeshMismatchError), f"rank {rank}: {result!r}"
