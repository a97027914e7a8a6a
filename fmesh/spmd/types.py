"""Per-axis types of the local values inside a manual region, and the rules that check each operation.

Along each mesh axis a local value is one of (JAX's ``vma`` words, plus DTensor's partial):

* ``invariant``: the same on every member of the axis (a replicated input, the result of a ``psum``); its
  gradient is the same on every member too.
* ``varying``: different on the members (a sharded input, a ``pvary``-ed value); ``dim`` is the tensor dimension
  (counted from the end) the axis splits, where known. Its gradient is each member's own.
* ``partial``: a pending sum over the axis (a row-parallel product); only linear operations may touch it.

A varying value that is the mean of each member's own block (a full ``mean``, or a loss averaged over all its
elements, of a varying value) is marked so (``AxisType.mean``): the sum of the members' means is the axis size
times the mean of the whole, so a ``psum`` of it is refused with ``pmean`` as the fix (a sum where a mean was
meant, which JAX's ``vma`` does not see).

The rules are pure (no torch import): :mod:`fmesh.spmd.region` applies them to each torch call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from fmesh.errors import SpmdTypeError

Kind = Literal["invariant", "varying", "partial"]
INVARIANT: Kind = "invariant"
VARYING: Kind = "varying"
PARTIAL: Kind = "partial"

# Operations by how a partial value may pass them (torch function names, underscores stripped).
ADDITIVE = frozenset({"add", "sub", "radd", "rsub", "cat", "concat", "concatenate", "stack", "iadd", "isub"})
PRODUCTS = frozenset({"mul", "rmul", "imul", "matmul", "rmatmul", "linear", "mm", "bmm", "einsum"})
QUOTIENTS = frozenset({"div", "truediv", "idiv", "itruediv"})
CONTRACTIONS = frozenset({"matmul", "linear", "mm", "bmm"})
SHAPE_ONLY = frozenset({
    "view", "reshape", "transpose", "permute", "contiguous", "clone", "getitem", "narrow", "split", "chunk",
    "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "t", "to", "float", "double", "half", "bfloat16",
    "typeas", "detach", "viewas", "reshapeas", "select", "movedim", "swapaxes", "unbind", "neg", "sum", "mean",
    "expandas", "requiresgrad", "pos", "tensorsplit",
})
ELEMENTWISE_SAME_DIMS = ADDITIVE - {"cat", "concat", "concatenate", "stack"} | {"mul", "rmul", "imul"} | QUOTIENTS | {
    "neg", "contiguous", "clone", "to", "float", "double", "half", "bfloat16", "detach", "gelu", "relu", "silu",
    "tanh", "sigmoid", "exp", "pow", "rsqrt", "sqrt", "dropout", "where", "maskedfill", "typeas", "requiresgrad",
    "softmax", "logsoftmax", "layernorm", "rmsnorm", "addcmul"}
MOVES = frozenset({"view", "reshape", "transpose", "swapaxes", "permute", "t"})
# Reductions that average (torch.mean; the losses, whose default reduction is the mean of every element).
MEANS = frozenset({"mean", "crossentropy", "nllloss", "mseloss", "l1loss", "smoothl1loss", "huberloss",
                   "binarycrossentropy", "binarycrossentropywithlogits", "kldiv"})


@attrs.frozen
class AxisType:
    """A local value's type along one mesh axis.

    >>> AxisType("varying", -2)
    varying(dim -2)
    """

    kind: Kind
    dim: int | None = None  # varying only: the tensor dimension (negative, from the end) the axis splits
    # varying: the mean of each member's own block (a psum of it is size x the mean); invariant: such a psum, which
    # only a division by the size makes the mean of the whole
    mean: bool = False

    def __repr__(self) -> str:
        if self.mean and self.kind == INVARIANT:
            return "invariant(the sum of the members' means of their own blocks)"
        if self.mean:
            return f"{self.kind}(the mean of each member's own block)"
        return f"{self.kind}(dim {self.dim})" if self.dim is not None else self.kind


@attrs.frozen
class Operand:
    """One tensor an operation reads: its description, type per axis, and whether it wants a gradient."""

    name: str
    types: tuple[AxisType, ...]
    grad: bool
    ndim: int


def op_name(func: object) -> str:
    """``torch.Tensor.__add__`` → ``add``; ``torch.nn.functional.linear`` → ``linear``.

    >>> import operator
    >>> op_name(operator.truediv), op_name(operator.getitem)
    ('truediv', 'getitem')
    """
    return getattr(func, "__name__", type(func).__name__).strip("_").replace("_", "").lower()


def combine(op: str, axis: str, index: int, operands: list[Operand]) -> AxisType:
    """The type along ``axis`` (the ``index``-th mesh axis) of ``op``'s result, or the rule it breaks.

    >>> x = Operand("x", (AxisType("partial"),), True, 2)
    >>> combine("gelu", "tp", 0, [x])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: gelu on x (shape rank 2), which is partial along 'tp': ... fix: ax.psum(x, 'tp') ...
    """
    kinds = [o.types[index].kind for o in operands]
    partial = [o for o, k in zip(operands, kinds, strict=True) if k == PARTIAL]
    varying = [o for o, k in zip(operands, kinds, strict=True) if k == VARYING]
    invariant_grad = [o for o, k in zip(operands, kinds, strict=True) if k == INVARIANT and o.grad]

    def said(o: Operand) -> str:
        return f"{o.name} (shape rank {o.ndim}), which is {o.types[index]!r} along {axis!r}"

    if contraction_partial(op, operands, index):
        if op == "linear" and len(operands) > 2:
            raise SpmdTypeError(
                f"linear with a bias ({operands[2].name}) on a row-parallel product of {said(operands[0])}: the "
                f"product is a pending sum along {axis!r}, and the bias would be added once per member; fix: add "
                f"the bias after ax.psum(..., {axis!r}) (or psum_scatter)")
        return AxisType(PARTIAL)
    if partial:
        if op in ADDITIVE:
            other = next((o for o, k in zip(operands, kinds, strict=True) if k != PARTIAL), None)
            if other is not None:
                raise SpmdTypeError(
                    f"{op} of {said(partial[0])}, and {said(other)}: adding a value to a pending sum adds it once per "
                    f"member; fix: ax.psum({partial[0].name}, {axis!r}) (or psum_scatter) first")
            return AxisType(PARTIAL)
        if op in PRODUCTS or op in QUOTIENTS:
            if len(partial) > 1:
                raise SpmdTypeError(
                    f"{op} of {said(partial[0])}, and {said(partial[1])}: a product of two pending sums is not the "
                    f"sum of the products; fix: ax.psum one of them along {axis!r} first")
            if varying:
                raise SpmdTypeError(
                    f"{op} of {said(partial[0])}, and {said(varying[0])}: a pending sum times a value that differs "
                    f"per member is not a pending sum; fix: ax.psum({partial[0].name}, {axis!r}) first")
            if op in QUOTIENTS and operands[0] is not partial[0]:
                raise SpmdTypeError(f"{op} by {said(partial[0])}: dividing by a pending sum is non-linear; fix: "
                                    f"ax.psum({partial[0].name}, {axis!r}) first")
            if op == "linear" and len(operands) > 2:
                raise SpmdTypeError(
                    f"linear with a bias on {said(partial[0])}: the bias would be added once per member; fix: "
                    f"add the bias after ax.psum(..., {axis!r})")
            wanting = next((o for o, k in zip(operands, kinds, strict=True) if k != PARTIAL and o.grad), None)
            if wanting is not None:  # its gradient is (each member's part of the sum) x (the incoming gradient)
                raise SpmdTypeError(
                    f"{op} of {said(partial[0])}, and {said(wanting)}: {wanting.name} wants a gradient, and each "
                    f"member's is taken against its own part of the pending sum only, which nothing sums; fix: "
                    f"ax.psum({partial[0].name}, {axis!r}) first (or psum_scatter)")
            return AxisType(PARTIAL)
        if op in SHAPE_ONLY:
            return AxisType(PARTIAL)
        raise SpmdTypeError(
            f"{op} on {said(partial[0])}: a non-linear operation on a pending sum is wrong; fix: "
            f"ax.psum({partial[0].name}, {axis!r}) (or psum_scatter) before it")
    _one_dim(op, axis, index, operands, varying, said)
    if varying and invariant_grad:
        o = invariant_grad[0]
        raise SpmdTypeError(
            f"{op} of {said(o)}, and {said(varying[0])}: {o.name} wants a gradient, and every member adds its own "
            f"part of it, which nothing sums; fix: ax.pvary({o.name}, {axis!r}) first (its gradient is then "
            f"summed over {axis!r}: Megatron's sum_gradients, DDP's all_reduce)")
    if not varying:
        return AxisType(INVARIANT)
    mean = op in ELEMENTWISE_SAME_DIMS and any(o.types[index].mean for o in varying)  # a mean scaled is one still
    return AxisType(VARYING, _dim(op, operands, varying, index), mean)


def _one_dim(op: str, axis: str, index: int, operands: list[Operand], varying: list[Operand],
             said: Callable[[Operand], str]) -> None:
    """Refuse a result that ``axis`` would split at two tensor dimensions (each member holding only the diagonal
    blocks of a tensor no spec describes): a product of a value split along ``axis`` at a kept dimension with a
    weight split along it at the output's dimension; or an elementwise op on values split at different ones."""
    if op in CONTRACTIONS and len(operands) >= 2:
        x, w = operands[0], operands[1]
        xd = x.types[index].dim if x.types[index].kind == VARYING else None
        wd = w.types[index].dim if w.types[index].kind == VARYING else None
        out = -2 if op == "linear" else -1  # the weight's dimension that becomes the result's last
        if xd is not None and xd != -1 and wd == out:
            raise SpmdTypeError(
                f"{op} of {said(x)}, and {said(w)}: the result would be split along {axis!r} at two dimensions "
                f"({xd} from {x.name}, -1 from {w.name}), each member computing only its own diagonal block; fix: "
                f"ax.all_gather({x.name}, {axis!r}, dim={xd}) first (so that only {w.name} splits along {axis!r}), "
                f"or name the axis that was meant")
        return
    if op in ELEMENTWISE_SAME_DIMS:
        split = [o for o in varying if o.types[index].dim is not None]
        other = next((o for o in split if o.types[index].dim != split[0].types[index].dim), None)
        if other is not None:
            raise SpmdTypeError(
                f"{op} of {said(split[0])}, and {said(other)}: they are split along {axis!r} at different "
                f"dimensions, so each member combines unrelated blocks; fix: gather one of them along {axis!r} "
                f"(ax.all_gather) or split both at the same dimension")


