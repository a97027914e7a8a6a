"""The checker of a manual region: the per-axis types of its local values, kept on the side, and the two torch
modes that apply the rules (:mod:`fmesh.spmd.registry`) to every call.

* :class:`Ops` (a ``TorchDispatchMode``) sees every aten call, composites taken apart (``einsum``, ``linear``,
  attention), and types its outputs by the call's rule; an in-place write re-types the tensor written and the
  tensor it is a view of.
* :class:`Calls` (a ``TorchFunctionMode``) sees the user's calls: it names values for messages (``linear(x,
  w1)``), and follows the numbers that differ per member (:class:`MemberInt`, :class:`MemberFloat`: from
  ``ax.axis_index`` or ``.item()`` of a varying value) into what is built from them (``torch.full(.., i)``, a
  slice ``t[i * n:]``, ``t[i] = v``), which is typed varying.

The types live in :class:`Types`, keyed by tensor identity (a weak reference guards against a reused id).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.overrides import TorchFunctionMode

from fmesh.context import dispatch_mode_base, torch_function_disabled
from fmesh.errors import SpmdTypeError
from fmesh.mesh import Mesh
from fmesh.spmd.call import Call, Rule, join
from fmesh.spmd.fix import Fix, insert
from fmesh.spmd.products import attention, einsum, einsum_equation
from fmesh.spmd.registry import FACTORIES, LIKE, rule_of, unknown
from fmesh.spmd.types import COMPLETES, INV, INVARIANT, PARTIAL, VAR, VARYING, AxisType, Operand, means_summed

Record = tuple[Callable[[], "torch.Tensor | None"], tuple[AxisType, ...], str]  # a weak reference, its types, name
_SHAPE_ONLY = frozenset({"view", "_unsafe_view", "reshape", "alias", "detach", "clone", "_to_copy", "squeeze",
                         "unsqueeze", "expand", "t", "transpose", "permute", "contiguous", "lift_fresh", "select",
                         "slice", "copy_"})
_OVERWRITES = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_",
                         "exponential_", "geometric_", "cauchy_", "log_normal_"})
_SAME_VALUE = frozenset({"view", "_unsafe_view", "reshape", "alias", "detach", "t", "transpose", "permute",
                         "expand", "unsqueeze", "squeeze", "contiguous", "clone", "_to_copy", "lift_fresh"})
_ALIGNED_VIEWS = frozenset({"slice", "narrow", "alias", "detach", "as_strided"})


def called(op: str, names: Sequence[str]) -> str:
    """How a value is named in messages: the call that made it, from its inputs' names, nested calls elided.

    >>> called("linear", ["gelu(linear(h, w1, b1))", "w2"]), called("add", ["x", "the number 1.0"])
    ('linear(gelu(…), w2)', 'add(x, 1.0)')
    """
    short = [n.removeprefix("the number ") for n in names[:3]] + (["…"] if len(names) > 3 else [])
    return f"{op}({', '.join(n if len(n) <= 16 else n[:n.find('(') + 1] + '…)' if '(' in n else '…' for n in short)})"


def op_name(func: object) -> str:
    """``torch.Tensor.__add__`` → ``add``; ``torch.nn.functional.linear`` → ``linear``.

    >>> import operator
    >>> op_name(operator.truediv), op_name(operator.getitem)
    ('truediv', 'getitem')
    """
    return getattr(func, "__name__", type(func).__name__).strip("_").replace("_", "").lower()


def tensors_in(values: Any) -> list[tuple[int, torch.Tensor]]:
    """The tensors among an operation's arguments with their positions (one level of lists: ``cat``'s)."""
    found: list[tuple[int, torch.Tensor]] = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            found.append((position, value))
        elif isinstance(value, (list, tuple)):
            found.extend((position, v) for v in value if isinstance(v, torch.Tensor))
    return found


class Types:
    """The per-axis types of a region's local values (on the side, by tensor identity), and its modes."""

    def __init__(self, mesh: Mesh, rules: Mapping[Any, str | Rule] | None = None) -> None:
        self.mesh = mesh
        self.axes = tuple(mesh.axis_names)
        self.sizes = tuple(mesh.shape[axis] for axis in self.axes)
        self.rules: Mapping[Any, str | Rule] = dict(rules or {})
        self.quiet = 0  # inside one of the region's own collectives: their torch calls are not the program's
        self.where: list[str] = []  # the user's calls under way (the outermost names the aten calls it makes)
        self.marked: frozenset[str] = frozenset()  # the axes a number in the user's call under way differs along
        self._types: dict[int, Record] = {}
        # a view's id -> (the view, the tensor it is a view of, aligned): weak, and checked (ids are reused)
        self._bases: dict[int, tuple[Callable[[], torch.Tensor | None], Callable[[], torch.Tensor | None], bool]] = {}

    def set(self, tensor: torch.Tensor, types: tuple[AxisType, ...], name: str) -> None:
        self._types[id(tensor)] = (weakref.ref(tensor), types, name)

    def known(self, tensor: torch.Tensor) -> Record | None:
        record = self._types.get(id(tensor))
        return record if record is not None and record[0]() is tensor else None

    def rename(self, tensor: torch.Tensor, name: str) -> None:
        record = self.known(tensor)
        if record is not None:
            self._types[id(tensor)] = (record[0], record[1], name)

    def operand(self, tensor: torch.Tensor) -> Operand:
        """``tensor``'s record; a tensor the region did not see (a constant made outside) is invariant."""
        record = self.known(tensor)
        if record is not None:
            types, name = record[1], record[2]
        else:
            types, name = (INV,) * len(self.axes), f"a constant of shape {tuple(tensor.shape)}"
        return Operand(name, types, bool(tensor.requires_grad and torch.is_grad_enabled()), tensor.dim())

    def base_of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
        found = self._bases.get(id(tensor))
        if found is None or found[0]() is not tensor:
            return None
        base = found[1]()
        return (base, found[2]) if base is not None else None

    def viewed(self, view: torch.Tensor, of: torch.Tensor, aligned: bool) -> None:
        root = self.base_of(of)
        base, aligned = (root[0], root[1] and aligned) if root is not None else (of, aligned)
        self._bases[id(view)] = (weakref.ref(view), weakref.ref(base), aligned)

    def cut(self, whole: torch.Tensor, out: torch.Tensor, axis: str, d: int, length: int, block: bool) -> None:
        """``out``, cut from dimension ``d`` of ``whole`` by a member's number along ``axis``: this member's block
        of it (split there) where ``block`` and the pieces cover the dimension; else each member's own piece."""
        source, now = self.operand(whole), self.operand(out)
        i = self.axes.index(axis)
        d = d % whole.dim()
        kind, split = source.types[i].kind, source.types[i].dim
        covers = block and whole.shape[d] == length * self.sizes[i] and kind != PARTIAL and split is None
        if covers:
            types = list(now.types)
            at = d - whole.dim() + (out.dim() - whole.dim())
            nested = any(t.kind == VARYING and t.dim == at for j, t in enumerate(now.types) if j != i)
            types[i] = AxisType(VARYING, at, strided=nested)  # inside another axis's block: not a block of the whole
            self.set(out, tuple(types), now.name)

    def modes(self) -> tuple[Calls, Ops]:
        return Calls(self), Ops(self)


