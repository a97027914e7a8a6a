"""The hypothesis strategies the tests share, in one module (no test file imports another): meshes after random
operations with their brute-force references (:func:`steps`, :func:`runs`), meshes and jobs to lose ranks from
(:func:`meshes`, :func:`jobs`, :func:`lost_ranks`), meshes to shard tensors over (:func:`sharding_meshes`)."""

from __future__ import annotations

import itertools
import math

from hypothesis import assume
from hypothesis import strategies as st
from reference import RefMesh
from reference import concat as ref_concat

import fmesh
from fmesh import Mesh

# ------------------------------------------------------- meshes after random operations, with their references

NAMES = "abcde"


@st.composite
def roots(draw: st.DrawFn, max_world: int = 256, min_size: int = 1, max_size: int = 5,
          least: int = 1) -> tuple[Mesh, RefMesh]:
    sizes = draw(st.lists(st.integers(least, 6), min_size=min_size, max_size=max_size)
                 .filter(lambda s: math.prod(s) <= max_world))
    names = NAMES[: len(sizes)]
    world = math.prod(sizes)
    rank_map = draw(st.one_of(st.none(), st.permutations(range(world))))
    return fmesh.make_mesh(sizes, tuple(names), rank_map=rank_map), RefMesh.root(sizes, names, rank_map)


