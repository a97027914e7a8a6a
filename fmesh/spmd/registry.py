"""The rule of each aten op: a declared one first (``shard_map(..., rules=...)``), then the registry of
:mod:`fmesh.spmd.rules`, :mod:`fmesh.spmd.products` and :mod:`fmesh.spmd.layouts`; an op with none is refused on a
pending sum or a split dimension (``unknown``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fmesh.spmd.call import Call, Rule
from fmesh.spmd.layouts import INDEXING, VIEWS, WRITES, concatenation, indexing, view, write
from fmesh.spmd.products import ATTENTION, CONTRACTIONS, attention, contraction
from fmesh.spmd.rules import LINEAR, LOSSES, NORMS, REDUCTIONS, SCANS, loss, normalisation, pointwise, reduction, scan
from fmesh.spmd.types import (
    INV,
    PARTIAL,
    VAR,
    VARYING,
    AxisType,
)

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
    if op in VIEWS or op.rstrip("_") in VIEWS:  # squeeze_, t_, transpose_: views in place
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

