"""The rule of every aten operation on the per-axis types (:mod:`fmesh.spmd.types`): what each operation gives
along each mesh axis, or the mistake it makes.

The rules work at the aten level, where every torch call ends (``einsum`` arrives as ``bmm`` and views,
``F.linear`` as ``addmm``, ``scaled_dot_product_attention`` as one attention kernel or its math), so nothing is
passed for being reached through a composite. Where they come from:

* **pointwise** operations: torch's own ``torch.Tag.pointwise`` on each aten op (broadcasting, the split
  dimensions must agree), with a **linearity registry** (:data:`LINEAR`): a pending sum survives only the ops
  linear in it (a sum of pending sums, a pending sum times a value the same on every member, a zero written in
  it); anything else on it (a bias added, ``exp``) is refused;
* **reductions, scans, normalisations** (:data:`REDUCTIONS`, :data:`SCANS`, :data:`NORMS`): the dimensions each
  reduces, scans or normalises, read from its arguments, against the dimension each axis splits: a sum along a
  split dimension is a pending sum, a mean a pending mean, a max a pending max; a scan or a normalisation along
  it is refused;
* **contractions** (:data:`CONTRACTIONS`) and **attention** (:data:`ATTENTION`): which dimension of each operand
  is contracted, kept or shared; a dimension split in both operands and contracted is a pending sum;
* **views, indexing, concatenation** (:data:`VIEWS`, :data:`INDEXING`): where the split dimension goes.

An operation in none of these is refused when it touches a pending sum or a split dimension, naming the
operation and how to declare its rule (``shard_map(..., rules={op: "pointwise"})``): never passed. DTensor's
sharding strategies know placements, not which argument an op is linear in or what a pending mean is, and they
change between torch releases: the registry here is fmesh's, small, and tested by the differential fuzzer
(``tests/spmd/fuzz.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from fmesh.errors import SpmdTypeError
from fmesh.spmd.types import (
    COMPLETES,
    COPY,
    INV,
    INVARIANT,
    PARTIAL,
    PSUM,
    VAR,
    VARYING,
    AxisType,
    Operand,
    reshaped_dim,
)


@attrs.frozen
class Call:
    """One aten call as the rules see it: its name, arguments, tensor operands (with their types) and shapes."""

    op: str  # the overload packet's name: ``addmm``, ``sum``, ``_softmax``
    where: str  # the user's call that reached it, for messages: ``linear``
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    operands: tuple[Operand, ...]
    shapes: tuple[tuple[int, ...], ...]
    slots: tuple[int, ...]  # each operand's position in ``args`` (a list argument: the list's position)
    out: tuple[int, ...]  # the first output's shape
    axes: tuple[str, ...]

    def t(self, k: int, i: int) -> AxisType:
        """Operand ``k``'s type along the ``i``-th axis."""
        return self.operands[k].types[i]

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        return self.args[position] if len(self.args) > position else self.kwargs.get(name, default)

    def at(self, slot: int) -> int | None:
        """The operand that sits at argument ``slot``, if a tensor does."""
        return self.slots.index(slot) if slot in self.slots else None

    def refuse(self, i: int, what: str, fix: str, k: int | None = None) -> SpmdTypeError:
        said = self.operands[k].said(self.axes[i], i) if k is not None else f"along {self.axes[i]!r}"
        via = f"{self.where} (aten {self.op})" if self.where != self.op else self.op
        return SpmdTypeError(f"{via} on {said}: {what}; fix: {fix}")


Rule = Callable[[Call, int], AxisType]


def _neg(d: int, ndim: int) -> int:
    return d - ndim if d >= 0 else d