def gathered(axis: str, index: int, operand: Operand, dim: int, split: dict[int, list[str]]) -> None:
    """Refuse a tiled all_gather along ``axis`` at dimension ``dim`` (negative) of ``operand`` where ``axis``
    splits another of its dimensions: the blocks would land at the wrong place (``split``: the axes that split each
    dimension of it, which name the axis that was meant).

    >>> x = Operand("h", (AxisType("varying", -3), AxisType("varying", -2)), False, 3)
    >>> gathered("dp", 0, x, -2, {-3: ["dp"], -2: ["tp"]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: all_gather of h along 'dp' at dimension -2, but 'dp' splits h at dimension -3: ...
    """
    found = operand.types[index]
    if found.kind != VARYING or found.dim is None or found.dim == dim:
        return
    meant = [a for a in split.get(dim, []) if a != axis]
    raise SpmdTypeError(
        f"all_gather of {operand.name} along {axis!r} at dimension {dim}, but {axis!r} splits {operand.name} at "
        f"dimension {found.dim}: its blocks would be laid along the wrong dimension; fix: "
        + (f"gather along {meant[0]!r} (it splits dimension {dim}): ax.all_gather({operand.name}, {meant[0]!r}, "
           f"dim={dim})" if meant else f"ax.all_gather({operand.name}, {axis!r}, dim={found.dim})"))