def factorizations(n: int) -> list[tuple[int, ...]]:
    result = [(d, n // d) for d in range(1, n + 1) if n % d == 0]
    result += [(a, b, n // (a * b)) for a, b in itertools.product(range(1, n + 1), repeat=2) if n % (a * b) == 0]
    return result


def uneven_splits(mesh: Mesh) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """``(axes, sizes)``: flattening ``axes`` (strided: not in the mesh's order, or not adjacent) and splitting
    the result into ``sizes`` re-indexes the universe (a frame). Empty when this mesh has no such split."""
    found = []
    for axes in itertools.permutations(mesh.axis_names, 2):
        if any(mesh.shape[a] == 1 for a in axes):
            continue
        flat = fmesh.flatten(mesh, axes, "uneven")
        for sizes in factorizations(flat.shape["uneven"]):
            if len(sizes) == 2 and 1 not in sizes and fmesh.unflatten(flat, "uneven", {"u0": sizes[0],
                                                                                       "u1": sizes[1]}).frame:
                found.append((axes, sizes))
    return found


@st.composite
def runs(draw: st.DrawFn) -> tuple[Mesh, RefMesh, bool]:
    """A root, in two draws of three an uneven split first (the frames random ops alone almost never reach), then
    1-4 random operations; and whether any step of it had a frame."""
    fresh = iter(f"n{i}" for i in range(100))
    framed = False
    splits: list[tuple[tuple[str, ...], tuple[int, ...]]] = []
    if draw(st.sampled_from((True, True, False))):  # a root with an uneven split (2-6 × 2-6, factored otherwise)
        mesh, ref = draw(roots(min_size=2, max_size=3, least=2))
        splits = uneven_splits(mesh)
    else:
        mesh, ref = draw(roots())
    if splits:
        axes, sizes = draw(st.sampled_from(splits))
        merged, new = next(fresh), {next(fresh): sizes[0], next(fresh): sizes[1]}
        mesh = fmesh.unflatten(fmesh.flatten(mesh, axes, merged), merged, new)
        ref = ref.flatten(axes, merged).unflatten(merged, new)
        framed = True
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["slice", "flatten", "unflatten", "select", "rename", "concat"]))
        names = list(mesh.axis_names)
        if op == "slice":
            kept = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
            mesh, ref = fmesh.slice(mesh, *kept), ref.slice(*kept)
        elif op == "flatten":
            merged = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
            name = next(fresh)
            mesh, ref = fmesh.flatten(mesh, merged, name), ref.flatten(merged, name)
        elif op == "unflatten":
            axis = draw(st.sampled_from(names))
            sizes = draw(st.sampled_from(factorizations(mesh.shape[axis])))
            new = {next(fresh): s for s in sizes}
            mesh, ref = fmesh.unflatten(mesh, axis, new), ref.unflatten(axis, new)
        elif op == "select" and len(names) > 1:
            axis = draw(st.sampled_from(names))
            c = draw(st.integers(0, mesh.shape[axis] - 1))
            mesh, ref = fmesh.select(mesh, **{axis: c}), ref.select(**{axis: c})
        elif op == "rename":
            axis = draw(st.sampled_from(names))
            new_name = next(fresh)
            mesh, ref = fmesh.rename(mesh, {axis: new_name}), ref.rename({axis: new_name})
        elif op == "concat" and len(names) > 1:
            order = draw(st.permutations(names))
            cut = draw(st.integers(1, len(names) - 1))
            left, right = order[:cut], order[cut:]
            mesh = fmesh.concat(fmesh.slice(mesh, *left), fmesh.slice(mesh, *right))
            ref = ref_concat(ref.slice(*left), ref.slice(*right))
        framed = framed or bool(mesh.frame)
    return mesh, ref, framed


def steps() -> st.SearchStrategy[tuple[Mesh, RefMesh]]:
    """A mesh after a random sequence of operations (:func:`runs`), and its reference."""
    return runs().map(lambda run: (run[0], run[1]))


# ----------------------------------------------------------------- meshes and jobs that lose ranks


@st.composite
def meshes(draw: st.DrawFn) -> fmesh.Mesh:
    """A mesh of up to 4 axes over at most 64 ranks, maybe permuted, maybe sliced or with adjacent axes flattened."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4).filter(lambda s: math.prod(s) <= 64))
    names = tuple("abcd"[: len(sizes)])
    world = math.prod(sizes)
    rank_map = draw(st.one_of(st.none(), st.permutations(range(world))))
    mesh = fmesh.make_mesh(tuple(sizes), names, rank_map=rank_map)
    how = draw(st.sampled_from(("root", "slice", "flatten")))
    if how == "slice":
        mesh = fmesh.slice(mesh, *draw(st.permutations(names).flatmap(lambda p: st.sampled_from(
            [p[:k] for k in range(1, len(p) + 1)]))))
    elif how == "flatten" and len(names) > 1:
        start = draw(st.integers(0, len(names) - 2))
        stop = draw(st.integers(start + 2, len(names)))
        mesh = fmesh.flatten(mesh, names[start:stop], "flat")
    return mesh


@st.composite
def jobs(draw: st.DrawFn) -> fmesh.ParallelDims:
    """ParallelDims of at most 64 ranks, with expert parallelism where the degrees allow it."""
    pp, replicate, shard = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    cp, tp = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    world = pp * replicate * shard * cp * tp
    assume(world <= 64)
    etp = draw(st.sampled_from((1, tp)))
    region = shard * cp * (tp if etp == 1 else 1)
    ep = draw(st.sampled_from([d for d in range(1, region + 1) if region % d == 0]))
    rank_map = draw(st.one_of(st.none(), st.permutations(range(world))))
    return fmesh.ParallelDims(world, pp=pp, dp_replicate=replicate, dp_shard=shard, cp=cp, tp=tp, ep=ep, etp=etp,
                              rank_map=rank_map)


def lost_ranks(world: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, world - 1), min_size=1, max_size=3)


# ----------------------------------------------------------------- meshes to shard tensors over


@st.composite
def sharding_meshes(draw: st.DrawFn) -> fmesh.Mesh:
    """A mesh over at most 12 ranks, its rank map permuted, then up to 3 of: any two axes flattened (adjacent or
    not), an axis unflattened, the axes transposed, a sub-mesh sliced out (fewer axes: not every rank in it)."""
    sizes = draw(st.sampled_from([(2, 3), (2, 2, 2), (3, 2, 2), (4,), (2, 6), (2, 2, 3), (12,)]))
    names = tuple("abc"[: len(sizes)])
    world = math.prod(sizes)
    mesh = fmesh.make_mesh(sizes, names, rank_map=draw(st.permutations(range(world))))
    for step in range(draw(st.integers(0, 3))):
        now = mesh.axis_names
        what = draw(st.sampled_from(("flatten", "unflatten", "transpose", "sub-mesh")))
        if what == "flatten" and len(now) >= 2:
            mesh = mesh.flatten(tuple(draw(st.permutations(now))[:2]), f"f{step}")
        elif what == "unflatten":
            axis = draw(st.sampled_from(now))
            size = mesh.shape[axis]
            split = next((k for k in (2, 3) if size % k == 0 and size > k), None)
            if split is not None:
                mesh = mesh.unflatten(axis, {f"u{step}": split, f"v{step}": size // split})
        elif what == "transpose" and len(now) >= 2:
            mesh = mesh.slice(*draw(st.permutations(now)))
        elif what == "sub-mesh" and len(now) >= 2:
            mesh = mesh.slice(*draw(st.permutations(now))[:-1])
    return mesh