def _dims(value: Any, ndim: int) -> set[int]:
    """The dimensions (negative) an argument names: one, a list, or all of them for ``None`` / ``[]``."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return set(range(-ndim, 0))
    if isinstance(value, int):
        return {_neg(value, max(ndim, 1))}
    return {_neg(int(v), ndim) for v in value}


def _pending(kinds: Sequence[AxisType]) -> str | None:
    pend = {t.pending for t in kinds if t.kind == PARTIAL}
    return pend.pop() if len(pend) == 1 else None if not pend else "mixed"


def _split(call: Call, i: int, k: int) -> int | None:
    t = call.t(k, i)
    return t.dim if t.kind == VARYING else None


def _varying(call: Call, i: int, dims: Sequence[tuple[int, int | None, Any]]) -> AxisType:
    """The type of a result whose split dimension comes from the operands: ``dims`` lists, for each operand that
    varies, (operand, the result's dimension its split lands at, its layout there: strided or an AxisType);
    they must agree."""
    landed = [(k, d, _layout(s)) for k, d, s in dims if d is not None]
    if landed:
        k0, d0, s0 = landed[0]
        for k, d, s in landed[1:]:
            if (d, s) != (d0, s0):
                raise call.refuse(i, f"{call.operands[k0].name} is split along {call.axes[i]!r} at result dimension "
                                  f"{d0}, {call.operands[k].name} at {d}" + (" (strided)" if s else ""),
                                  f"gather one of them along {call.axes[i]!r} (ax.all_gather), or split both at the "
                                  "same dimension", k)
        return AxisType(VARYING, d0, strided=s0[0], stride=s0[1], extent=s0[2])
    if not dims:
        return INV
    return COPY if all(isinstance(t, AxisType) and t.copy for _, _, t in dims) else VAR


def _layout(t: Any) -> tuple[bool, int, int]:
    """(strided, stride, extent) of a split, from an AxisType (or a bare strided flag)."""
    if isinstance(t, AxisType):
        return t.strided, t.stride, t.extent
    return bool(t), 1, 0


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
    found = _varying(call, i, dims)
    if found.kind == VARYING and found.dim is not None and call.out[found.dim] > 1:
        for k, t in enumerate(types):  # the same values on every member, paired with each member's own block
            shape = call.shapes[k]
            alike = t.kind == INVARIANT or t.copy
            if alike and len(shape) >= -found.dim and shape[found.dim] == call.out[found.dim]:
                split = next(o for o, tt in enumerate(types) if tt.kind == VARYING and tt.dim == found.dim)
                raise call.refuse(i, f"pairs {call.operands[split].name}, split along {call.axes[i]!r} at dimension "
                                  f"{found.dim}, with {call.operands[k].name}, which is the same on every member "
                                  "along that dimension: each member would pair its own block with the same values "
                                  "(a position table indexed from 0 on every member)",
                                  f"take each member's block of it (offset by ax.axis_index({call.axes[i]!r}) times "
                                  f"the block's length), or ax.all_gather the other along {call.axes[i]!r}", k)
    return found


def _pointwise_partial(call: Call, i: int, types: list[AxisType], partial: list[int]) -> AxisType:
    p = partial[0]
    pending = _pending(types)
    axis = call.axes[i]
    name = call.operands[p].name
    complete = COMPLETES.get(types[p].pending, "psum")
    fix = f"ax.{complete}({name}, {axis!r}) first"
    form = LINEAR.get(call.op.rstrip("_"))
    if pending in ("max", "min", "mixed") and form is not None and form != "all":
        form = None
    others = [k for k, t in enumerate(types) if t.kind != PARTIAL]
    if form == "all" and pending not in ("max", "min", "mixed"):
        if others:
            k = others[0]
            raise call.refuse(i, f"adds {call.operands[k].name}, which is {types[k]!r}, to a pending sum: it would be "
                              "added once per member", f"{fix} (a bias after the reduction)", p)
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
        return {_neg(int(call.arg(2, "dim", -1)), ndim)}, call.op == "topk"
    if call.op in ("sort", "argsort"):
        return {_neg(int(call.arg(1, "dim", -1)), ndim)}, True
    if position is None or (len(call.args) <= position and "dim" not in call.kwargs):
        return set(range(-ndim, 0)), False
    value = call.arg(position, "dim")
    if isinstance(value, bool):  # sort(stable=...) forms never reach here; a bool dim is none
        return set(range(-ndim, 0)), False
    keep = call.arg(_KEEPDIM.get(call.op, 99), "keepdim", False)
    return _dims(value, ndim), bool(keep)


def _after(d: int, gone: set[int]) -> int:
    """Where dimension ``d`` (negative) lies once the dimensions ``gone`` are removed."""
    return d + sum(1 for g in gone if g > d)


def reduction(call: Call, i: int) -> AxisType:
    """Reductions along dimensions (and sorts, which keep theirs): a split one reduced is a pending reduction."""
    t = call.t(0, i)
    dims, keep = _reduced(call)
    _, pending = REDUCTIONS[call.op]
    axis = call.axes[i]
    name = call.operands[0].name
    if call.op in _SORTS:
        if t.kind == PARTIAL or (t.kind == VARYING and t.dim in dims):
            raise call.refuse(i, f"sorts along dimension {t.dim} ({axis!r} splits it, or the value is a pending "
                              "sum)", f"ax.all_gather({name}, {axis!r}, dim={t.dim}) first (or psum it)", 0)
        return t
    if t.kind == PARTIAL:
        if call.op in _LINEAR_REDUCTIONS and t.pending in ("sum", "mean"):
            return t
        if t.pending == pending and dims:  # a max of a pending max is one still
            return t
        raise call.refuse(i, f"{call.op} of a pending {t.pending} is not the {call.op} of the whole",
                          f"ax.{COMPLETES[t.pending]}({name}, {axis!r}) first", 0)
    if t.kind != VARYING or t.dim is None:
        return t
    if t.dim in dims:
        if pending is None:
            raise call.refuse(i, f"{call.op} along dimension {t.dim}, which {axis!r} splits: each member reduces its "
                              "own block", f"ax.all_gather({name}, {axis!r}, dim={t.dim}) first", 0)
        return AxisType(PARTIAL, pending=pending)  # type: ignore[arg-type]
    return attrs.evolve(t, dim=t.dim if keep else _after(t.dim, dims))


SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"})


def scan(call: Call, i: int) -> AxisType:
    """Running reductions along a dimension: along a split one each member's starts afresh."""
    t = call.t(0, i)
    d = _neg(int(call.arg(1, "dim")), call.operands[0].ndim)
    name, axis = call.operands[0].name, call.axes[i]
    if t.kind == PARTIAL:
        if call.op == "cumsum" and t.pending == "sum":
            return t
        raise call.refuse(i, f"{call.op} of a pending {t.pending}", f"ax.{COMPLETES[t.pending]}({name}, {axis!r}) "
                          "first", 0)
    if t.kind == VARYING and t.dim == d:
        fix = (f"ax.cumsum({name}, {axis!r}, dim={d}) (each member's running sum plus the earlier members' totals)"
               if call.op == "cumsum" else f"ax.all_gather({name}, {axis!r}, dim={d}) first")
        raise call.refuse(i, f"{call.op} along dimension {d}, which {axis!r} splits: each member's running value "
                          "starts afresh at its block", fix, 0)
    return t


# name -> the dimensions it normalises over, from its call
NORMS: dict[str, Callable[[Call], set[int]]] = {
    "_softmax": lambda c: {_neg(int(c.args[1]), c.operands[0].ndim)},
    "_log_softmax": lambda c: {_neg(int(c.args[1]), c.operands[0].ndim)},
    "_safe_softmax": lambda c: {_neg(int(c.args[1]), c.operands[0].ndim)},
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
    name, axis = call.operands[0].name, call.axes[i]
    if t.kind == PARTIAL:
        raise call.refuse(i, f"{call.op} of a pending {t.pending} (not linear)",
                          f"ax.{COMPLETES[t.pending]}({name}, {axis!r}) first", 0)
    if t.kind == VARYING and t.dim in dims:
        raise call.refuse(i, f"{call.op} normalises along dimension {t.dim}, which {axis!r} splits: each member "
                          "normalises its own block", f"ax.all_gather({name}, {axis!r}, dim={t.dim}) first", 0)
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
            if o.types[i].kind == VARYING:  # the input's rows (before the class dimension) and the target's
                rows.append((k, d if d is None or k or d < c else None, o.types[i]))
        each = _varying(call, i, rows)
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


# ---------------------------------------------------------------- contractions

# name -> (operand layouts: per operand, its dims (negative) as "k" (contracted), "b" (shared batch, result dim
# -3), or the result dim it becomes; the first operand holding a bias added, if any)
CONTRACTIONS: dict[str, tuple[tuple[dict[int, Any], ...], bool]] = {
    "mm": (({-2: -2, -1: "k"}, {-2: "k", -1: -1}), False),
    "bmm": (({-3: -3, -2: -2, -1: "k"}, {-3: -3, -2: "k", -1: -1}), False),
    "addmm": (({-2: -2, -1: "k"}, {-2: "k", -1: -1}), True),
    "baddbmm": (({-3: -3, -2: -2, -1: "k"}, {-3: -3, -2: "k", -1: -1}), True),
    "mv": (({-2: -1, -1: "k"}, {-1: "k"}), False),
    "addmv": (({-2: -1, -1: "k"}, {-1: "k"}), True),
    "dot": (({-1: "k"}, {-1: "k"}), False),
    "vdot": (({-1: "k"}, {-1: "k"}), False),
    "outer": (({-1: -2}, {-1: -1}), False),
}


def contraction(call: Call, i: int) -> AxisType:
    """Matrix products: a dimension split in both operands and contracted is a pending sum."""
    layouts, biased = CONTRACTIONS[call.op]
    first = 1 if biased else 0
    a, b = first, first + 1
    axis = call.axes[i]
    product = _product(call, i, a, b, layouts)
    if not biased:
        return product
    bias = call.t(0, i)
    if product.kind == PARTIAL:
        if bias.kind != PARTIAL:
            raise call.refuse(i, f"adds {call.operands[0].name} (as a bias) to a product that is a pending sum along "
                              f"{axis!r}: the bias would be added once per member", f"add the bias after "
                              f"ax.psum(..., {axis!r}) (or psum_scatter)", 0)
        return product
    if bias.kind == PARTIAL:
        raise call.refuse(i, "adds a pending sum to a product that is not one", f"ax.psum(..., {axis!r}) first", 0)
    dims: list[tuple[int, int | None, Any]] = []
    if product.kind == VARYING:
        dims.append((a, product.dim, product))
    if bias.kind == VARYING:
        dims.append((0, bias.dim, bias))
    return _varying(call, i, dims)


def _product(call: Call, i: int, a: int, b: int, layouts: tuple[dict[int, Any], ...]) -> AxisType:
    ta, tb = call.t(a, i), call.t(b, i)
    axis = call.axes[i]
    if PARTIAL in (ta.kind, tb.kind):
        p, q = (a, b) if ta.kind == PARTIAL else (b, a)
        tp, tq = call.t(p, i), call.t(q, i)
        fix = f"ax.{COMPLETES[tp.pending]}({call.operands[p].name}, {axis!r}) first (or psum_scatter)"
        if tq.kind == PARTIAL:
            raise call.refuse(i, "multiplies two pending sums: the product of the sums is not the sum of the "
                              "products", fix, p)
        if tq.kind == VARYING:
            raise call.refuse(i, f"multiplies a pending sum by {call.operands[q].said(axis, i)}: the sum of the "
                              "members' products is not the product of the sum", fix, p)
        if call.operands[q].grad:
            raise call.refuse(i, f"multiplies a pending sum by {call.operands[q].name}, which wants a gradient: each "
                              "member's is taken against its own part of the sum only, which nothing sums", fix, p)
        if tp.pending not in ("sum", "mean"):
            raise call.refuse(i, f"multiplies a pending {tp.pending} (not linear)", fix, p)
        return tp
    lands: list[tuple[int, Any, Any]] = []
    for k, t in ((a, ta), (b, tb)):
        if t.kind == VARYING and t.dim is not None:
            layout = layouts[k - a]
            if t.dim not in layout:
                raise call.refuse(i, f"the dimension {t.dim} it splits is broadcast", "split it after broadcasting", k)
            lands.append((k, layout[t.dim], t))
    contracted = [x for x in lands if x[1] == "k"]
    if contracted:
        k0 = contracted[0][0]
        other = b if k0 == a else a
        if len(contracted) == 2:
            if _layout(contracted[0][2]) != _layout(contracted[1][2]):
                raise call.refuse(i, "contracts a dimension split in blocks in one operand and strided in the "
                                  "other", "split both alike", k0)
            return PSUM  # a row-parallel product
        to = call.t(other, i)
        if to.kind == VARYING and to.dim is None and not to.copy:  # a slice of the other made by this member
            return PSUM
        where = layouts[other - a]
        kdim = next(d for d, v in where.items() if v == "k")
        raise call.refuse(i, f"contracts dimension {call.t(k0, i).dim}, which {axis!r} splits, against "
                          f"{call.operands[other].said(axis, i)}, which it does not split there: each member "
                          "multiplies its own block by the same rows", f"split {call.operands[other].name} along "
                          f"{axis!r} at dimension {kdim} too (a row-parallel product), or "
                          f"ax.all_gather({call.operands[k0].name}, {axis!r}, dim={call.t(k0, i).dim}) first", k0)
    dims = [(k, d, s) for k, d, s in lands]
    dims += [(k, None, t) for k, t in ((a, ta), (b, tb)) if t.kind == VARYING and t.dim is None]
    if len({(d, _layout(s)) for _, d, s in lands}) > 1:
        k0, k1 = lands[0][0], lands[1][0]
        raise call.refuse(i, f"the result would be split along {axis!r} at two dimensions ({lands[0][1]} from "
                          f"{call.operands[k0].name}, {lands[1][1]} from {call.operands[k1].name}), each member "
                          "computing only its own diagonal block", f"ax.all_gather({call.operands[k0].name}, "
                          f"{axis!r}, dim={call.t(k0, i).dim}) first, or name the axis that was meant", k0)
    return _varying(call, i, dims)


def einsum_equation(op: str, args: Sequence[Any], ndims: Sequence[int]) -> str | None:
    """The explicit equation (a letter per dimension, no ellipsis) of ``einsum``/``matmul`` on operands of ranks
    ``ndims``; ``None`` where it cannot say (the call then goes to the aten rules).

    >>> einsum_equation("matmul", (), [3, 2]), einsum_equation("einsum", ["...k,kn->...n"], [3, 2])
    ('abc,cd->abd', 'abk,kn->abn')
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    if op == "matmul" and len(ndims) == 2:
        na, nb = ndims
        if na == 0 or nb == 0:
            return None
        batch = max(max(na, nb) - 2, 0)
        b = letters[:batch]
        n, k, m = letters[batch], letters[batch + 1], letters[batch + 2]
        left = (b[len(b) - (na - 2):] if na > 2 else "") + (n + k if na >= 2 else k)
        right = (b[len(b) - (nb - 2):] if nb > 2 else "") + (k + m if nb >= 2 else k)
        out = b + (n if na >= 2 else "") + (m if nb >= 2 else "")
        return f"{left},{right}->{out}"
    if op != "einsum" or not args or not isinstance(args[0], str):
        return None
    equation = args[0].replace(" ", "")
    ins, _, out = equation.partition("->")
    terms = ins.split(",")
    if len(terms) != len(ndims):
        return None
    used = set(equation) - set(".,->")
    spare = [c for c in letters if c not in used]
    longest = max((n - len(t.replace("...", "")) for t, n in zip(terms, ndims, strict=True) if "..." in t), default=0)
    ell = "".join(spare[:longest])
    explicit = [t.replace("...", ell[len(ell) - (n - len(t.replace("...", ""))):]) for t, n in zip(terms, ndims,
                                                                                                  strict=True)]
    if not _:
        out = ell + "".join(sorted(c for c in set("".join(terms)) - set(".") if "".join(terms).count(c) == 1))
    return ",".join(explicit) + "->" + out.replace("...", ell)


def einsum(call: Call, i: int) -> AxisType:
    """``einsum`` and ``matmul`` from their equation (``call.args[0]``, explicit): a letter split in every
    operand that has it and summed away is a pending sum; kept, the result is split where it lands."""
    ins, out = call.args[0].split("->")
    terms = ins.split(",")
    axis = call.axes[i]
    types = [call.t(k, i) for k in range(len(terms))]
    partial = [k for k, t in enumerate(types) if t.kind == PARTIAL]
    if partial:
        p = partial[0]
        fix = f"ax.{COMPLETES[types[p].pending]}({call.operands[p].name}, {axis!r}) first"
        for k, t in enumerate(types):
            if k == p:
                continue
            if t.kind != INVARIANT or call.operands[k].grad:
                raise call.refuse(i, f"multiplies a pending sum by {call.operands[k].said(axis, i)}"
                                  + (", which wants a gradient" if call.operands[k].grad else ""), fix, p)
        if types[p].pending not in ("sum", "mean"):
            raise call.refuse(i, f"a product of a pending {types[p].pending} (not linear)", fix, p)
        return types[p]
    lands: list[tuple[int, int | None, Any]] = []
    summed: dict[str, list[int]] = {}
    for k, (term, t) in enumerate(zip(terms, types, strict=True)):
        if t.kind != VARYING:
            continue
        if t.dim is None:
            lands.append((k, None, t))
            continue
        letter = term[t.dim]
        if letter in out:
            lands.append((k, out.index(letter) - len(out), t))
        else:
            summed.setdefault(letter, []).append(k)
    for letter, ks in summed.items():
        holders = [k for k, term in enumerate(terms) if letter in term]
        missing = [k for k in holders if k not in ks]
        if missing and not all(types[k].kind == VARYING and types[k].dim is None and not types[k].copy
                               for k in missing):
            k0, k1 = ks[0], missing[0]
            raise call.refuse(i, f"sums over dimension {types[k0].dim}, which {axis!r} splits, against "
                              f"{call.operands[k1].said(axis, i)}, which it does not split there: each member "
                              "multiplies its own block by the same values", f"split {call.operands[k1].name} along "
                              f"{axis!r} at that dimension too (a row-parallel product), or "
                              f"ax.all_gather({call.operands[k0].name}, {axis!r}, dim={types[k0].dim}) first", k0)
        if len({_layout(types[k]) for k in ks}) > 1:
            raise call.refuse(i, "sums over a dimension split in blocks in one operand and strided in another",
                              "split them alike", ks[0])
    if summed:
        if any(d is not None for _, d, _ in lands):
            k = next(k for k, d, _ in lands if d is not None)
            raise call.refuse(i, f"sums over a dimension {axis!r} splits and keeps another it splits", "all_gather "
                              "one of them first", k)
        return PSUM
    return _varying(call, i, lands)


# Attention kernels: (q, k, v) are the first three operands; the mask's argument position; is_causal's.
ATTENTION: dict[str, tuple[int | None, int | None]] = {
    "scaled_dot_product_attention": (3, 5),  # F.scaled_dot_product_attention, taken whole
    "_scaled_dot_product_flash_attention_for_cpu": (5, 4),
    "_scaled_dot_product_flash_attention": (None, 4),
    "_scaled_dot_product_efficient_attention": (3, 6),
    "_scaled_dot_product_cudnn_attention": (3, 6),
    "_scaled_dot_product_fused_attention_overrideable": (3, 5),
}


def attention(call: Call, i: int) -> AxisType:
    """softmax(q kᵀ) v: linear in v only; the keys' sequence is normalised over, the head dimension contracted."""
    mask_at, causal_at = ATTENTION[call.op]
    q, k, v = (call.t(n, i) for n in range(3))
    mask = call.at(mask_at) if mask_at is not None else None
    causal = bool(call.arg(causal_at, "is_causal", False)) if causal_at is not None else False
    axis = call.axes[i]
    names = [call.operands[n].name for n in range(3)]
    if v.kind == PARTIAL and q.kind == k.kind == INVARIANT and not (call.operands[0].grad or call.operands[1].grad):
        return v
    for n, t in enumerate((q, k, v)):
        if t.kind == PARTIAL:
            raise call.refuse(i, "attention on a pending sum (softmax is not linear)",
                              f"ax.psum({names[n]}, {axis!r}) first", n)
    if mask is not None and call.t(mask, i).kind == PARTIAL:
        raise call.refuse(i, "a pending sum as the attention mask", f"ax.psum(mask, {axis!r}) first", mask)
    for n, t in ((0, q), (1, k)):
        if t.kind == VARYING and t.dim == -1:
            raise call.refuse(i, "the head dimension is split: each member's scores use part of it", f"split heads "
                              f"(dimension -3) along {axis!r}, or ax.all_gather({names[n]}, {axis!r}, dim=-1)", n)
    for n, t in ((1, k), (2, v)):
        if t.kind == VARYING and t.dim == -2:
            raise call.refuse(i, "the keys' sequence is split: each member's softmax normalises over its own keys",
                              f"ax.all_gather({names[n]}, {axis!r}, dim=-2) (context parallelism gathers the keys "
                              "and values)", n)
    if mask is not None and call.t(mask, i).kind == VARYING and call.t(mask, i).dim == -1:
        raise call.refuse(i, "the mask's key dimension is split", f"ax.all_gather(mask, {axis!r}, dim=-1)", mask)
    if mask is not None and q.kind == VARYING and q.dim == -2:
        m = call.t(mask, i)
        if (m.kind == INVARIANT or m.copy) and len(call.shapes[mask]) >= 2 and call.shapes[mask][-2] > 1:
            raise call.refuse(i, "the mask is the same on every member along the queries' sequence, which "
                              f"{axis!r} splits: each member masks its block as if it were the first",
                              f"build the mask from global positions (offset by ax.axis_index({axis!r}))", mask)
    if causal and q.kind == VARYING and q.dim == -2:
        raise call.refuse(i, "is_causal=True with the queries' sequence split: the causal mask counts each member's "
                          "positions from 0", "pass attn_mask built from the global positions (ax.axis_index)", 0)
    dims = [(n, t.dim, t) for n, t in ((0, q), (1, k), (2, v)) if t.kind == VARYING]
    if mask is not None and call.t(mask, i).kind == VARYING:
        dims.append((mask, call.t(mask, i).dim, call.t(mask, i)))
    return _varying(call, i, [(n, d if d is None or d <= -3 or n in (0, 2) else None, s) for n, d, s in dims])


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
    d, op, axis, name = t.dim, call.op, call.axes[i], call.operands[0].name
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
    c = _neg(int(call.arg(1, "dim", 0)), max(len(call.out), 1))
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
    return _varying(call, i, [(k, t.dim, t) for k, t in enumerate(types) if t.kind == VARYING])


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
                          "member: each would read its own block at the global positions", "shift each member's "
                          "indices by its offset (ax.axis_index), zero the rows it does not hold and ax.psum, or "
                          f"ax.all_gather({call.operands[0].name}, {axis!r}, dim={x.dim}) first", 0)
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
    return _varying(call, i, dims)


def _looked_up(call: Call) -> set[int]:
    n = call.operands[0].ndim
    if call.op == "embedding":
        return {-2}
    if call.op in ("index_select", "gather", "take_along_dim"):
        return {_neg(int(call.arg(1, "dim", 0)), n)}
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
        return _neg(int(call.arg(1, "dim", 0)), call.operands[0].ndim)
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
        dims = {_neg(int(call.args[position]), n)}
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

# ---------------------------------------------------------------- the table

# Ops that make a tensor from nothing (the same on every member), or from another's shape only.
LIKE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like"})
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "linspace",
                       "scalar_tensor", "empty_strided", "eye", "tensor", "new_zeros", "new_ones", "new_empty",
                       "new_full", "new_empty_strided", "_local_scalar_dense", "sym_size", "sym_numel", "is_nonzero",
                       "equal", "allclose", "is_same_size", "_has_compatible_shallow_copy_type", "sym_stride",
                       "sym_storage_offset", "size", "stride", "dim", "numel", "_to_dense", "bernoulli"})