class MemberInt(int):
    """An ``int`` that differs per member along ``axes`` (``ax.axis_index``, ``.item()`` of a varying value):
    what torch builds from it is varying along them. Arithmetic keeps the mark; a comparison (a ``bool``) does not.

    >>> i = MemberInt(3, {"tp"})
    >>> (i * 2 + 1).axes, int(i * 2 + 1)
    (frozenset({'tp'}), 7)
    """

    axes: frozenset[str]
    form: tuple[str, int, int] | None  # (axis, scale, offset): scale * axis_index(axis) + offset, where it is

    def __new__(cls, value: int, axes: Any, form: tuple[str, int, int] | None = None) -> MemberInt:
        made = super().__new__(cls, value)
        made.axes = frozenset(axes)
        made.form = form
        return made

    def block(self, length: int, axis: str) -> bool:
        """Whether it is ``axis_index(axis) * length`` (where this member's block of ``length`` starts)."""
        return self.form == (axis, length, 0)


class MemberFloat(float):
    """A ``float`` that differs per member along ``axes`` (``.item()`` of a varying value)."""

    axes: frozenset[str]

    def __new__(cls, value: float, axes: Any) -> MemberFloat:
        made = super().__new__(cls, value)
        made.axes = frozenset(axes)
        return made


def member(value: Any, axes: frozenset[str]) -> Any:
    """``value`` marked as differing per member along ``axes`` (a bool, or no axes: unmarked)."""
    if not axes or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return MemberInt(value, axes, None)
    if isinstance(value, float):
        return MemberFloat(value, axes)
    return value


