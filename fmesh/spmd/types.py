"""Per-axis types of the local values inside a manual region, as pure values, and the rules that need no torch.

Along each mesh axis a local value is one of (JAX's ``vma`` words, plus DTensor's partial):

* ``invariant``: the same on every member of the axis (a replicated input, the result of a ``psum``); its
  gradient is the same on every member too.
* ``varying``: different on the members (a sharded input, a ``pvary``-ed value); ``dim`` is the tensor dimension
  (counted from the end) the axis splits, where it splits one (``None``: each member's own value, no dimension);
  ``strided`` when the members' pieces of that dimension are not contiguous blocks of it (a slice of a split
  dimension, a merge where it is not the major part), so it cannot leave the region as a block.
* ``partial``: a pending reduction over the axis: the value is the members' values reduced by ``pending``
  (``sum`` for a row-parallel product or a sum along a split dimension; ``mean`` for a mean along one, or a loss
  averaged over a split batch; ``max``/``min`` for those along one). Only operations linear in it may touch a
  pending sum or mean; ``ax.psum``/``ax.pmean``/``ax.pmax``/``ax.pmin`` (the matching one) completes it.

An ``invariant`` value that is a ``psum`` of pending means (``AxisType.mean``) is the axis size times the mean of
the whole: only a division by that size makes it the mean (Megatron's loss averaging).

Which operations keep which types is :mod:`fmesh.spmd.registry` (it needs torch); the checks here are those of the
region's doors: what may leave it (:func:`check_output`), where a gather lays its blocks (:func:`gathered`), what a
summed mean may meet (:func:`means_summed`), and where a reshape moves a split dimension (:func:`reshaped_dim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from fmesh.errors import SpmdTypeError
from fmesh.spmd.fix import Fix, text
from fmesh.spmd.spec import P, PartitionSpec, dim_axes

Kind = Literal["invariant", "varying", "partial"]
Pending = Literal["sum", "mean", "max", "min"]
INVARIANT: Kind = "invariant"
VARYING: Kind = "varying"
PARTIAL: Kind = "partial"
COMPLETES: dict[Pending, str] = {"sum": "psum", "mean": "pmean", "max": "pmax", "min": "pmin"}


@attrs.frozen
class AxisType:
    """A local value's type along one mesh axis.

    >>> AxisType("varying", -2), AxisType("partial", pending="mean"), AxisType("varying", -1, strided=True)
    (varying(dim -2), partial(pending mean), varying(dim -1, strided))
    """

    kind: Kind
    dim: int | None = None  # varying only: the tensor dimension (negative, from the end) the axis splits
    mean: bool = False  # invariant only: a psum of pending means (the axis size times the mean of the whole)
    strided: bool = False  # varying only: the members' pieces of ``dim`` are not its blocks in order
    pending: Pending = "sum"  # partial only: the reduction the members' values wait for
    stride: int = 1  # varying, strided by a reshape: the split factor's stride in ``dim`` ...
    extent: int = 0  # ... and its local size (0: the split is the dimension's major part, a block)
    copy: bool = False  # varying, no dimension: the same values on every member (pvary-ed, gathered)

    def __repr__(self) -> str:
        if self.kind == INVARIANT:
            return "invariant(the sum of the members' pending means)" if self.mean else INVARIANT
        if self.kind == PARTIAL:
            return PARTIAL if self.pending == "sum" else f"partial(pending {self.pending})"
        if self.dim is None:
            return "varying(the same values on every member)" if self.copy else VARYING
        return f"varying(dim {self.dim}{', strided' if self.strided or self.extent else ''})"


INV = AxisType(INVARIANT)
VAR = AxisType(VARYING)
COPY = AxisType(VARYING, copy=True)
PSUM = AxisType(PARTIAL)


@attrs.frozen
class Operand:
    """One tensor an operation reads: its description, type per axis, whether it wants a gradient, its rank."""

    name: str
    types: tuple[AxisType, ...]
    grad: bool
    ndim: int

    def said(self, axis: str, index: int) -> str:
        """How a message names it along ``axis`` (the ``index``-th mesh axis).

        >>> Operand("x", (AxisType("partial"),), False, 2).said("tp", 0)
        "x (rank 2), which is partial along 'tp'"
        """
        return f"{self.name} (rank {self.ndim}), which is {self.types[index]!r} along {axis!r}"


def check_output(spec_dims: dict[str, int | None], partial: tuple[str, ...], axis: str, name: str,
                 found: AxisType, ndim: int = 1, size: int = 2, output: int = 0, spec: PartitionSpec | None = None,
                 target: Any = None) -> None:
    """Whether a region output of type ``found`` (``ndim`` dimensions) along ``axis`` (``size`` members) may leave
    it under its out spec (``spec_dims``: the axes it splits, at which dimension; ``partial``: its partial axes;
    ``spec``: the spec itself, which a fix that edits it starts from). The error's fix is for output ``output``
    (``target``: the value).

    >>> check_output({}, (), "dp", "loss", AxisType("varying"), ndim=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: loss is varying along 'dp', but ... fix: return ax.psum(loss, 'dp') for a sum, ax.pmean(loss...
    """
    def out(call: str, note: str = "", **kwargs: Any) -> Fix:
        return Fix("insert", call, name, (axis,), tuple(kwargs.items()), output=output, note=note, target=target)

    def respec(new: PartitionSpec | None, words: str) -> Fix:
        return Fix("spec", output=output, spec=new, target=target) if new is not None else text(words)
    if found.kind == INVARIANT and found.mean:
        raise SpmdTypeError.refused(f"{name} is the sum over {axis!r} of the members' pending means: {size} times "
                                    "the mean of the whole", Fix("replace", "pmean", name, (axis,), where="psum",
                                                                 made=True, note=f"(or divide it by {size})",
                                                                 target=target))
    if found.kind == PARTIAL and found.pending != "sum":
        graded = found.pending in ("max", "min") and bool(getattr(target, "requires_grad", False))
        raise SpmdTypeError.refused(f"{name} is {found!r} along {axis!r}, and only a pending sum can leave the "
                                    "region", text(f"ax.p{found.pending} carries no gradient: complete the pending "
                                                   f"{found.pending} of the detached part with ax.p{found.pending} "
                                                   "before what wants a gradient meets it") if graded else
                                    out(COMPLETES[found.pending]))
    if axis in partial:
        if found.kind != PARTIAL:
            raise SpmdTypeError.refused(f"{name} is {found!r} along {axis!r}, but its out spec claims partial",
                                        respec(spec and _respec(spec, axis), f"drop {axis!r} from partial="))
        return
    if axis in spec_dims:
        want = spec_dims[axis]
        if found.kind == PARTIAL:
            raise SpmdTypeError.refused(f"{name} is partial along {axis!r}, but its out spec claims it split",
                                        out("psum_scatter", dim=want))
        if found.kind == INVARIANT:
            raise SpmdTypeError.refused(f"{name} is invariant along {axis!r}, but its out spec claims it split "
                                        f"along {axis!r}: every member would hold the whole",
                                        respec(spec and _respec(spec, axis), f"leave {axis!r} out of the spec"))
        if found.dim is None or found.strided or found.extent:
            fix = (Fix("drop", "all_gather", name, made=True, target=target, note="(it leaves split)")
                   if name.startswith("all_gather(") else
                   Fix("block", "narrow", name, (axis,), (("dim", want), ("size", size)), output=output,
                       target=target) if found.copy and want is not None else
                   text("return it replicated after ax.all_gather_invariant, or keep the split dimension whole "
                        "until it leaves"))
            raise SpmdTypeError.refused(f"{name} is {found!r} along {axis!r}: no block of one dimension, but its out "
                                        f"spec claims it split at dimension {want}", fix)
        if want is not None and found.dim != want:
            raise SpmdTypeError.refused(f"{name} is split along {axis!r} at dimension {found.dim}, but its out spec "
                                        f"says dimension {want}",
                                        respec(spec and _respec(spec, axis, found.dim + ndim),
                                               f"name {axis!r} at dimension {found.dim + ndim} of the spec"))
        return
    if found.kind == VARYING:
        said = f"{name} is {found!r} along {axis!r}, but its out spec claims it replicated"
        if found.copy:  # the same values on every member (gathered): their mean is the value, its gradient whole
            raise SpmdTypeError.refused(said, out("pmean", "(the members' copies are alike: their mean is the value; "
                                                  "or gather it with ax.all_gather_invariant)"))
        if ndim == 0 or found.dim is None or found.strided or found.extent:  # a scalar, or no block of a dimension
            raise SpmdTypeError.refused(said, out("psum", f"for a sum, ax.pmean({name}, {axis!r}) for a mean" + (
                "" if ndim == 0 else " (ax.all_gather_invariant to keep each member's)")))
        raise SpmdTypeError.refused(said, out("all_gather_invariant", f"(or name {axis!r} at dimension "
                                              f"{found.dim + ndim} of the spec)", dim=found.dim))
    if found.kind == PARTIAL:
        raise SpmdTypeError.refused(f"{name} is partial along {axis!r}, but its out spec claims it replicated",
                                    out("psum", f"(or partial=({axis!r},) in the spec)"))


def _respec(spec: PartitionSpec, axis: str, dim: int | None = None) -> PartitionSpec:
    """``spec`` without ``axis`` (among its dimensions' and its partial axes), then naming it at ``dim``.

    >>> _respec(P("dp", "tp", partial="cp"), "dp"), _respec(P("dp", "tp"), "tp", 0), _respec(P(partial="tp"), "tp")
    (P(None, 'tp', partial=('cp',)), P(('dp', 'tp'), None), P())
    """
    entries: list[Any] = [tuple(a for a in dim_axes(e) if a != axis) or None for e in spec.entries]
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in entries]
    if dim is not None:
        while len(entries) <= dim:
            entries.append(None)
        named = (*dim_axes(entries[dim]), axis)
        entries[dim] = named[0] if len(named) == 1 else named
    return P(*entries, partial=tuple(a for a in spec.partial if a != axis))


def gathered(axis: str, index: int, operand: Operand, dim: int, split: dict[int, list[str]]) -> None:
    """Refuse a tiled all_gather along ``axis`` at dimension ``dim`` (negative) of ``operand`` where ``axis``
    splits another of its dimensions, or splits it strided: the blocks would land at the wrong place (``split``:
    the axes that split each dimension of it, which name the axis that was meant).

    >>> x = Operand("h", (AxisType("varying", -3), AxisType("varying", -2)), False, 3)
    >>> gathered("dp", 0, x, -2, {-3: ["dp"], -2: ["tp"]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: all_gather of h along 'dp' at dimension -2, but 'dp' splits h at dimension -3: ...
    """
    found = operand.types[index]
    if found.kind != VARYING or found.dim is None:
        return
    if found.dim == dim and (found.strided or found.extent):
        raise SpmdTypeError(
            f"all_gather of {operand.name} along {axis!r} at dimension {dim}, which {axis!r} splits strided (the "
            f"members' pieces are not contiguous blocks of it): the gathered tensor would not be the whole in "
            f"order; fix: gather before slicing or merging that dimension")
    if found.dim == dim:
        return
    meant = [a for a in split.get(dim, []) if a != axis]
    raise SpmdTypeError.refused(
        f"all_gather of {operand.name} along {axis!r} at dimension {dim}, but {axis!r} splits {operand.name} at "
        f"dimension {found.dim}: its blocks would be laid along the wrong dimension",
        Fix("replace", "all_gather", operand.name, (meant[0],), (("dim", dim),), where="all_gather",
            note=f"(it splits dimension {dim})") if meant else
        Fix("replace", "all_gather", operand.name, (axis,), (("dim", found.dim),), where="all_gather"))


def means_summed(op: str, operands: list[Operand], numbers: Sequence[complex], axes: Sequence[str],
                 sizes: Sequence[int], shape_only: bool = False,
                 tensors: Sequence[Any] = ()) -> tuple[AxisType, ...] | None:
    """The result's types when an operand is a ``psum`` of pending means (``None`` when none is): divided by the
    number of members it was summed over (or times its inverse), the mean of the whole; viewed or cast
    (``shape_only``), still the sum; anything else is refused (it would use a value ``size`` times too large).

    >>> summed = Operand("psum(mean(…), 'dp')", (AxisType("invariant", None, True),), True, 0)
    >>> means_summed("div", [summed], [2], ("dp",), (2,))
    (invariant,)
    >>> means_summed("div", [summed], [4], ("dp",), (2,))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: div of psum(mean(…), 'dp'), the sum over 'dp' of the members' pending means: ... by 2...
    """
    summed = next((o for o in operands if any(t.kind == INVARIANT and t.mean for t in o.types)), None)
    if summed is None:
        return None
    flagged = [i for i, t in enumerate(summed.types) if t.kind == INVARIANT and t.mean]
    factor = product([sizes[i] for i in flagged])
    over = ", ".join(repr(axes[i]) for i in flagged)
    cleared = tuple(INV if i in flagged else t for i, t in enumerate(summed.types))
    if len(operands) == 1 and operands[0] is summed and len(numbers) == 1:
        n = numbers[0]
        if (op == "div" and n == factor) or (op == "mul" and abs(n * factor - 1) < 1e-9):
            return cleared
    if len(operands) == 1 and shape_only:  # a view or cast of it
        return summed.types
    target = next((t for o, t in zip(operands, tensors, strict=False) if o is summed), None)
    raise SpmdTypeError.refused(
        f"{op} of {summed.name}, the sum over {over} of the members' pending means: it is {factor} times the mean "
        f"of the whole", Fix("replace", "pmean", summed.name, tuple(axes[i] for i in flagged), where="psum",
                             made=True, note=f"(or divide it by {factor} right after the psum)", target=target))


def product(sizes: Sequence[int]) -> int:
    """The product of ``sizes`` (1 for none).

    >>> product([2, 3]), product([])
    (6, 1)
    """
    out = 1
    for size in sizes:
        out *= size
    return out


def _runs(before: Sequence[int], after: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """The smallest runs ``(i0, i1, j0, j1)`` of ``before[i0:i1]`` and ``after[j0:j1]`` whose sizes multiply alike
    (dimensions of size 1 each a run of their own where both sides have one)."""
    runs = []
    i = j = 0
    while i < len(before) or j < len(after):
        i0, j0 = i, j
        a = before[i] if i < len(before) else 1
        b = after[j] if j < len(after) else 1
        i, j = min(i + 1, len(before)) if i < len(before) else i, min(j + 1, len(after)) if j < len(after) else j
        while a != b and (i < len(before) or j < len(after)):
            if (a < b and i < len(before)) or j >= len(after):
                a *= before[i]
                i += 1
            else:
                b *= after[j]
                j += 1
        runs.append((i0, i, j0, j))
    return runs


def reshaped_dim(before: Sequence[int], after: Sequence[int], dim: int, stride: int = 1,
                 extent: int = 0) -> tuple[int, int, int] | None:
    """Where a split of dimension ``dim`` (negative) of a tensor of shape ``before`` lies after a reshape to
    ``after``: ``(dim, stride, extent)``, ``extent`` 0 for a block (the split is the dimension's major part), else
    the local size of the split factor, ``stride`` elements apart; ``None`` where no one dimension holds it.

    A block merged as the major part stays a block; merged as a minor part it is strided; a block split into
    several dimensions goes to the first of them, of size 1 included (one head per member: ``(2, 3, 1 * 8) ->
    (2, 3, 1, 8)`` keeps the split on the heads); a strided factor goes back to the dimension it fits.

    >>> reshaped_dim((2, 3, 8), (2, 3, 4, 2), -1), reshaped_dim((2, 3, 8), (2, 3, 1, 8), -1)
    ((-2, 1, 0), (-2, 1, 0))
    >>> reshaped_dim((2, 3, 8), (2, 24), -1), reshaped_dim((2, 3, 8), (2, 24), -2)
    ((-1, 1, 8), (-1, 1, 0))
    >>> reshaped_dim((4, 2, 5), (8, 5), -2), reshaped_dim((8, 5), (4, 2, 5), -2, 1, 2)
    ((-2, 1, 2), (-2, 1, 0))
    """
    d = dim + len(before)
    for i0, i1, j0, j1 in _runs(before, after):
        if not i0 <= d < i1:
            continue
        if j1 == j0:
            return None
        major = extent == 0 and all(before[k] == 1 for k in range(i0, d))
        if major:
            return j0 - len(after), 1, 0
        size = extent or before[d]
        inner = stride * product(before[d + 1:i1])
        fits = []
        for e in range(j0, j1):
            outer = product(after[e + 1:j1])
            if inner % outer == 0 and after[e] % ((inner // outer) * size) == 0:
                step = inner // outer
                fits.append((step * size != after[e], e, step))
        if not fits:
            return None
        strided, e, step = min(fits)
        return e - len(after), step, size if strided else 0
    return None