def means_summed(op: str, operands: list[Operand], numbers: Sequence[complex], axes: Sequence[str],
                 sizes: Sequence[int]) -> tuple[AxisType, ...] | None:
    """The result's types when an operand is a ``psum`` of the members' means (``None`` when none is): divided by
    the number of members it was summed over (or times its inverse), the mean of the whole; viewed or cast, still
    the sum; anything else is refused (it would use a value ``size`` times too large).

    >>> summed = Operand("psum(mean(…), 'dp')", (AxisType("invariant", None, True),), True, 0)
    >>> means_summed("div", [summed], [2], ("dp",), (2,))
    (invariant,)
    >>> means_summed("div", [summed], [4], ("dp",), (2,))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: div of psum(mean(…), 'dp'), the sum over 'dp' of the members' means ... fix: divide it by 2...
    """
    summed = next((o for o in operands if any(t.kind == INVARIANT and t.mean for t in o.types)), None)
    if summed is None:
        return None
    flagged = [i for i, t in enumerate(summed.types) if t.kind == INVARIANT and t.mean]
    factor = _product([sizes[i] for i in flagged])
    over = ", ".join(repr(axes[i]) for i in flagged)
    pmean_axes = repr(axes[flagged[0]]) if len(flagged) == 1 else repr(tuple(axes[i] for i in flagged))
    cleared = tuple(AxisType(INVARIANT) if i in flagged else t for i, t in enumerate(summed.types))
    if len(operands) == 1 and operands[0] is summed and len(numbers) == 1:
        n = numbers[0]
        if (op in QUOTIENTS and n == factor) or (op in ("mul", "rmul", "imul") and abs(n * factor - 1) < 1e-9):
            return cleared
    if len(operands) == 1 and op in SHAPE_ONLY:  # a view or cast of it (its numbers are sizes, dims)
        return summed.types
    raise SpmdTypeError(
        f"{op} of {summed.name}, the sum over {over} of the members' means of their own blocks: it is {factor} "
        f"times the mean of the whole; fix: divide it by {factor} right after the psum (or use ax.pmean(..., "
        f"{pmean_axes}) instead of ax.psum)")


