"""The rules that move a split dimension: views and reshapes, concatenation, lookups, and writes at positions."""

from __future__ import annotations

from typing import Any

import attrs

from fmesh.spmd.call import Call, join, negative, varying_of
from fmesh.spmd.types import (
    INVARIANT,
    PARTIAL,
    PSUM,
    VAR,
    VARYING,
    AxisType,
    reshaped_dim,
)

# ---------------------------------------------------------------- views, indexing, concatenation

def _positive(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def view(call: Call, i: int) -> AxisType:
    """Views and reshapes: where the split dimension goes (:func:`fmesh.spmd.types.reshaped_dim`)."""
    t = call.t(0, i)
    if t.kind != VARYING or t.dim is None:
        return t
    before, after = call.shapes[0], call.out
    n, m = len(before), len(after)
    d, op, axis, name = t.dim, call.op.rstrip("_"), call.axes[i], call.operands[0].name
    p = _positive(d, n)
    if op in ("view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "reshape_as"):
        moved = reshaped_dim(before, after, d, t.stride, t.extent)
        if moved is None:
            raise call.refuse(i, f"the reshape spreads dimension {d}, which {axis!r} splits, over several "
                              "dimensions", f"ax.all_gather({name}, {axis!r}, dim={d}) first", 0)
        return AxisType(VARYING, moved[0], strided=t.strided, stride=moved[1], extent=moved[2])
    if op in ("alias", "detach", "lift_fresh", "contiguous", "clone"):
        return t
    if op == "expand":
        if after[m - n + p] != before[p]:
            raise call.refuse(i, f"expands dimension {d}, which {axis!r} splits", "expand before splitting", 0)
        return t
    if op in ("transpose", "swapaxes", "swapdims", "t", "numpy_T"):
        x, y = (0, 1) if op == "t" or len(call.args) < 3 else (int(call.args[1]) % n, int(call.args[2]) % n)
        return attrs.evolve(t, dim=(y if p == x else x if p == y else p) - n)
    if op == "permute":
        order = [int(v) % n for v in call.args[1]]
        return attrs.evolve(t, dim=order.index(p) - m)
    if op == "unsqueeze":
        k = int(call.args[1]) % m
        return attrs.evolve(t, dim=(p + (1 if k <= p else 0)) - m)
    if op == "squeeze":
        gone = {g for g in range(n) if before[g] == 1} if len(call.args) < 2 else {
            int(v) % n for v in (call.args[1] if isinstance(call.args[1], (list, tuple)) else [call.args[1]])
            if before[int(v) % n] == 1}
        if p in gone:
            return VAR  # a split dimension of one element: each member's own value
        return attrs.evolve(t, dim=p - sum(1 for g in gone if g < p) - m)
    if op in ("select", "slice", "narrow"):
        k = int(call.arg(1, "dim", 0)) % n
        if k != p:
            return attrs.evolve(t, dim=(p - (1 if op == "select" and k < p else 0)) - m)
        if op == "select" and before[p] == 1:
            return VAR
        if op == "slice" and after[p] == before[p]:
            return t
        raise call.refuse(i, f"takes part of dimension {d}, which {axis!r} splits: each member would take that part "
                          "of its own block", f"slice before splitting, or ax.all_gather({name}, {axis!r}, dim={d}) "
                          "first", 0)
    if op in ("split", "split_with_sizes", "unbind", "chunk", "tensor_split", "unsafe_split"):
        k = int(call.arg(2 if op != "unbind" else 1, "dim", 0)) % n
        if k != p:
            return attrs.evolve(t, dim=(p - (1 if op == "unbind" and k < p else 0)) - (m if op == "unbind" else n))
        if op == "unbind" and before[p] == 1:
            return VAR
        raise call.refuse(i, f"splits dimension {d}, which {axis!r} splits", f"ax.all_gather({name}, {axis!r}, "
                          f"dim={d}) first", 0)
    raise call.refuse(i, f"no rule follows dimension {d}, which {axis!r} splits, through {op}",
                      f"ax.all_gather({name}, {axis!r}, dim={d}) first", 0)


VIEWS = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "expand", "transpose", "swapaxes",
                   "swapdims", "t", "numpy_T", "permute", "unsqueeze", "squeeze", "select", "slice", "narrow",
                   "split", "split_with_sizes", "unbind", "chunk", "tensor_split", "unsafe_split", "detach",
                   "lift_fresh", "contiguous", "view_as", "reshape_as"})


