"""One aten call as the type rules see it (``Call``), and what every rule shares: the dimensions an
argument names, the result's split from its operands' (``varying_of``), and the type of a tensor part of
which was overwritten (``join``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from fmesh.errors import SpmdTypeError
from fmesh.spmd.fix import Fix, insert, text
from fmesh.spmd.types import (
    COPY,
    INV,
    INVARIANT,
    PARTIAL,
    VAR,
    VARYING,
    AxisType,
    Operand,
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
    tensors: tuple[Any, ...] = attrs.field(default=(), eq=False)  # the operands themselves (a fix's target)

    def t(self, k: int, i: int) -> AxisType:
        """Operand ``k``'s type along the ``i``-th axis."""
        return self.operands[k].types[i]

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        return self.args[position] if len(self.args) > position else self.kwargs.get(name, default)

    def at(self, slot: int) -> int | None:
        """The operand that sits at argument ``slot``, if a tensor does."""
        return self.slots.index(slot) if slot in self.slots else None

    def refuse(self, i: int, what: str, fix: str | Fix, k: int | None = None) -> SpmdTypeError:
        """The error of operand ``k`` along the ``i``-th axis: ``what`` is wrong, ``fix`` (a
        :class:`~fmesh.spmd.fix.Fix`, its target this operand unless it names another; a string: a fix no tool
        applies)."""
        said = self.operands[k].said(self.axes[i], i) if k is not None else f"along {self.axes[i]!r}"
        via = f"{self.where} (aten {self.op})" if self.where != self.op else self.op
        record = text(fix) if isinstance(fix, str) else fix
        if record.target is None and k is not None and k < len(self.tensors):
            record = attrs.evolve(record, target=self.tensors[k])
        return SpmdTypeError.refused(f"{via} on {said}: {what}", record)

    def insert(self, call: str, k: int, axis: str, note: str = "", **kwargs: Any) -> Fix:
        """``ax.<call>(operand k, axis, **kwargs) first``."""
        return insert(call, self.operands[k].name, (axis,), note,
                      self.tensors[k] if k < len(self.tensors) else None, **kwargs)


Rule = Callable[[Call, int], AxisType]


def negative(d: int, ndim: int) -> int:
    return d - ndim if d >= 0 else d


def dims_of(value: Any, ndim: int) -> set[int]:
    """The dimensions (negative) an argument names: one, a list, or all of them for ``None`` / ``[]``."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return set(range(-ndim, 0))
    if isinstance(value, int):
        return {negative(value, max(ndim, 1))}
    return {negative(int(v), ndim) for v in value}


def pending_of(kinds: Sequence[AxisType]) -> str | None:
    pend = {t.pending for t in kinds if t.kind == PARTIAL}
    return pend.pop() if len(pend) == 1 else None if not pend else "mixed"


def split_of(call: Call, i: int, k: int) -> int | None:
    t = call.t(k, i)
    return t.dim if t.kind == VARYING else None


def varying_of(call: Call, i: int, dims: Sequence[tuple[int, int | None, Any]]) -> AxisType:
    """The type of a result whose split dimension comes from the operands: ``dims`` lists, for each operand that
    varies, (operand, the result's dimension its split lands at, its layout there: strided or an AxisType);
    they must agree."""
    landed = [(k, d, layout_of(s)) for k, d, s in dims if d is not None]
    if landed:
        k0, d0, s0 = landed[0]
        for k, d, s in landed[1:]:
            if (d, s) != (d0, s0):
                block = next((j for j, _, lay in (landed[0], (k, d, s)) if not lay[0] and not lay[2]
                              and call.t(j, i).dim is not None), None)
                fix = (call.insert("all_gather", block, call.axes[i], "(or split both at the same dimension)",
                                   dim=call.t(block, i).dim) if block is not None else
                       f"gather one of them along {call.axes[i]!r} (ax.all_gather), or split both at the same "
                       "dimension")
                raise call.refuse(i, f"{call.operands[k0].name} is split along {call.axes[i]!r} at result dimension "
                                  f"{d0}, {call.operands[k].name} at {d}" + (" (strided)" if s[0] else ""), fix, k)
        return AxisType(VARYING, d0, strided=s0[0], stride=s0[1], extent=s0[2])
    if not dims:
        return INV
    return COPY if all(isinstance(t, AxisType) and t.copy for _, _, t in dims) else VAR


def layout_of(t: Any) -> tuple[bool, int, int]:
    """(strided, stride, extent) of a split, from an AxisType (or a bare strided flag)."""
    if isinstance(t, AxisType):
        return t.strided, t.stride, t.extent
    return bool(t), 1, 0



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
