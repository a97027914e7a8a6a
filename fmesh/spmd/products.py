"""The rules of products: matrix products by the dimensions each operand contracts, keeps or shares,
``einsum``/``matmul`` by their equation, and attention (linear in its values only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fmesh.spmd.call import Call, layout_of, varying_of
from fmesh.spmd.fix import Fix, text
from fmesh.spmd.types import (
    COMPLETES,
    INVARIANT,
    PARTIAL,
    PSUM,
    VARYING,
    AxisType,
)

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
                              f"{axis!r}: the bias would be added once per member",
                              Fix("bias", "psum", call.operands[0].name, (axis,), where=call.op,
                                  note="(or psum_scatter)"), 0)
        return product
    if bias.kind == PARTIAL:
        raise call.refuse(i, "adds a pending sum to a product that is not one", f"ax.psum(..., {axis!r}) first", 0)
    dims: list[tuple[int, int | None, Any]] = []
    if product.kind == VARYING:
        dims.append((a, product.dim, product))
    if bias.kind == VARYING:
        dims.append((0, bias.dim, bias))
    return varying_of(call, i, dims)


def _product(call: Call, i: int, a: int, b: int, layouts: tuple[dict[int, Any], ...]) -> AxisType:
    ta, tb = call.t(a, i), call.t(b, i)
    axis = call.axes[i]
    if PARTIAL in (ta.kind, tb.kind):
        p, q = (a, b) if ta.kind == PARTIAL else (b, a)
        tp, tq = call.t(p, i), call.t(q, i)
        fix = call.insert(COMPLETES[tp.pending], p, axis, "(or psum_scatter)")
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
            if layout_of(contracted[0][2]) != layout_of(contracted[1][2]):
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
                          "multiplies its own block by the same rows",
                          call.insert("all_gather", k0, axis, f"(or split {call.operands[other].name} along {axis!r} "
                                      f"at dimension {kdim} too: a row-parallel product)", dim=call.t(k0, i).dim), k0)
    dims = [(k, d, s) for k, d, s in lands]
    dims += [(k, None, t) for k, t in ((a, ta), (b, tb)) if t.kind == VARYING and t.dim is None]
    if len({(d, layout_of(s)) for _, d, s in lands}) > 1:
        k0, k1 = lands[0][0], lands[1][0]
        raise call.refuse(i, f"the result would be split along {axis!r} at two dimensions ({lands[0][1]} from "
                          f"{call.operands[k0].name}, {lands[1][1]} from {call.operands[k1].name}), each member "
                          "computing only its own diagonal block", f"ax.all_gather({call.operands[k0].name}, "
                          f"{axis!r}, dim={call.t(k0, i).dim}) first, or name the axis that was meant", k0)
    return varying_of(call, i, dims)


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
        fix = call.insert(COMPLETES[types[p].pending], p, axis)
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
                              "multiplies its own block by the same values",
                              call.insert("all_gather", k0, axis, f"(or split {call.operands[k1].name} along "
                                          f"{axis!r} at that dimension too: a row-parallel product)",
                                          dim=types[k0].dim), k0)
        if len({layout_of(types[k]) for k in ks}) > 1:
            raise call.refuse(i, "sums over a dimension split in blocks in one operand and strided in another",
                              "split them alike", ks[0])
    if summed:
        if any(d is not None for _, d, _ in lands):
            k = next(k for k, d, _ in lands if d is not None)
            raise call.refuse(i, f"sums over a dimension {axis!r} splits and keeps another it splits", "all_gather "
                              "one of them first", k)
        return PSUM
    return varying_of(call, i, lands)


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
                              call.insert("psum", n, axis), n)
    if mask is not None and call.t(mask, i).kind == PARTIAL:
        raise call.refuse(i, "a pending sum as the attention mask", f"ax.psum(mask, {axis!r}) first", mask)
    for n, t in ((0, q), (1, k)):
        if t.kind == VARYING and t.dim == -1:
            raise call.refuse(i, "the head dimension is split: each member's scores use part of it", f"split heads "
                              f"(dimension -3) along {axis!r}, or ax.all_gather({names[n]}, {axis!r}, dim=-1)", n)
    for n, t in ((1, k), (2, v)):
        if t.kind == VARYING and t.dim == -2:
            raise call.refuse(i, "the keys' sequence is split: each member's softmax normalises over its own keys",
                              call.insert("all_gather", n, axis, "(context parallelism gathers the keys and values)",
                                          dim=-2), n)
    if mask is not None and call.t(mask, i).kind == VARYING and call.t(mask, i).dim == -1:
        raise call.refuse(i, "the mask's key dimension is split", f"ax.all_gather(mask, {axis!r}, dim=-1)", mask)
    if mask is not None and q.kind == VARYING and q.dim == -2:
        m = call.t(mask, i)
        if (m.kind == INVARIANT or m.copy) and len(call.shapes[mask]) >= 2 and call.shapes[mask][-2] > 1:
            made = call.operands[mask].name
            fix = (Fix("argument", made.split("(")[0], made, (axis,), (("name", "diagonal"), ("scale",
                       call.shapes[0][-2])), made=True) if made.split("(")[0] in ("tril", "triu") else
                   text(f"build the mask from global positions (offset by ax.axis_index({axis!r}))"))
            raise call.refuse(i, "the mask is the same on every member along the queries' sequence, which "
                              f"{axis!r} splits: each member masks its block as if it were the first", fix, mask)
    if causal and q.kind == VARYING and q.dim == -2:
        raise call.refuse(i, "is_causal=True with the queries' sequence split: the causal mask counts each member's "
                          "positions from 0", Fix("mask", "scaled_dot_product_attention", axes=(axis,)), 0)
    dims = [(n, t.dim, t) for n, t in ((0, q), (1, k), (2, v)) if t.kind == VARYING]
    if mask is not None and call.t(mask, i).kind == VARYING:
        dims.append((mask, call.t(mask, i).dim, call.t(mask, i)))
    return varying_of(call, i, [(n, d if d is None or d <= -3 or n in (0, 2) else None, s) for n, d, s in dims])