def concatenation(call: Call, i: int) -> AxisType:
    """``cat``: along a dimension they all split it is a strided split; elsewhere the splits agree."""
    count = len(call.args[0])
    c = negative(int(call.arg(1, "dim", 0)), max(len(call.out), 1))
    types = [call.t(k, i) for k in range(count)]
    if any(t.kind == PARTIAL for t in types):
        if all(t.kind == PARTIAL for t in types) and len({t.pending for t in types}) == 1:
            return types[0]
        k = next(k for k, t in enumerate(types) if t.kind != PARTIAL)
        raise call.refuse(i, "joins a pending sum with a value that is not one", f"ax.psum(..., {call.axes[i]!r}) "
                          "first", k)
    along = [k for k, t in enumerate(types) if t.kind == VARYING and t.dim == c]
    if along:
        if len(along) != count:
            k = next(k for k in range(count) if k not in along)
            raise call.refuse(i, f"joins, along dimension {c} which {call.axes[i]!r} splits, a value that it does "
                              "not split there", f"ax.all_gather(..., {call.axes[i]!r}, dim={c}) first", k)
        return attrs.evolve(types[0], strided=count > 1 or types[0].strided)
    return varying_of(call, i, [(k, t.dim, t) for k, t in enumerate(types) if t.kind == VARYING])


def indexing(call: Call, i: int) -> AxisType:
    """Lookups (``embedding``, ``index``, ``index_select``, ``gather``): into a split dimension with indices each
    member made (varying), a pending sum of the rows it holds; with indices alike on every member, refused."""
    op = call.op
    x = call.t(0, i)
    looked = _looked_up(call)
    index_ops = [k for k in range(1, len(call.operands))]
    axis = call.axes[i]
    idx_types = [call.t(k, i) for k in index_ops]
    if x.kind == PARTIAL:
        if all(t.kind == INVARIANT for t in idx_types):
            return x
        raise call.refuse(i, "looks up a pending sum with indices that differ per member", "ax.psum first", 0)
    if any(t.kind == PARTIAL for t in idx_types):
        raise call.refuse(i, "indices that are a pending sum", f"ax.psum(indices, {axis!r}) first")
    if x.kind == VARYING and x.dim is not None and x.dim in looked:
        if any(t.kind == VARYING for t in idx_types):
            return PSUM  # each member's rows: zero the others' (masked_fill) and ax.psum (vocab-parallel)
        raise call.refuse(i, f"looks up dimension {x.dim}, which {axis!r} splits, with the same indices on every "
                          "member: each would read its own block at the global positions",
                          call.insert("all_gather", 0, axis, "(or shift each member's indices by its offset "
                                      "(ax.axis_index), zero the rows it does not hold and ax.psum)", dim=x.dim), 0)
    dims: list[tuple[int, int | None, Any]] = []
    if x.kind == VARYING:
        dims.append((0, _kept(call, x.dim), x))
    for k, t in zip(index_ops, idx_types, strict=True):
        if t.kind == VARYING:
            dims.append((k, _index_dim(call, k, t.dim), t))
    if any(d is None and call.t(k, i).dim is not None for k, d, _ in dims):
        k = next(k for k, d, _ in dims if d is None and call.t(k, i).dim is not None)
        raise call.refuse(i, f"no rule follows the dimension {axis!r} splits through this {op}",
                          f"ax.all_gather(..., {axis!r}) first", k)
    return varying_of(call, i, dims)