def averaged(op: str, reduction: object, out_ndim: int, found: AxisType) -> AxisType:
    """``found``, marked as the mean of each member's own block when ``op`` averages every element of a value that
    varies along the axis (``MEANS``, with the default ``reduction`` or ``"mean"``, to a 0-dim result).

    >>> averaged("crossentropy", None, 0, AxisType("varying", -2))
    varying(the mean of each member's own block)
    >>> averaged("crossentropy", "sum", 0, AxisType("varying", -2))
    varying(dim -2)
    """
    if found.kind == VARYING and out_ndim == 0 and op in MEANS and reduction in (None, "mean"):
        return AxisType(VARYING, None, True)
    return found


def _dim(op: str, operands: list[Operand], varying: list[Operand], index: int) -> int | None:
    """Where the varying axis lies in the result, where the rules can tell; ``None`` otherwise."""
    if op in CONTRACTIONS and len(operands) >= 2:
        x, w = operands[0], operands[1]
        wd = w.types[index].dim if w.types[index].kind == VARYING else None
        xd = x.types[index].dim if x.types[index].kind == VARYING else None
        out = None
        if op == "linear":
            if xd is not None and xd != -1:
                out = xd
            elif wd == -2:
                out = -1
        else:
            if xd is not None and xd != -1:
                out = xd
            elif wd == -1:
                out = -1
        return out
    if op in ELEMENTWISE_SAME_DIMS:
        dims = {o.types[index].dim for o in varying} - {None}  # a pvary-ed value varies but splits no dimension
        return dims.pop() if len(dims) == 1 else None
    return None


def contraction_partial(op: str, operands: list[Operand], index: int) -> bool:
    """Whether ``op`` sums over a dimension both its operands split along the axis: a row-parallel product."""
    if op not in CONTRACTIONS or len(operands) < 2:
        return False
    x, w = operands[0].types[index], operands[1].types[index]
    if x.kind != VARYING or w.kind != VARYING:
        return False
    return x.dim == -1 and w.dim == (-1 if op == "linear" else -2)


