"""The fix a refused program needs, as a value (:class:`~fmesh.spmd.fix.Fix`): which edit, at which call, with
which code. An :class:`~fmesh.errors.SpmdTypeError` carries one (``error.fix``) and prints it (``...; fix: <the
fix>``): the message is made from the record, so what a reader is told and what a tool (or the test suite,
which applies every fix the corpus prints: ``tests/spmd/spmd_fixes.py``) does are the same.

The edit is located by the call the error was raised in (the torch call or the ``ax`` collective under way; the
region's output ``output``), or, with ``made``, by the call that made the value named. ``target`` is that value
itself (the tensor of the check, never printed), so that a tool can find it among the call's arguments.

>>> Fix("insert", "pvary", "w", ("dp", "tp"), where="matmul")
Fix(insert: ax.pvary(w, ('dp', 'tp')) first)
>>> str(Fix("replace", "psum", axes=("tp",), where="pmean", note="(or divide by the whole's count yourself)"))
"ax.psum(..., 'tp') instead of this pmean (or divide by the whole's count yourself)"
>>> str(Fix("insert", "all_gather", "x", ("tp",), (("dim", -2),))), str(Fix("drop", "pvary"))
("ax.all_gather(x, 'tp', dim=-2) first", 'drop this pvary')
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

Action = Literal["insert", "replace", "drop", "spec", "offset", "argument", "mask", "bias", "block", "text"]


def _axes(axes: tuple[str, ...]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


@attrs.frozen(repr=False)
class Fix:
    """One edit of a refused program.

    * ``insert``: ``ax.<call>(value, axes, **kwargs)`` in place of the value ``value`` (``target``) in the call
      refused (an output: in place of output ``output``);
    * ``replace``: the ``ax`` collective refused (``made``: the one that made ``value``) becomes
      ``ax.<call>(its operand, axes, **kwargs)``;
    * ``drop``: the ``ax`` collective refused (``made``: the one that made ``value``) removed, its operand passed;
    * ``spec``: output ``output``'s out spec becomes ``spec``;
    * ``offset`` with ``made``: the ``narrow`` that made ``value`` starts ``ax.axis_index(axes[0])`` times its
      length further (this member's block);
    * ``offset``: the write refused lands at ``ax.axis_index(axes[0]) * length`` along its dimension ``dim``
      (``kwargs``: ``dim``, ``length``);
    * ``argument``: the call that made ``value`` (``made``) takes ``kwargs``' one argument as
      ``ax.axis_index(axes[0]) * scale`` (``kwargs``: ``name``, ``scale``): a causal mask from global positions;
    * ``bias``: the product refused (``where``: ``addmm``, ``linear``) made without its bias ``value``, then
      ``ax.<call>(it, axes)``, then the bias added;
    * ``block``: output ``output`` (alike on every member) returned as this member's block of its dimension
      ``dim``: ``value.narrow(dim, ax.axis_index(axes[0]) * n, n)``, ``n`` its length over ``size``;
    * ``mask``: the attention refused takes ``attn_mask`` from the queries' global positions (offset by
      ``ax.axis_index(axes[0])``) instead of ``is_causal=True``;
    * ``text``: no edit a tool can make; ``note`` says what to do.
    """

    action: Action
    call: str = ""  # the ax collective inserted or put instead, the one dropped, or the torch call edited
    value: str = ""  # the value's name in messages
    axes: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    where: str = ""  # the call refused (messages: "instead of this pmean")
    made: bool = False  # the edit is at the call that made ``value``, not the call refused
    output: int | None = None  # the region's output it applies to (insert, spec)
    spec: Any = None  # spec: the out spec to declare
    note: str = ""  # what the message adds: another way, or why
    target: Any = attrs.field(default=None, eq=False)  # the value itself (a tensor of the check)

    def code(self) -> str:
        """The edit as the code a reader writes."""
        kw = "".join(f", {k}={v!r}" for k, v in self.kwargs)
        axes = f", {_axes(self.axes)}" if self.axes else ""
        if self.action == "insert":
            code = f"ax.{self.call}({self.value}{axes}{kw})"
            return f"{code} first" if self.output is None else f"return {code}"
        if self.action == "replace":
            this = f"the ax.{self.where} that made {self.value}" if self.made else f"this {self.where}"
            return f"ax.{self.call}(...{axes}{kw}) instead of {this}"
        if self.action == "drop":
            return f"drop the ax.{self.call} that made {self.value}" if self.made else f"drop this {self.call}"
        if self.action == "spec":
            return f"declare out_specs[{self.output}] = {self.spec!r}"
        options = dict(self.kwargs)
        if self.action == "offset" and self.made:
            return (f"{self.value} cut at ax.axis_index({self.axes[0]!r}) times its length (this member's block; "
                    f"its start + ax.axis_index({self.axes[0]!r}) * length)")
        if self.action == "offset":
            return (f"write at ax.axis_index({self.axes[0]!r}) * {options['length']} along dimension "
                    f"{options['dim']} (this member's block)")
        if self.action == "argument":
            return (f"{self.call}({options['name']}=ax.axis_index({self.axes[0]!r}) * {options['scale']}) where "
                    f"{self.value} is made (the mask from global positions)")
        if self.action == "block":
            return (f"return {self.value}.narrow({options['dim']}, ax.axis_index({self.axes[0]!r}) * n, n), n its "
                    f"length / {options['size']} (this member's block of it)")
        if self.action == "bias":
            return f"ax.{self.call}({self.where} without its bias{axes}) + {self.value}, the bias after the reduction"
        if self.action == "mask":
            return (f"attn_mask=(torch.arange(q_len) + ax.axis_index({self.axes[0]!r}) * q_len)[:, None] >= "
                    "torch.arange(k_len) instead of is_causal=True (the mask from global positions)")
        return ""

    def __str__(self) -> str:
        code = self.code()
        return f"{code} {self.note}" if code and self.note else code or self.note

    def __repr__(self) -> str:
        return f"Fix({self.action}: {self})"


def text(note: str) -> Fix:
    """A fix no tool applies: ``note`` says it.

    >>> str(text("expand before splitting"))
    'expand before splitting'
    """
    return Fix("text", note=note)


def insert(call: str, value: str, axes: tuple[str, ...], note: str = "", target: Any = None,
           **kwargs: Any) -> Fix:
    """``ax.<call>(value, axes, **kwargs)`` in place of ``value`` in the call refused."""
    return Fix("insert", call, value, axes, tuple(kwargs.items()), note=note, target=target)
