"""The backward of every tensor collective, on real gloo processes, against plain autograd in one process.

Each rank runs the collective on its input and backpropagates its own loss ``(out * weight).sum()``.
Each rank also writes the collective's definition out for every rank's input at once (all inputs are
drawn from one seed, so every rank can make them all), sums every rank's loss, and calls
``backward`` with plain autograd: its own input's gradient there must equal the one fmesh gave it.
Random shapes; every axis and every pair of axes of 2- and 3-axis meshes with permuted rank maps.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support import MESHES, axis_sets, launch, one_axis_views, random_perm, shift_perm, succeeded

import fmesh
from fmesh import Context, Mesh

# A collective as fmesh runs it on this rank, and as its definition for rank r given every rank's input.
Run = Callable[[Context, torch.Tensor], torch.Tensor]
Define = Callable[[list[torch.Tensor], int], torch.Tensor]


def inputs(seed: str, world: int, shape: tuple[int, ...], define: Define) -> tuple[list[torch.Tensor], ...]:
    """Every rank's input, and its loss weight (of its output's shape): the same on every rank (one seed)."""
    generator = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    xs = [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(world)]
    weights = [torch.randn(define(xs, r).shape, generator=generator, dtype=torch.float64) for r in range(world)]
    return xs, weights


def cases(mesh: Mesh, axes: tuple[str, ...], rng: random.Random) -> list[tuple[str, tuple[int, ...], Run, Define]]:
    """(label, input shape, fmesh's call, the definition) for each collective along ``axes`` of ``mesh``."""
    n = len(mesh.group(0, axes))

    def group(r: int) -> tuple[int, ...]:
        return mesh.group(r, axes)

    def shape(split: int | None = None) -> tuple[int, ...]:
        dims = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
        if split is not None:
            dims[split % len(dims)] *= n
        return tuple(dims)

    found: list[tuple[str, tuple[int, ...], Run, Define]] = []
    found.append(("all_reduce sum", shape(), lambda ctx, x: ctx.all_reduce(x, mesh, axes),
                  lambda xs, r: sum(xs[g] for g in group(r))))  # type: ignore[misc]
    found.append(("all_reduce avg", shape(), lambda ctx, x: ctx.all_reduce(x, mesh, axes, op="avg"),
                  lambda xs, r: sum(xs[g] for g in group(r)) / n))  # type: ignore[misc]
    gather = shape()
    dim = rng.randrange(len(gather))
    found.append((f"all_gather dim={dim}", gather, lambda ctx, x: ctx.all_gather(x, mesh, axes, dim=dim),
                  lambda xs, r: torch.cat([xs[g] for g in group(r)], dim)))
    for op in ("sum", "avg"):
        scatter = shape()
        sdim = rng.randrange(len(scatter))
        scatter = tuple(size * n if i == sdim else size for i, size in enumerate(scatter))
        found.append((f"reduce_scatter {op} dim={sdim}", scatter,
                      lambda ctx, x, op=op, sdim=sdim: ctx.reduce_scatter(x, mesh, axes, dim=sdim, op=op),
                      lambda xs, r, op=op, sdim=sdim: (sum(xs[g] for g in group(r)) / (n if op == "avg" else 1)).chunk(
                          n, sdim)[group(r).index(r)]))
    a2a = shape(split=0)
    concat = rng.randrange(len(a2a))
    found.append((f"all_to_all concat={concat}", a2a, lambda ctx, x: ctx.all_to_all(x, mesh, axes, 0, concat),
                  lambda xs, r: torch.cat([xs[g].chunk(n, 0)[group(r).index(r)] for g in group(r)], concat)))
    src = rng.randrange(n)
    found.append((f"broadcast src={src}", shape(), lambda ctx, x: ctx.broadcast(x, mesh, axes, src=src),
                  lambda xs, r: xs[group(r)[src]] * 1))
    return found


def permute_cases(view: Mesh, axis: str, mesh: Mesh, axes: tuple[str, ...],
                  rng: random.Random) -> list[tuple[str, tuple[int, ...], Run, Define]]:
    """ppermute with random permutations and shift, along one axis (an axis, or a pair flattened)."""
    n = len(mesh.group(0, axes))
    found: list[tuple[str, tuple[int, ...], Run, Define]] = []

    def define(perm: list[tuple[int, int]]) -> Define:
        def received(xs: list[torch.Tensor], r: int) -> torch.Tensor:
            group = mesh.group(r, axes)
            senders = [group[s] for s, d in perm if d == group.index(r)]
            return xs[senders[0]] * 1 if senders else torch.zeros_like(xs[r])
        return received

    for perm in (random_perm(rng, n), [(i, (i + 1) % n) for i in range(n)]):
        found.append((f"ppermute {perm}", (2, rng.randint(1, 3)),
                      lambda ctx, x, perm=perm: ctx.ppermute(x, view, axis, perm), define(perm)))
    for offset, wrap in ((1, False), (-1, True)):
        found.append((f"shift offset={offset} wrap={wrap}", (3,),
                      lambda ctx, x, o=offset, w=wrap: ctx.shift(x, view, axis, offset=o, wrap=w),
                      define(shift_perm(n, offset, wrap))))
    return found


def check(ctx: Context, label: str, shape: tuple[int, ...], run: Run, define: Define, seed: str,
          problems: list[str]) -> None:
    xs, weights = inputs(seed, ctx.world_size, shape, define)
    mine = xs[ctx.rank].clone().requires_grad_()
    (run(ctx, mine) * weights[ctx.rank]).sum().backward()
    everyone = [x.clone().requires_grad_() for x in xs]
    # (The zero term keeps the graph when no output depends on any input: a ppermute that moves nothing.)
    total = sum((define(everyone, r) * weights[r]).sum() for r in range(ctx.world_size)) + 0 * everyone[0].sum()
    total.backward()
    # An input no output depends on (broadcast from another member, a ppermute that sends nothing) gets none.
    want = everyone[ctx.rank].grad
    want = torch.zeros_like(xs[ctx.rank]) if want is None else want
    if mine.grad is None or not torch.allclose(mine.grad, want, rtol=0, atol=1e-6):
        problems.append(f"{label} {seed}: got {mine.grad} want {want}")


def gradients(ctx: Context) -> dict[str, Any]:
    """Every collective's input gradient along every axis and pair of axes, against plain autograd."""
    problems: list[str] = []
    counts: dict[str, int] = {}
    for sizes, names, rank_map in MESHES[ctx.world_size]:
        mesh = fmesh.make_mesh(sizes, names, rank_map=rank_map)
        for axes in axis_sets(mesh):
            rng = random.Random(f"{sizes}{rank_map}{axes}")  # the same draws on every rank
            for label, shape, run, define in cases(mesh, axes, rng):
                check(ctx, label, shape, run, define, f"{label} {axes} {sizes} {rank_map}", problems)
                counts[label.split(" ")[0]] = counts.get(label.split(" ")[0], 0) + 1
        for view, axis, axes in one_axis_views(mesh):
            rng = random.Random(f"permute {sizes}{rank_map}{axes}")
            for label, shape, run, define in permute_cases(view, axis, mesh, axes, rng):
                check(ctx, label, shape, run, define, f"{label} {axes} {sizes} {rank_map}", problems)
                counts[label.split(" ")[0]] = counts.get(label.split(" ")[0], 0) + 1
    # No gradient where fmesh has none: the backward raises, naming the op.
    mesh = fmesh.make_mesh((ctx.world_size,), ("dp",))
    raised = {}
    for op in ("max", "min", "product"):
        x = torch.ones(2, dtype=torch.float64, requires_grad=True)
        try:
            ctx.all_reduce(x, mesh, "dp", op=op).sum().backward()
            raised[op] = "no error"
        except fmesh.NoGradientError as error:
            raised[op] = str(error)
    try:
        ctx.reduce_scatter(torch.ones(ctx.world_size, requires_grad=True), mesh, "dp", op="max").sum().backward()
        raised["reduce_scatter max"] = "no error"
    except fmesh.NoGradientError as error:
        raised["reduce_scatter max"] = str(error)
    # Without autograd recording, no Function: the result has no grad_fn.
    with torch.no_grad():
        plain = ctx.all_reduce(torch.ones(2, requires_grad=True), mesh, "dp")
    return {"problems": problems, "counts": counts, "raised": raised, "plain grad_fn": plain.grad_fn is None}


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_every_collective_backward_equals_autograd_on_the_global_loss(world: int) -> None:
    for result in succeeded(launch(gradients, world, timeout=400)):
        assert result["problems"] == []
        # Every kind of collective ran along many axes: a test that checks nothing fails here.
        assert set(result["counts"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                         "ppermute", "shift"}
        assert all(count >= 8 for count in result["counts"].values()), result["counts"]
        for op in ("max", "min", "product"):
            assert result["raised"][op].startswith(f"all_reduce op={op!r} along the group"), result["raised"]
            assert "has no gradient in fmesh" in result["raised"][op]
        assert result["raised"]["reduce_scatter max"].startswith("reduce_scatter op='max'")
        assert result["plain grad_fn"]


def tensor_parallel_mlp(ctx: Context) -> dict[str, Any]:
    """A 2-layer MLP split column/row-parallel over tp (4 ranks: dp=2 x tp=2, permuted), trained a few SGD
    steps, against the unsplit MLP trained in this process on the same data."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[2, 0, 3, 1])
    tp, me = 2, ctx.index(mesh, "tp")
    generator = torch.Generator().manual_seed(7)
    d, h, batch = 4, 6, 5
    w1 = torch.randn(d, h, generator=generator, dtype=torch.float64)
    w2 = torch.randn(h, d, generator=generator, dtype=torch.float64)
    data = [(torch.randn(batch, d, generator=generator, dtype=torch.float64),
             torch.randn(batch, d, generator=generator, dtype=torch.float64)) for _ in range(3)]
    full = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    # Column-parallel: this member's columns of w1; row-parallel: the same rows of w2.
    shard = [w1.chunk(tp, 1)[me].clone().requires_grad_(), w2.chunk(tp, 0)[me].clone().requires_grad_()]
    problems: list[str] = []
    for step, (x, target) in enumerate(data):
        x_full, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss_full = ((torch.relu(x_full @ full[0]) @ full[1] - target) ** 2).mean()
        inner = torch.relu(ctx.sum_gradients(x_split, mesh, "tp") @ shard[0])
        loss_split = ((ctx.sum_partials(inner @ shard[1], mesh, "tp") - target) ** 2).mean()
        loss_full.backward()
        loss_split.backward()
        wants = [full[0].grad.chunk(tp, 1)[me], full[1].grad.chunk(tp, 0)[me], x_full.grad]  # type: ignore[union-attr]
        for name, got, want in zip(("w1", "w2", "x"), (shard[0].grad, shard[1].grad, x_split.grad), wants,
                                   strict=True):
            if got is None or not torch.allclose(got, want, rtol=0, atol=1e-9):
                problems.append(f"step {step} grad {name}: got {got} want {want}")
        if abs(loss_full.item() - loss_split.item()) > 1e-9:
            problems.append(f"step {step} loss {loss_split.item()} want {loss_full.item()}")
        with torch.no_grad():
            for weights in (full, shard):
                for w in weights:
                    w -= 0.1 * w.grad  # type: ignore[operator]
                    w.grad = None
    # all_reduce in place of sum_partials differentiates the sum of the tp members' (equal) losses: twice.
    x = data[0][0].clone().requires_grad_()
    ((ctx.all_reduce(x, mesh, "tp") - data[0][1]) ** 2).mean().backward()
    doubled = x.grad
    x = data[0][0].clone().requires_grad_()
    ((ctx.sum_partials(x, mesh, "tp") - data[0][1]) ** 2).mean().backward()
    return {"problems": problems, "ratio": (doubled / x.grad).unique().tolist()}  # type: ignore[operator]


@pytest.mark.slow
def test_tensor_parallel_pair_trains_like_the_unsplit_mlp() -> None:
    for result in succeeded(launch(tensor_parallel_mlp, 4, timeout=120)):
        assert result["problems"] == []
        assert result["ratio"] == [2.0]