def check_output(spec_dims: dict[str, int | None], partial: tuple[str, ...], axis: str, name: str,
                 found: AxisType, ndim: int = 1, size: int = 2) -> None:
    """Whether a region output of type ``found`` (``ndim`` dimensions) along ``axis`` (``size`` members) may leave
    it under its out spec.

    >>> check_output({}, (), "dp", "loss", AxisType("varying"), ndim=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: loss is varying along 'dp', but ... fix: ax.psum(loss, 'dp') for a sum, ax.pmean(loss, 'dp')...
    """
    if found.kind == INVARIANT and found.mean:
        raise SpmdTypeError(f"{name} is the sum over {axis!r} of the members' means of their own blocks: {size} "
                            f"times the mean of the whole; fix: divide it by {size} (or ax.pmean instead of ax.psum)")
    if axis in partial:
        if found.kind != PARTIAL:
            raise SpmdTypeError(f"{name} is {found!r} along {axis!r}, but its out spec claims partial; fix: drop "
                                f"{axis!r} from partial=")
        return
    if axis in spec_dims:
        if found.kind == PARTIAL:
            raise SpmdTypeError(f"{name} is partial along {axis!r}, but its out spec claims it split; fix: "
                                f"ax.psum_scatter({name}, {axis!r}, dim=...) first")
        if found.kind == INVARIANT:
            raise SpmdTypeError(f"{name} is invariant along {axis!r}, but its out spec claims it split along "
                                f"{axis!r}: every member would hold the whole; fix: leave {axis!r} out of the spec")
        want = spec_dims[axis]
        if found.dim is not None and want is not None and found.dim != want:
            raise SpmdTypeError(f"{name} is split along {axis!r} at dimension {found.dim}, but its out spec "
                                f"says dimension {want}; fix: name {axis!r} at that dimension of the spec")
        return
    if found.kind == VARYING:
        said = f"{name} is {found!r} along {axis!r}, but its out spec claims it replicated; fix: "
        if found.mean:
            raise SpmdTypeError(said + f"ax.pmean({name}, {axis!r}) (the mean of the members' means)")
        if ndim == 0 or found.dim is None:  # a scalar (a loss) or a value whose split is unknown: reduce it
            raise SpmdTypeError(said + f"ax.psum({name}, {axis!r}) for a sum, ax.pmean({name}, {axis!r}) for a "
                                f"mean" + ("" if ndim == 0 else " (ax.all_gather_invariant to keep each member's)"))
        raise SpmdTypeError(said + f"ax.all_gather_invariant({name}, {axis!r}, dim={found.dim}) (or name {axis!r} "
                            f"at dimension {found.dim} of the spec)")
    if found.kind == PARTIAL:
        raise SpmdTypeError(f"{name} is partial along {axis!r}, but its out spec claims it replicated; fix: "
                            f"ax.psum({name}, {axis!r}) (or partial=({axis!r},) in the spec)")


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"expected an int dimension, but got {value!r}")
    return value


def _product(sizes: Sequence[int]) -> int:
    out = 1
    for size in sizes:
        out *= size
    return out


def moved_dim(op: str, args: Sequence[object], before: Sequence[int], after: Sequence[int], dim: int) -> int | None:
    """Where dimension ``dim`` (negative) of a tensor of shape ``before`` lies after ``op`` (a view, reshape,
    transpose or permute, given its arguments ``args`` after the tensor), or ``None`` if it does not survive.

    >>> moved_dim("view", (), (2, 3, 8), (2, 3, 4, 2), -1)
    -2
    >>> moved_dim("transpose", (1, 2), (2, 4, 3, 2), (2, 3, 4, 2), -3)
    -2
    """
    d = dim + len(before)
    if op in ("view", "reshape"):
        prefix = _product(before[:d])
        for e in range(len(after)):
            fits = after[e] % before[d] == 0 or before[d] % after[e] == 0
            if _product(after[:e]) == prefix and after[e] > 1 and fits:
                return e - len(after)
        return None
    if op in ("transpose", "swapaxes", "t"):
        a, b = (0, 1) if op == "t" else (_int(args[0]), _int(args[1]))
        a, b = a % len(before), b % len(before)
        e = b if d == a else a if d == b else d
        return e - len(after)
    if op == "permute":
        given = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        order = [_int(i) % len(before) for i in given]
        return order.index(d) - len(after) if d in order else None
    return None