KINDS: dict[str, Rule] = {"loss": loss, "write": write, "pointwise": pointwise, "reduction": reduction, "scan": scan,
                          "normalisation": normalisation, "contraction": contraction, "attention": attention,
                          "view": view, "concatenation": concatenation, "indexing": indexing}
"""The rules a declaration names (``shard_map(..., rules={op: "pointwise"})``), or a function ``(call, i) ->
AxisType``."""


def rule_of(func: Any, op: str, declared: Mapping[Any, str | Rule]) -> Rule | None:
    """The rule of aten ``func`` (packet name ``op``): a declared one first, then the registry; ``None`` if none."""
    for key in (func, getattr(func, "overloadpacket", None), op):
        found = declared.get(key)
        if found is not None:
            return KINDS[found] if isinstance(found, str) else found
    if op in VIEWS:
        return view
    if op in CONTRACTIONS:
        return contraction
    if op in ATTENTION:
        return attention
    if op in REDUCTIONS:
        return reduction
    if op in SCANS:
        return scan
    if op in NORMS:
        return normalisation
    if op in LOSSES:
        return loss
    if op in INDEXING:
        return indexing
    if op == "cat":
        return concatenation
    if op.rstrip("_") in WRITES:
        return write
    if op.rstrip("_") in LINEAR or torch.Tag.pointwise in getattr(func, "tags", ()):
        return pointwise
    if op in ("native_dropout", "dropout", "_fused_dropout", "bernoulli_", "masked_fill", "masked_fill_"):
        return pointwise
    return None