def _affine(form: tuple[str, int, int] | None, name: str, others: Sequence[Any]) -> tuple[str, int, int] | None:
    """The form of ``scale * axis_index + offset`` after ``name`` with plain ints ``others``."""
    if form is None or any(isinstance(o, (MemberInt, MemberFloat)) or not isinstance(o, int) for o in others):
        return None
    axis, scale, offset = form
    k = others[0] if others else 0
    found = {"__add__": (scale, offset + k), "__radd__": (scale, offset + k), "__sub__": (scale, offset - k),
             "__rsub__": (-scale, k - offset), "__mul__": (scale * k, offset * k), "__rmul__": (scale * k, offset * k),
             "__neg__": (-scale, -offset), "__pos__": (scale, offset)}.get(name)
    return None if found is None else (axis, found[0], found[1])


def _arithmetic(base: type, name: str) -> Callable[..., Any]:
    plain = getattr(base, name)

    def method(self: Any, *others: Any) -> Any:
        result = plain(self, *others)
        if result is NotImplemented:
            return result
        axes = frozenset(self.axes).union(*(getattr(o, "axes", frozenset()) for o in others))
        made = member(result, axes)
        if isinstance(made, MemberInt):
            made.form = _affine(getattr(self, "form", None), name, others)
        return made
    return method


for _kind in (MemberInt, MemberFloat):
    for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
                  "__rfloordiv__", "__mod__", "__rmod__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__",
                  "__neg__", "__pos__", "__abs__"):
        setattr(_kind, _name, _arithmetic(_kind.__mro__[1], _name))


def marks(values: Any) -> frozenset[str]:
    """The axes along which the numbers among ``values`` (slices, lists, tuples looked into) differ per member."""
    found: set[str] = set()
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, (MemberInt, MemberFloat)):
            found |= value.axes
        elif isinstance(value, slice):
            stack.extend((value.start, value.stop, value.step))
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return frozenset(found)


