"""The checker of a manual region: the per-axis types of its local values, kept on the side, and the two torch
modes that apply the rules (:mod:`fmesh.spmd.rules`) to every call.

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

from fmesh.context import dispatch_mode_base
from fmesh.errors import SpmdTypeError
from fmesh.mesh import Mesh
from fmesh.spmd.rules import FACTORIES, LIKE, Call, Rule, join, rule_of, unknown
from fmesh.spmd.types import INV, INVARIANT, PARTIAL, VAR, VARYING, AxisType, Operand, means_summed

Record = tuple["weakref.ref[torch.Tensor]", tuple[AxisType, ...], str]
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
        self._types: dict[int, Record] = {}
        self._bases: dict[int, tuple[weakref.ref[torch.Tensor], bool]] = {}

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
        base = found[0]() if found is not None else None
        return (base, found[1]) if base is not None and found is not None else None

    def viewed(self, view: torch.Tensor, of: torch.Tensor, aligned: bool) -> None:
        root = self.base_of(of)
        base, aligned = (root[0], root[1] and aligned) if root is not None else (of, aligned)
        self._bases[id(view)] = (weakref.ref(base), aligned)

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

    def __new__(cls, value: int, axes: Any) -> MemberInt:
        made = super().__new__(cls, value)
        made.axes = frozenset(axes)
        return made


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
        return MemberInt(value, axes)
    if isinstance(value, float):
        return MemberFloat(value, axes)
    return value


def _arithmetic(base: type, name: str) -> Callable[..., Any]:
    plain = getattr(base, name)

    def method(self: Any, *others: Any) -> Any:
        result = plain(self, *others)
        if result is NotImplemented:
            return result
        axes = frozenset(self.axes).union(*(getattr(o, "axes", frozenset()) for o in others))
        return member(result, axes)
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
            means_summed("backward", [owner.operand(args[0])], [], owner.axes, owner.sizes)
        owner.where.append(name)
        try:
            result = func(*args, **kwargs)
        finally:
            owner.where.pop()
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
                self._vary(out, axes, label)
        return result

    def _item(self, tensor: torch.Tensor, func: Any) -> Any:
        operand = self.types.operand(tensor)
        axes = set()
        for axis, t in zip(self.types.axes, operand.types, strict=True):
            if t.kind == PARTIAL:
                raise SpmdTypeError(f"item() of {operand.name}, which is {t!r} along {axis!r}: each member's number "
                                    f"is its own part; fix: ax.psum({operand.name}, {axis!r}) first")
            if t.kind == VARYING:
                axes.add(axis)
        return member(func(tensor), frozenset(axes))

    def _vary(self, tensor: torch.Tensor, axes: frozenset[str], label: str) -> None:
        operand = self.types.operand(tensor)
        new = []
        for axis, t in zip(self.types.axes, operand.types, strict=True):
            if axis in axes and t.kind == PARTIAL:
                raise SpmdTypeError(f"{label} on {operand.name}, which is {t!r} along {axis!r}, with a number that "
                                    f"differs per member along {axis!r}: each member's part is handled differently; "
                                    f"fix: ax.psum({operand.name}, {axis!r}) first")
            new.append(VAR if axis in axes and t.kind == INVARIANT else t)
        if operand.grad and any(axis in axes and t.kind == INVARIANT for axis, t in zip(
                self.types.axes, operand.types, strict=True)):
            raise SpmdTypeError(f"{label}: {operand.name} wants a gradient and is invariant, but a number that "
                                f"differs per member along {sorted(axes)} makes it differ; fix: "
                                f"ax.pvary({operand.name}, {_axes_said(sorted(axes))}) first")
        self.types.set(tensor, tuple(new), operand.name)


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
                              shape_only=op in _SHAPE_ONLY)
        if summed is not None:
            return summed
        if op in _OVERWRITES:  # copy_(dst, src): the written value's type is the source's
            operands, found = operands[1:], found[1:]
        rule = rule_of(func, op, owner.rules) or unknown
        call = Call(op=op, where=owner.where[0] if owner.where else op, args=tuple(args), kwargs=kwargs,
                    operands=operands, shapes=tuple(tuple(t.shape) for _, t in found),
                    slots=tuple(p for p, _ in found), out=out, axes=owner.axes)
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
        joined = tuple(join(t, n if aligned or n.kind != VARYING else VAR, axis, old.name)
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
                              f"which nothing sums", f"ax.pvary({operand.name}, {_axes_said(axes)}) first (its "
                              f"gradient is then summed over {_axes_said(axes)}: Megatron's sum_gradients, DDP's "
                              "all_reduce)", k)