def unknown(call: Call, i: int) -> AxisType:
    """An op with no rule: passed only where it touches no pending sum and no split dimension."""
    for k, operand in enumerate(call.operands):
        t = operand.types[i]
        if t.kind == PARTIAL or (t.kind == VARYING and t.dim is not None):
            raise call.refuse(i, f"aten.{call.op} has no rule, and this operand is {t!r}",
                              f"declare its rule: shard_map(..., rules={{torch.ops.aten.{call.op}: 'pointwise'}}) "
                              f"(or one of {sorted(KINDS)}, or a function (call, axis index) -> AxisType), or "
                              f"ax.psum / ax.all_gather it along {call.axes[i]!r} first", k)
    return VAR if any(o.types[i].kind == VARYING for o in call.operands) else INV


def join(old: AxisType, new: AxisType, axis: str, name: str) -> AxisType:
    """The type of a tensor part of which was overwritten by a value of type ``new`` (``t[i] = v``, ``copy_``).

    >>> join(AxisType("invariant"), AxisType("varying", -1), "tp", "buf")
    varying
    >>> join(AxisType("varying", -2), AxisType("invariant"), "tp", "buf")
    varying(dim -2)
    """
    if old.kind == PARTIAL or new.kind == PARTIAL:
        if old.kind == new.kind and old.pending == new.pending:
            return old
        raise SpmdTypeError(f"writes a value that is {new!r} along {axis!r} into {name}, which is {old!r}: part of "
                            f"it would be a pending sum and part not; fix: ax.psum the pending sum along {axis!r} "
                            "before writing it")
    if new.kind == INVARIANT:
        return old
    return old if old.kind == VARYING else VAR