class Calls(TorchFunctionMode):  # type: ignore[misc]
    """The user's torch calls: names, and the numbers that differ per member."""

    def __init__(self, types: Types) -> None:
        super().__init__()
        self.types = types

    def __torch_function__(self, func: Any, kinds: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        owner = self.types
        if owner.quiet:
            return func(*args, **kwargs)
        name = op_name(func)
        if name == "item" and args and isinstance(args[0], torch.Tensor):
            return self._item(args[0], func)
        if name == "backward" and args and isinstance(args[0], torch.Tensor):
            means_summed("backward", [owner.operand(args[0])], [], owner.axes, owner.sizes, tensors=[args[0]])
        whole = self._whole(name, args, kwargs)
        before, owner.marked = owner.marked, marks(list(args) + list(kwargs.values()))
        owner.where.append(name)
        owner.quiet += whole is not None  # a composite typed whole: its aten calls are not looked at
        try:
            result = func(*args, **kwargs)
        except Exception:
            if whole is not None:  # a wrong program is named before torch's complaint
                self._typed(whole, whole.shapes[0])
            raise
        finally:
            owner.where.pop()
            owner.quiet -= whole is not None
            owner.marked = before
        if whole is not None and isinstance(result, torch.Tensor):
            owner.set(result, self._typed(whole, tuple(result.shape)), name)
        outputs = [t for _, t in tensors_in(result if isinstance(result, (list, tuple)) else [result])]
        inputs = [t for _, t in tensors_in(list(args) + list(kwargs.values()))]
        label = called(name, [owner.operand(t).name for t in inputs])
        for out in outputs:
            if not any(out is t for t in inputs):
                owner.rename(out, label)
        axes = marks(list(args) + list(kwargs.values()))
        if axes:
            written = [args[0]] if name in ("setitem",) or (name.endswith("_") and inputs) else []
            for out in outputs + [t for t in written if isinstance(t, torch.Tensor)]:
                self._vary(out, axes, label, inputs[0] if inputs else None)
            if name in ("narrow", "getitem") and len(outputs) == 1 and isinstance(args[0], torch.Tensor):
                self._block(args[0], outputs[0], name, args[1:])
        if name in ("chunk", "split", "unbind", "tensorsplit") and isinstance(result, (tuple, list)) and inputs:
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
            return Pieces(result, self, inputs[0], int(dim) if name != "unbind" else None)
        return result

    def _typed(self, whole: Call, out: tuple[int, ...]) -> tuple[AxisType, ...]:
        """The types of a composite's result (of shape ``out``), typed whole by its rule."""
        owner = self.types
        means_summed(whole.where, list(whole.operands), [], owner.axes, owner.sizes,  # a summed mean: refused
                     tensors=whole.tensors)
        call = attrs.evolve(whole, out=out)
        rule = einsum if whole.op == "einsum" else attention
        types = tuple(rule(call, i) for i in range(len(owner.axes)))
        _needs_pvary(call, types)
        return types

    def _block(self, whole: torch.Tensor, out: torch.Tensor, name: str, index: Sequence[Any]) -> None:
        """``out`` typed as this member's block of ``whole`` where it was cut at ``axis_index * length``
        (``x.narrow(d, i * n, n)``, ``x[i * n:(i + 1) * n]``) from a dimension whole along that axis."""
        if name == "narrow":
            d, start, length = int(index[0]), index[1], int(index[2])
        else:
            where = index[0] if isinstance(index[0], tuple) else (index[0],)
            cut = [(d, s) for d, s in enumerate(where) if isinstance(s, slice) and s != slice(None)]
            if len(cut) != 1 or any(not isinstance(s, slice) for s in where) or cut[0][1].step not in (None, 1):
                return
            d, piece = cut[0]
            start, length = piece.start, (piece.stop or 0) - (piece.start or 0)
        if isinstance(start, MemberInt) and start.form is not None:
            self.types.cut(whole, out, start.form[0], d, length, start.block(length, start.form[0]))

    def _whole(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | None:
        """The call of a composite typed whole (``matmul``/``einsum`` by their equation, attention), whose
        decomposition's views would hide what it contracts; ``None`` for any other call."""
        owner = self.types
        found = tensors_in(list(args) + list(kwargs.values()))
        if name in ("matmul", "rmatmul", "einsum"):
            tensors = [t for _, t in found]
            if name == "rmatmul":
                tensors.reverse()
            equation = einsum_equation("einsum" if name == "einsum" else "matmul", args, [t.dim() for t in tensors])
            if equation is None:
                return None
            op, call_args, slots = "einsum", (equation,), tuple(range(len(tensors)))
        elif name == "scaleddotproductattention" and len(found) >= 3:
            tensors = [t for _, t in found]
            op, call_args = "scaled_dot_product_attention", tuple(args) + tuple(
                kwargs.get(k) for k in ("attn_mask", "dropout_p", "is_causal")[max(len(args) - 3, 0):])
            slots = tuple(p if p < len(args) else 3 for p, _ in found)
        else:
            return None
        operands = tuple(owner.operand(t) for t in tensors)
        if all(t.kind == INVARIANT and not t.mean for o in operands for t in o.types):
            return None
        return Call(op=op, where=name, args=call_args, kwargs=dict(kwargs), operands=operands,
                    shapes=tuple(tuple(t.shape) for t in tensors), slots=slots, out=(), axes=owner.axes,
                    tensors=tuple(tensors))

    def _item(self, tensor: torch.Tensor, func: Any) -> Any:
        operand = self.types.operand(tensor)
        axes = set()
        for axis, t in zip(self.types.axes, operand.types, strict=True):
            if t.kind == PARTIAL:
                raise SpmdTypeError.refused(f"item() of {operand.name}, which is {t!r} along {axis!r}: each member's "
                                            "number is its own part", insert(COMPLETES[t.pending], operand.name,
                                                                             (axis,), target=tensor))
            if t.kind == VARYING:
                axes.add(axis)
        return member(func(tensor), frozenset(axes))

    def _vary(self, tensor: torch.Tensor, axes: frozenset[str], label: str,
              source: torch.Tensor | None = None) -> None:
        operand = self.types.operand(tensor)
        named = self.types.operand(source).name if source is not None else operand.name
        new = []
        for axis, t in zip(self.types.axes, operand.types, strict=True):
            if axis in axes and t.kind == PARTIAL:
                raise SpmdTypeError.refused(f"{label} on {operand.name}, which is {t!r} along {axis!r}, with a number "
                                            f"that differs per member along {axis!r}: each member's part is handled "
                                            "differently", insert(COMPLETES[t.pending], named, (axis,),
                                                                  target=source if source is not None else tensor))
            new.append(VAR if axis in axes and t.kind == INVARIANT else t)
        if operand.grad and any(axis in axes and t.kind == INVARIANT for axis, t in zip(
                self.types.axes, operand.types, strict=True)):
            raise SpmdTypeError.refused(f"{label}: {operand.name} wants a gradient and is invariant, but a number "
                                        f"that differs per member along {sorted(axes)} makes it differ",
                                        insert("pvary", named, tuple(sorted(axes)),
                                               target=source if source is not None else tensor))
        self.types.set(tensor, tuple(new), operand.name)


class Pieces(tuple):  # type: ignore[type-arg]
    """The pieces of ``chunk``/``split``/``unbind``: a piece chosen by a member's number (``pieces[axis_index]``)
    is typed as that member's block (or its own value), not as the same on every member."""

    calls: Calls
    whole: torch.Tensor
    dim: int | None

    def __new__(cls, pieces: Sequence[Any], calls: Calls, whole: torch.Tensor, dim: int | None) -> Pieces:
        made = super().__new__(cls, pieces)
        made.calls, made.whole, made.dim = calls, whole, dim
        return made

    def __getitem__(self, index: Any) -> Any:
        piece = super().__getitem__(index)
        if isinstance(index, MemberInt) and isinstance(piece, torch.Tensor):
            with torch_function_disabled():  # the check's own calls, not the program's
                self._piece(index, piece)
        return piece

    def _piece(self, index: MemberInt, piece: torch.Tensor) -> None:
        label = f"pieces[{index.form[0] if index.form else 'i'}]"
        self.calls._vary(piece, index.axes, label, self.whole)
        if self.dim is not None and index.form is not None and index.form[1:] == (1, 0):
            axis = index.form[0]
            even = all(p.shape == piece.shape for p in self)
            length = piece.shape[self.dim]
            self.calls.types.cut(self.whole, piece, axis, self.dim, length, even and len(self) == self.calls
                                 .types.sizes[self.calls.types.axes.index(axis)])


def _axes_said(axes: Sequence[str]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


class Ops(dispatch_mode_base()):  # type: ignore[misc]
    """Every aten call: its rule per axis, then its outputs typed (and an in-place write's tensor re-typed)."""

    def __init__(self, types: Types) -> None:
        super().__init__()
        self.types = types

    def __torch_dispatch__(self, func: Any, kinds: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        owner = self.types
        if owner.quiet:
            return func(*args, **kwargs)
        op = func.overloadpacket.__name__
        found = tensors_in(list(args) + list(kwargs.values()))
        operands = tuple(owner.operand(t) for _, t in found)
        try:
            result = func(*args, **kwargs)
        except Exception:
            if operands and op not in FACTORIES:  # a wrong program is named before torch's complaint
                self._types(func, op, args, kwargs, found, operands, tuple(found[0][1].shape))
            raise
        outputs = [t for _, t in tensors_in(result if isinstance(result, (list, tuple)) else [result])]
        if not outputs:
            return result
        if not operands or op in FACTORIES or (op in _OVERWRITES and len(operands) == 1):
            new: tuple[AxisType, ...] = (INV,) * len(owner.axes)
        elif op in LIKE:  # a constant shaped like the input: a block of the constant where the input is split
            new = tuple(t if t.kind == VARYING else INV for t in operands[0].types)
        elif all(t.kind == INVARIANT and not t.mean for o in operands for t in o.types):
            new = operands[0].types
        else:
            new = self._types(func, op, args, kwargs, found, operands, tuple(outputs[0].shape))
        # a view or a copy is the value it shows: named as it (``F.linear``'s reshapes and transposes inside)
        name = operands[0].name if operands and op in _SAME_VALUE else called(op, [o.name for o in operands])
        if op.endswith("_") and found:
            self._write(found[0][1], new, op, operands)
        for out in outputs:
            if found and out is found[0][1] and op.endswith("_"):
                continue
            owner.set(out, _shifted(new, outputs[0].dim(), out.dim()), name)
            if func.is_view and found:
                owner.viewed(out, found[0][1], op in _ALIGNED_VIEWS)
        return result

    def _types(self, func: Any, op: str, args: Sequence[Any], kwargs: Mapping[str, Any],
               found: list[tuple[int, torch.Tensor]], operands: tuple[Operand, ...],
               out: tuple[int, ...]) -> tuple[AxisType, ...]:
        owner = self.types
        numbers = [v for v in args[1:] if isinstance(v, (int, float)) and not isinstance(v, bool)]
        summed = means_summed(op.rstrip("_").removesuffix("_"), list(operands), numbers, owner.axes, owner.sizes,
                              shape_only=op in _SHAPE_ONLY, tensors=[t for _, t in found])
        if summed is not None:
            return summed
        if op in _OVERWRITES:  # copy_(dst, src): the written value's type is the source's
            operands, found = operands[1:], found[1:]
        rule = rule_of(func, op, owner.rules) or unknown
        call = Call(op=op, where=owner.where[0] if owner.where else op, args=tuple(args), kwargs=kwargs,
                    operands=operands, shapes=tuple(tuple(t.shape) for _, t in found),
                    slots=tuple(p for p, _ in found), out=out, axes=owner.axes,
                    tensors=tuple(t for _, t in found))
        types = tuple(rule(call, i) for i in range(len(owner.axes)))
        _needs_pvary(call, types)
        return types

    def _write(self, tensor: torch.Tensor, new: tuple[AxisType, ...], op: str, operands: tuple[Operand, ...]) -> None:
        """``tensor`` (written in place) now of type ``new``; the tensor it is a view of, joined with it."""
        owner = self.types
        name = owner.operand(tensor).name
        owner.set(tensor, new, name)
        root = owner.base_of(tensor)
        if root is None:
            return
        base, aligned = root
        old = owner.operand(base)
        whole = aligned and tensor.dim() == base.dim()  # a view cutting no dimension the written value splits
        for axis, t, n in zip(owner.axes, old.types, new, strict=True):
            same = t.kind == INVARIANT or t.copy
            if same and whole and n.kind == VARYING and n.dim is not None and axis not in owner.marked and (
                    tensor.shape[n.dim] != base.shape[n.dim]):
                raise SpmdTypeError.refused(
                    f"{op} writes a value split along {axis!r} at dimension {n.dim} into the same positions of "
                    f"{old.name} on every member: each member's block lands where the others' do",
                    Fix("offset", op, old.name, (axis,), (("dim", n.dim), ("length", tensor.shape[n.dim])),
                        target=base))
        joined = tuple(n if whole and t.kind == INVARIANT and n.kind == VARYING and n.dim is not None
                       and tensor.shape[n.dim] == base.shape[n.dim] else join(
                           t, n if aligned or n.kind != VARYING else VAR, axis, old.name)
                       for axis, t, n in zip(owner.axes, old.types, new, strict=True))
        owner.set(base, joined, old.name)


def _shifted(types: tuple[AxisType, ...], first: int, ndim: int) -> tuple[AxisType, ...]:
    """The types of an output of rank ``ndim`` of a call whose first output has rank ``first`` (its split
    dimensions counted from the end, which a shorter output may lack)."""
    if ndim == first:
        return types
    out = []
    for t in types:
        if t.kind == VARYING and t.dim is not None:
            d = t.dim + (first - ndim) if ndim < first else t.dim
            out.append(VAR if d >= 0 or d < -ndim else attrs.evolve(t, dim=d))
        else:
            out.append(t)
    return tuple(out)


def _needs_pvary(call: Call, types: tuple[AxisType, ...]) -> None:
    """An invariant operand that wants a gradient, in a call where a value varies along some axes: each member's
    gradient of it is its own part, which nothing sums. One message names every axis it needs."""
    for k, operand in enumerate(call.operands):
        if not operand.grad:
            continue
        axes = [axis for i, axis in enumerate(call.axes) if operand.types[i].kind == INVARIANT and (
            types[i].kind == VARYING or any(o.types[i].kind == VARYING for o in call.operands))]
        if axes:
            other = next(o for o in call.operands if any(o.types[call.axes.index(a)].kind == VARYING for a in axes))
            i = call.axes.index(axes[0])
            raise call.refuse(i, f"{operand.name} wants a gradient and is invariant along {_axes_said(axes)}, and it "
                              f"meets {other.said(axes[0], i)}: every member adds its own part of its gradient, "
                              f"which nothing sums",
                              insert("pvary", operand.name, tuple(axes), f"(its gradient is then summed over "
                                     f"{_axes_said(axes)}: Megatron's sum_gradients, DDP's all_reduce)",
                                     call.tensors[k] if k < len(call.tensors) else None), k)
