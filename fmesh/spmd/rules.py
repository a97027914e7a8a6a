"""The rule of every aten operation on the per-axis types (:mod:`fmesh.spmd.types`): what each operation gives
along each mesh axis, or the mistake it makes.

The rules work at the aten level, where every torch call ends (``einsum`` arrives as ``bmm`` and views,
``F.linear`` as ``addmm``, ``scaled_dot_product_attention`` as one attention kernel or its math), so nothing is
passed for being reached through a composite. Where they come from:

* **pointwise** operations: torch's own ``torch.Tag.pointwise`` on each aten op (broadcasting, the split
  dimensions must agree), with a **linearity registry** (``LINEAR``): a pending sum survives only the ops
  linear in it (a sum of pending sums, a pending sum times a value the same on every member, a zero written in
  it); anything else on it (a bias added, ``exp``) is refused;
* **reductions, scans, normalisations** (``REDUCTIONS``, ``SCANS``, ``NORMS``): the dimensions each
  reduces, scans or normalises, read from its arguments, against the dimension each axis splits: a sum along a
  split dimension is a pending sum, a mean a pending mean, a max a pending max; a scan or a normalisation along
  it is refused;
* **contractions** (``CONTRACTIONS``) and **attention** (``ATTENTION``): which dimension of each operand
  is contracted, kept or shared; a dimension split in both operands and contracted is a pending sum;
* **views, indexing, concatenation** (``VIEWS``, ``INDEXING``): where the split dimension goes.

An operation in none of these is refused when it touches a pending sum or a split dimension, naming the
operation and how to declare its rule (``shard_map(..., rules={op: "pointwise"})``): never passed. DTensor's
sharding strategies know placements, not which argument an op is linear in or what a pending mean is, and they
change between torch releases: the registry here is fmesh's, small, and tested by the differential fuzzer
(``tests/spmd/fuzz.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from fmesh.spmd.call import Call, dims_of, negative, pending_of, varying_of
from fmesh.spmd.fix import Fix
from fmesh.spmd.types import (
    COMPLETES,
    INV,
    INVARIANT,
    PARTIAL,
    VARYING,
    AxisType,
)

# ---------------------------------------------------------------- pointwise

# Linear pointwise ops: ``all`` its tensor operands may be pending sums together (a sum); ``one`` of them may be,
# the others the same on every member and wanting no gradient (a product; ``first``: only the first, a quotient).
LINEAR: dict[str, str] = {
    "add": "all", "sub": "all", "rsub": "all", "neg": "all", "clone": "all", "_to_copy": "all", "alias": "all",
    "detach": "all",
    "positive": "all", "lift_fresh": "all", "lift_fresh_copy": "all", "contiguous": "all", "real": "all",
    "conj": "all", "mul": "one", "div": "first", "masked_fill": "zero", "where": "select", "copy": "all",
    "_conj": "all", "resolve_conj": "all", "resolve_neg": "all", "dropout": "none",
}
# Pointwise ops with a mask argument (an index into ``args``): a mask that varies may zero a pending sum's parts.
_ZEROING = {"masked_fill": 1, "where": 0}


def _numbers(call: Call) -> list[complex]:
    found: list[complex] = [v for v in call.args if isinstance(v, (int, float)) and not isinstance(v, bool)]
    found += [v for key, v in call.kwargs.items() if key in ("other", "value") and isinstance(v, (int, float))]
    return found


def pointwise(call: Call, i: int) -> AxisType:
    """Broadcasting elementwise ops (``torch.Tag.pointwise``, casts and copies)."""
    types = [call.t(k, i) for k in range(len(call.operands))]
    partial = [k for k, t in enumerate(types) if t.kind == PARTIAL]
    if partial:
        return _pointwise_partial(call, i, types, partial)
    ndim = len(call.out)
    dims = []
    for k, t in enumerate(types):
        if t.kind != VARYING:
            continue
        d = t.dim
        if d is not None and (d < -call.operands[k].ndim or (call.shapes[k][d] == 1 and call.out[d] != 1)):
            raise call.refuse(i, "the dimension it splits is broadcast", "split the value after broadcasting", k)
        dims.append((k, d if d is None or d >= -ndim else None, t))
    found = varying_of(call, i, dims)
    if found.kind == VARYING and found.dim is not None and call.out[found.dim] > 1:
        for k, t in enumerate(types):  # the same values on every member, paired with each member's own block
            shape = call.shapes[k]
            alike = t.kind == INVARIANT or t.copy
            if alike and len(shape) >= -found.dim and shape[found.dim] == call.out[found.dim]:
                split = next(o for o, tt in enumerate(types) if tt.kind == VARYING and tt.dim == found.dim)
                made = call.operands[k].name
                fix = (Fix("offset", "narrow", made, (call.axes[i],), made=True, target=call.tensors[k] if k < len(
                    call.tensors) else None) if made.startswith("narrow(") else
                       call.insert("all_gather", split, call.axes[i], "(or take each member's block of "
                                   f"{call.operands[k].name}, offset by ax.axis_index({call.axes[i]!r}) times the "
                                   "block's length)", dim=types[split].dim))
                raise call.refuse(i, f"pairs {call.operands[split].name}, split along {call.axes[i]!r} at dimension "
                                  f"{found.dim}, with {call.operands[k].name}, which is the same on every member "
                                  "along that dimension: each member would pair its own block with the same values "
                                  "(a position table indexed from 0 on every member)", fix, k)
    return found


def _pointwise_partial(call: Call, i: int, types: list[AxisType], partial: list[int]) -> AxisType:
    p = partial[0]
    pending = pending_of(types)
    axis = call.axes[i]
    complete = COMPLETES.get(types[p].pending, "psum")
    fix = call.insert(complete, p, axis)
    form = LINEAR.get(call.op.rstrip("_"))
    if pending in ("max", "min", "mixed") and form is not None and form != "all":
        form = None
    others = [k for k, t in enumerate(types) if t.kind != PARTIAL]
    if form == "all" and pending not in ("max", "min", "mixed"):
        if others:
            k = others[0]
            raise call.refuse(i, f"adds {call.operands[k].name}, which is {types[k]!r}, to a pending sum: it would be "
                              "added once per member", attrs.evolve(fix, note="(a bias after the reduction)"), p)
        if any(n != 0 for n in _numbers(call)) and call.op.rstrip("_") in ("add", "sub", "rsub"):
            raise call.refuse(i, "adds a number to a pending sum: it would be added once per member", fix, p)
        return AxisType(PARTIAL, pending=types[p].pending)
    if form == "all":  # a view or a cast of a pending max or min
        return types[p]
    if form in ("one", "first"):
        if len(partial) > 1:
            raise call.refuse(i, "multiplies two pending sums: the product of the sums is not the sum of the products",
                              f"psum one of them along {axis!r} first", p)
        if form == "first" and p != 0:
            raise call.refuse(i, "divides by a pending sum (not linear)", fix, p)
        for k in others:
            if types[k].kind == VARYING:
                raise call.refuse(i, f"multiplies a pending sum by {call.operands[k].said(axis, i)}: each member "
                                  "scales its own part differently, which is not the pending sum scaled", fix, p)
            if call.operands[k].grad:
                raise call.refuse(i, f"multiplies a pending sum by {call.operands[k].name}, which wants a gradient: "
                                  "each member's is taken against its own part of the sum only, which nothing sums",
                                  fix, p)
        return AxisType(PARTIAL, pending=types[p].pending)
    if form in ("zero", "select") and call.op.rstrip("_") in _ZEROING:
        mask = call.at(_ZEROING[call.op.rstrip("_")])
        values = [k for k in range(len(types)) if k != mask]
        zero = all(n == 0 for n in _numbers(call)) and all(
            types[k].kind == PARTIAL or _zero(call, k) for k in values)
        if zero and not (mask is not None and call.operands[mask].grad):
            return AxisType(PARTIAL, pending=types[p].pending)
    raise call.refuse(i, f"{call.op} is not linear in a pending {types[p].pending}: on each member's part it is not "
                      f"the same as on the {types[p].pending}", fix, p)


def _zero(call: Call, k: int) -> bool:
    """Whether operand ``k`` is a constant zero of one element (``torch.where(mask, x, 0.0)``'s)."""
    value = call.args[call.slots[k]]
    return (isinstance(value, torch.Tensor) and call.operands[k].types[0] == INV and value.numel() == 1
            and value.device.type != "meta" and bool(value.detach().cpu().item() == 0))


# ---------------------------------------------------------------- reductions, scans, normalisations

# name -> (argument holding the dims, or None for all; the pending reduction it makes of a split dimension, or None)
REDUCTIONS: dict[str, tuple[int | None, str | None]] = {
    "sum": (1, "sum"), "mean": (1, "mean"), "nansum": (1, "sum"), "amax": (1, "max"), "amin": (1, "min"),
    "max": (1, "max"), "min": (1, "min"), "prod": (1, None), "var": (1, None), "std": (1, None),
    "var_mean": (1, None), "std_mean": (1, None), "logsumexp": (1, None), "linalg_vector_norm": (2, None),
    "norm": (2, None), "argmax": (1, None), "argmin": (1, None), "any": (1, None), "all": (1, None),
    "count_nonzero": (1, None), "median": (1, None), "nanmedian": (1, None), "mode": (1, None),
    "aminmax": (1, None), "kthvalue": (2, None), "topk": (2, None), "sort": (1, None), "argsort": (1, None),
}
_LINEAR_REDUCTIONS = {"sum", "mean", "nansum"}
_KEEPDIM = {"sum": 2, "mean": 2, "nansum": 2, "amax": 2, "amin": 2, "max": 2, "min": 2, "prod": 2, "logsumexp": 2,
            "linalg_vector_norm": 3, "norm": 3, "argmax": 2, "argmin": 2, "any": 2, "all": 2, "median": 2,
            "nanmedian": 2, "mode": 2, "var": 3, "std": 3, "var_mean": 3, "std_mean": 3, "kthvalue": 3}
_SORTS = {"topk", "sort", "argsort", "kthvalue"}  # keep their dimension (a sort, the k largest)


def _reduced(call: Call) -> tuple[set[int], bool]:
    position, _ = REDUCTIONS[call.op]
    ndim = call.operands[0].ndim
    if call.op in ("topk", "kthvalue"):
        return {negative(int(call.arg(2, "dim", -1)), ndim)}, call.op == "topk"
    if call.op in ("sort", "argsort"):
        return {negative(int(call.arg(1, "dim", -1)), ndim)}, True
    if position is None or (len(call.args) <= position and "dim" not in call.kwargs):
        return set(range(-ndim, 0)), False
    value = call.arg(position, "dim")
    if isinstance(value, bool):  # sort(stable=...) forms never reach here; a bool dim is none
        return set(range(-ndim, 0)), False
    keep = call.arg(_KEEPDIM.get(call.op, 99), "keepdim", False)
    return dims_of(value, ndim), bool(keep)


def _after(d: int, gone: set[int]) -> int:
    """Where dimension ``d`` (negative) lies once the dimensions ``gone`` are removed."""
    return d + sum(1 for g in gone if g > d)


def reduction(call: Call, i: int) -> AxisType:
    """Reductions along dimensions (and sorts, which keep theirs): a split one reduced is a pending reduction."""
    t = call.t(0, i)
    dims, keep = _reduced(call)
    _, pending = REDUCTIONS[call.op]
    axis = call.axes[i]
    if call.op in _SORTS:
        if t.kind == PARTIAL or (t.kind == VARYING and t.dim in dims):
            raise call.refuse(i, f"sorts along dimension {t.dim} ({axis!r} splits it, or the value is a pending "
                              "sum)", call.insert("all_gather", 0, axis, "(or psum it)", dim=t.dim)
                              if t.kind == VARYING else call.insert(COMPLETES[t.pending], 0, axis), 0)
        return t
    if t.kind == PARTIAL:
        if call.op in _LINEAR_REDUCTIONS and t.pending in ("sum", "mean"):
            return t
        if t.pending == pending and dims:  # a max of a pending max is one still
            return t
        raise call.refuse(i, f"{call.op} of a pending {t.pending} is not the {call.op} of the whole",
                          call.insert(COMPLETES[t.pending], 0, axis), 0)
    if t.kind != VARYING or t.dim is None:
        return t
    if t.dim in dims:
        if pending is None:
            raise call.refuse(i, f"{call.op} along dimension {t.dim}, which {axis!r} splits: each member reduces its "
                              "own block", call.insert("all_gather", 0, axis, dim=t.dim), 0)
        return AxisType(PARTIAL, pending=pending)  # type: ignore[arg-type]
    return attrs.evolve(t, dim=t.dim if keep else _after(t.dim, dims))


SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"})


def scan(call: Call, i: int) -> AxisType:
    """Running reductions along a dimension: along a split one each member's starts afresh."""
    t = call.t(0, i)
    d = negative(int(call.arg(1, "dim")), call.operands[0].ndim)
    name, axis = call.operands[0].name, call.axes[i]
    if t.kind == PARTIAL:
        if call.op == "cumsum" and t.pending == "sum":
            return t
        raise call.refuse(i, f"{call.op} of a pending {t.pending}", call.insert(COMPLETES[t.pending], 0, axis), 0)
    if t.kind == VARYING and t.dim == d:
        fix = (Fix("replace", "cumsum", name, (axis,), (("dim", d),), where=call.op,
                   note="(each member's running sum plus the earlier members' totals)")
               if call.op == "cumsum" else call.insert("all_gather", 0, axis, dim=d))
        raise call.refuse(i, f"{call.op} along dimension {d}, which {axis!r} splits: each member's running value "
                          "starts afresh at its block", fix, 0)
    return t


# name -> the dimensions it normalises over, from its call
NORMS: dict[str, Callable[[Call], set[int]]] = {
    "_softmax": lambda c: {negative(int(c.args[1]), c.operands[0].ndim)},
    "_log_softmax": lambda c: {negative(int(c.args[1]), c.operands[0].ndim)},
    "_safe_softmax": lambda c: {negative(int(c.args[1]), c.operands[0].ndim)},
    "native_layer_norm": lambda c: set(range(-len(c.args[1]), 0)),
    "_fused_rms_norm": lambda c: set(range(-len(c.args[1]), 0)),
    "native_group_norm": lambda c: set(range(-c.operands[0].ndim + 1, 0)),
    "native_batch_norm": lambda c: set(range(-c.operands[0].ndim, 0)) - {1 - c.operands[0].ndim},
    "_native_batch_norm_legit": lambda c: set(range(-c.operands[0].ndim, 0)) - {1 - c.operands[0].ndim},
    "_native_batch_norm_legit_no_training": lambda c: set(),
}


def normalisation(call: Call, i: int) -> AxisType:
    """Softmax, log-softmax and the norms: refused along a split dimension or on a pending sum."""
    t = call.t(0, i)
    dims = NORMS[call.op](call)
    axis = call.axes[i]
    if t.kind == PARTIAL:
        raise call.refuse(i, f"{call.op} of a pending {t.pending} (not linear)",
                          call.insert(COMPLETES[t.pending], 0, axis), 0)
    if t.kind == VARYING and t.dim in dims:
        raise call.refuse(i, f"{call.op} normalises along dimension {t.dim}, which {axis!r} splits: each member "
                          "normalises its own block", call.insert("all_gather", 0, axis, dim=t.dim), 0)
    return pointwise(attrs.evolve(call, out=call.shapes[0]), i)


# Losses: name -> the argument holding ``reduction`` (0 none, 1 mean, 2 sum); nll_loss also looks up a class.
LOSSES: dict[str, int] = {"mse_loss": 2, "l1_loss": 2, "smooth_l1_loss": 2, "huber_loss": 2, "soft_margin_loss": 2,
                          "binary_cross_entropy": 3, "binary_cross_entropy_with_logits": 4, "kl_div": 2,
                          "nll_loss_forward": 3, "nll_loss2d_forward": 3, "nll_loss": 3, "nll_loss_nd": 3}


def loss(call: Call, i: int) -> AxisType:
    """A loss: elementwise over its operands, then (its ``reduction``) a mean or a sum of every element: of a
    split value, a pending mean or sum; ``nll_loss`` reads the class dimension, which must not be split."""
    reduction = call.arg(LOSSES[call.op], "reduction", 1)
    axis = call.axes[i]
    t = call.t(0, i)
    if call.op.startswith("nll_loss"):
        c = -1 if call.operands[0].ndim == 1 else 1 - call.operands[0].ndim
        if t.kind == VARYING and t.dim == c:
            raise call.refuse(i, f"reads the class dimension {c}, which {axis!r} splits: each member has only its "
                              "block of the classes", "a vocab-parallel cross entropy (ax.pmax of the max, ax.psum of "
                              f"the exponentials and of the target's logit; see the guide), or ax.all_gather(..., "
                              f"{axis!r}, dim={c}) first", 0)
        if any(o.types[i].kind == PARTIAL for o in call.operands):
            k = next(k for k, o in enumerate(call.operands) if o.types[i].kind == PARTIAL)
            raise call.refuse(i, "a loss of a pending sum (not linear)", f"ax.psum(..., {axis!r}) first", k)
        rows: list[tuple[int, int | None, Any]] = []
        for k, o in enumerate(call.operands):
            d = o.types[i].dim
            if o.types[i].kind == VARYING:  # the input's rows (the class dimension gone) and the target's
                rows.append((k, d + 1 if k == 0 and d is not None and d < c else d, o.types[i]))
        each = varying_of(call, i, rows)
    else:
        if any(o.types[i].kind == PARTIAL for o in call.operands):
            k = next(k for k, o in enumerate(call.operands) if o.types[i].kind == PARTIAL)
            raise call.refuse(i, "a loss of a pending sum (not linear)", f"ax.psum(..., {axis!r}) first", k)
        each = pointwise(attrs.evolve(call, out=call.shapes[0]), i)
    if reduction == 0 or each.kind != VARYING:
        return each
    if each.dim is None:
        return each
    return AxisType(PARTIAL, pending="mean" if reduction == 1 else "sum")