def _looked_up(call: Call) -> set[int]:
    n = call.operands[0].ndim
    if call.op == "embedding":
        return {-2}
    if call.op in ("index_select", "gather", "take_along_dim"):
        return {negative(int(call.arg(1, "dim", 0)), n)}
    if call.op == "take":
        return set(range(-n, 0))
    indices = call.args[1]
    return {p - n for p, idx in enumerate(indices) if idx is not None}


def _kept(call: Call, d: int | None) -> int | None:
    """Where a dimension of the looked-up tensor that is not looked up lands."""
    if d is None:
        return None
    n, m = call.operands[0].ndim, len(call.out)
    if call.op in ("index_select", "gather"):
        return d
    if call.op == "embedding":
        return -1 if d == -1 else None
    if call.op == "take":
        return None
    looked = sorted(_looked_up(call))
    if d > looked[-1]:
        return d
    adjacent = looked == list(range(looked[0], looked[-1] + 1))
    if d < looked[0] and adjacent:
        return _positive(d, n) - m
    return None


def _index_dim(call: Call, k: int, e: int | None) -> int | None:
    """Where dimension ``e`` of index operand ``k`` lands in the result."""
    if e is None:
        return None
    m = len(call.out)
    if call.op == "embedding":
        return e - 1
    if call.op == "gather" or call.op == "take":
        return e
    if call.op == "index_select":
        return negative(int(call.arg(1, "dim", 0)), call.operands[0].ndim)
    looked = sorted(_looked_up(call))
    after = len(call.shapes[0]) - 1 - (looked[-1] + call.operands[0].ndim)
    adjacent = looked == list(range(looked[0], looked[-1] + 1))
    return e - after if adjacent else e - (m - len(call.shapes[k]))


INDEXING = frozenset({"embedding", "index", "index_select", "gather", "take_along_dim", "take"})

# Writes at positions: name -> (the argument naming the dimension written, or -1 for all; the indices' argument)
WRITES: dict[str, tuple[int, int]] = {
    "index_put": (1, 1), "_index_put_impl": (1, 1), "index_add": (1, 2), "index_copy": (1, 2),
    "index_fill": (1, 2), "scatter": (1, 2), "scatter_add": (1, 2), "scatter_reduce": (1, 2),
    "masked_scatter": (-1, 1), "put": (-1, 1),
}


def write(call: Call, i: int) -> AxisType:
    """``t[idx] = v`` and the like: the written tensor joined with the values (and varying where the positions
    are); positions alike on every member in a dimension the axis splits are refused."""
    axis = call.axes[i]
    position, index_slot = WRITES[call.op.rstrip("_")]
    dst = call.t(0, i)
    n = call.operands[0].ndim
    if position < 0:
        dims: set[int] = set(range(-n, 0))
    elif isinstance(call.args[position], (list, tuple)):
        dims = {p - n for p, idx in enumerate(call.args[position]) if idx is not None}
    else:
        dims = {negative(int(call.args[position]), n)}
    indices = [k for k in range(1, len(call.operands)) if call.slots[k] == index_slot]
    moving = any(call.t(k, i).kind == VARYING for k in indices)
    if dst.kind == VARYING and dst.dim in dims and not moving:
        raise call.refuse(i, f"writes at positions of dimension {dst.dim}, which {axis!r} splits, alike on every "
                          "member: each writes at that place of its own block", "write before splitting, or shift the "
                          "positions by the member's offset (ax.axis_index)", 0)
    out = dst
    for k in range(1, len(call.operands)):
        new = call.t(k, i)
        if k in indices and new.kind == PARTIAL:
            raise call.refuse(i, "positions that are a pending sum", f"ax.psum them along {axis!r} first", k)
        if k in indices and new.kind != VARYING:
            continue  # positions alike on every member: where, not what, is written
        out = join(out, VAR if k in indices else new, axis, call.operands[0].name)
    return out
