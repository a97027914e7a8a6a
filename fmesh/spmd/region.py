"""The manual region (JAX's ``shard_map``): a function of local tensors, run on every rank, over named axes.

``shard_map(f, mesh=..., in_specs=..., out_specs=..., ctx=...)`` returns a function of global tensors (DTensors
on ``ctx.device_mesh(mesh)``, or each rank's local block). It calls ``f(ax, *blocks)``, where ``ax`` is a
:class:`Axes` whose collectives name mesh axes (``ax.psum(x, "tp")``), and returns DTensors per ``out_specs``.

With ``check=True`` (the default) every local value carries its type per axis (:mod:`fmesh.spmd.types`) and a
program whose gradient or result would be wrong raises :class:`~fmesh.errors.SpmdTypeError` in the forward
pass. The types are kept by a ``TorchFunctionMode`` for the region's duration, on the side (no tensor subclass);
with ``check=False`` no mode is entered: ``f`` runs on plain tensors and each collective is one Context call.
Under ``torch.compile`` the region runs unchecked (check it once eagerly).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from fmesh.context import Context
from fmesh.context.collectives import compiling
from fmesh.errors import SpmdTypeError
from fmesh.mesh import Mesh
from fmesh.spmd.placements import to_placements
from fmesh.spmd.spec import PartitionSpec, Sharding, check_spec, dim_axes
from fmesh.spmd.types import (
    ADDITIVE,
    INVARIANT,
    MOVES,
    PARTIAL,
    VARYING,
    AxisType,
    Kind,
    Operand,
    averaged,
    check_output,
    combine,
    gathered,
    means_summed,
    moved_dim,
    op_name,
)

AxesArg = str | Sequence[str]


def _tensors(values: Any) -> list[torch.Tensor]:
    """The tensors among an operation's arguments (one level of lists and tuples: ``torch.cat``'s)."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def called(op: str, names: Sequence[str]) -> str:
    """How a value is named in messages: the call that made it, from its inputs' names, nested calls elided.

    >>> called("linear", ["gelu(linear(h, w1, b1))", "w2"]), called("add", ["x", "the number 1.0"])
    ('linear(gelu(…), w2)', 'add(x, 1.0)')
    """
    short = [n.removeprefix("the number ") for n in names[:3]] + (["…"] if len(names) > 3 else [])
    return f"{op}({', '.join(n if len(n) <= 16 else n[:n.find('(') + 1] + '…)' if '(' in n else '…' for n in short)})"


def _number(value: object) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


class Types(TorchFunctionMode):  # type: ignore[misc]
    """The per-axis types of the region's local values, and the rule check of every torch call on them."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__()
        self.mesh = mesh
        self.sizes = tuple(mesh.shape[axis] for axis in mesh.axis_names)
        self.quiet = 0  # inside one of the region's own collectives: their torch calls are not the program's
        self._types: dict[int, tuple[weakref.ref[torch.Tensor], tuple[AxisType, ...], str]] = {}

    def set(self, tensor: torch.Tensor, types: tuple[AxisType, ...], name: str) -> None:
        self._types[id(tensor)] = (weakref.ref(tensor), types, name)

    def operand(self, tensor: torch.Tensor) -> Operand:
        """``tensor``'s record; a tensor the region did not see (a constant made inside) is invariant."""
        known = self._types.get(id(tensor))
        if known is not None and known[0]() is tensor:
            _, types, name = known
        else:
            types, name = (AxisType(INVARIANT),) * self.mesh.ndim, f"a constant of shape {tuple(tensor.shape)}"
        return Operand(name, types, tensor.requires_grad and torch.is_grad_enabled(), tensor.dim())

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.quiet:
            return func(*args, **kwargs)
        inputs = [self.operand(t) for t in _tensors(list(args) + list(kwargs.values()))]
        op = op_name(func)
        if op in ADDITIVE and inputs:  # a number added is the same on every member: invariant (0 adds nothing)
            inputs += [Operand(f"the number {v!r}", (AxisType(INVARIANT),) * self.mesh.ndim, False, 0)
                       for v in (*args, kwargs.get("other")) if _number(v) and v != 0]
        broken: SpmdTypeError | None = None
        try:
            found = [combine(op, axis, index, inputs) for index, axis in enumerate(self.mesh.axis_names)]
        except SpmdTypeError as error:
            broken = error
        numbers = [v for v in (*args[1:], kwargs.get("other")) if _number(v)]
        if op == "backward" and any(t.mean and t.kind == INVARIANT for o in inputs for t in o.types):
            means_summed(op, inputs, numbers, self.mesh.axis_names, self.sizes)  # raises: the gradient is n x
        try:
            result = func(*args, **kwargs)
        except Exception:
            if broken is not None:  # a wrong program is named before torch complains about its shapes
                raise broken from None
            raise
        outputs = _tensors(result if isinstance(result, (list, tuple)) else [result])
        if not outputs or not inputs:  # an attribute read (``.shape``, ``.requires_grad``), not a computation
            return result
        if broken is not None:
            raise broken
        summed = means_summed(op, inputs, numbers, self.mesh.axis_names, self.sizes)
        if summed is not None:
            found = list(summed)
        found = [averaged(op, kwargs.get("reduction"), outputs[0].dim(), t) for t in found]
        if op in MOVES and isinstance(args[0], torch.Tensor):
            before, after = tuple(args[0].shape), tuple(outputs[0].shape)
            found = [AxisType(VARYING, moved_dim(op, args[1:], before, after, d)) if t.kind == VARYING and d is not None
                     else t for t, d in zip(found, (o.dim for o in inputs[0].types), strict=True)]
        name = called(op, [o.name for o in inputs])
        for out in outputs:
            self.set(out, tuple(found), name)
        return result


@attrs.frozen
class Axes:
    """What the region's function receives first: its mesh's axes and their collectives.

    Each collective is the Context's (``ctx.sum_partials``, ``ctx.all_gather``, ...), so it differentiates and
    compiles like them; with checks on, it also checks and gives its result's type.
    """

    ctx: Context
    mesh: Mesh
    types: Types | None = None

    def _axes(self, axes: AxesArg) -> tuple[str, ...]:
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        for name in names:
            if name not in self.mesh.axis_names:
                raise ValueError(f"expected one of the mesh's axes {self.mesh.axis_names}, but got {name!r}")
        return names

    def _run(self, what: str, x: torch.Tensor, axes: tuple[str, ...], allowed: Mapping[Kind, str],
             result: Callable[[], torch.Tensor], becomes: Callable[[AxisType], AxisType]) -> torch.Tensor:
        """``result()`` after checking ``x``'s type along ``axes`` (``allowed``: a forbidden kind → the fix), typed
        ``becomes(its type)`` along them."""
        types = self.types
        if types is None or compiling():
            return result()
        operand = types.operand(x)
        for axis in axes:
            found = operand.types[self.mesh.axis_index(axis)]
            if found.kind in allowed:
                raise SpmdTypeError(f"{what} of {operand.name}, which is {found!r} along {axis!r}: "
                                    f"{allowed[found.kind]}")
        types.quiet += 1
        try:
            out = result()
        finally:
            types.quiet -= 1
        new = tuple(becomes(t) if axis in axes else t
                    for axis, t in zip(self.mesh.axis_names, operand.types, strict=True))
        axes_said = repr(axes[0]) if len(axes) == 1 else repr(axes)
        types.set(out, new, operand.name if what == "pvary" else called(what, [operand.name, axes_said]))
        return out

    def _gathering(self, x: torch.Tensor, names: tuple[str, ...], dim: int) -> None:
        """Refuse a tiled gather at a dimension other than the one its axis splits (checks on, eager)."""
        if self.types is None or compiling():
            return
        operand = self.types.operand(x)
        d = dim - x.dim() if dim >= 0 else dim
        split: dict[int, list[str]] = {}
        for axis, found in zip(self.mesh.axis_names, operand.types, strict=True):
            if found.kind == VARYING and found.dim is not None:
                split.setdefault(found.dim, []).append(axis)
        for axis in names:
            gathered(axis, self.mesh.axis_index(axis), operand, d, split)

    def axis_index(self, axis: str) -> int:
        """This rank's coordinate along ``axis`` (JAX's ``lax.axis_index``)."""
        return self.ctx.index(self.mesh, self._axes(axis)[0])

    def axis_size(self, axis: AxesArg) -> int:
        """The number of members along ``axis`` (or the product over several)."""
        size = 1
        for name in self._axes(axis):
            size *= self.mesh.shape[name]
        return size

    def psum(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The sum over ``axes``, invariant along them; the gradient passes unchanged (``ctx.sum_partials``)."""
        if self.types is None:  # unchecked: the Context's call and nothing else (it checks the axes)
            return self.ctx.sum_partials(x, self.mesh, axes)
        return self._sum("psum", x, self._axes(axes), summing=True)

    def pmean(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The mean over ``axes`` (:meth:`psum` divided by their size; the members' means of their own blocks
        average to the mean of the whole)."""
        if self.types is None:
            return self.ctx.sum_partials(x, self.mesh, axes) / self.axis_size(axes)
        return self._sum("pmean", x, self._axes(axes), summing=False) / self.axis_size(axes)

    def _sum(self, what: str, x: torch.Tensor, names: tuple[str, ...], summing: bool) -> torch.Tensor:
        # a psum of the members' means of their own blocks is their sum: divided by the member count it is the mean
        # of the whole (Megatron's loss averaging); anything else done with it first is refused (means_summed)
        return self._run(what, x, names, {INVARIANT: "it is already the same on every member (reduced); a second "
                                          f"sum multiplies it by the axis size; fix: drop this {what}"},
                         lambda: self.ctx.sum_partials(x, self.mesh, names),
                         lambda t: AxisType(INVARIANT, None, summing and t.mean))

    def pvary(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """``x`` itself, from now on varying along ``axes``; its gradient is summed over them (``sum_gradients``)."""
        if self.types is None:
            return self.ctx.sum_gradients(x, self.mesh, axes)
        names = self._axes(axes)
        return self._run(
            "pvary", x, names,
            {VARYING: "it already varies, its gradient is already each member's own; a second pvary sums the "
                      "gradient twice; fix: drop this pvary",
             PARTIAL: "a pending sum; fix: psum it first"},
            lambda: self.ctx.sum_gradients(x, self.mesh, names), lambda t: AxisType(VARYING))

    def all_gather(self, x: torch.Tensor, axis: str, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """Every member's ``x`` along ``dim`` (stacked on a new ``dim`` unless ``tiled``); the result stays
        varying and its backward is a reduce_scatter (Megatron's sequence-parallel gather)."""
        if self.types is None and tiled:
            return self.ctx.all_gather(x, self.mesh, axis, dim)
        names = self._axes(axis)
        if tiled:
            self._gathering(x, names, dim)

        def gather() -> torch.Tensor:
            if tiled:
                return self.ctx.all_gather(x, self.mesh, names, dim)
            return self.ctx.all_gather(x.unsqueeze(dim), self.mesh, names, dim)
        return self._run("all_gather", x, names, _GATHER_FORBIDS, gather, lambda t: AxisType(VARYING))

    def all_gather_invariant(self, x: torch.Tensor, axis: AxesArg, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """Every member's ``x`` along ``dim``, invariant: its backward keeps this member's slice, no collective."""
        names = self._axes(axis)
        size, index = self.axis_size(names), self.ctx.index(self.mesh, names)  # the slot in the gather's order
        if tiled:
            self._gathering(x, names, dim)

        def gather() -> torch.Tensor:
            block = x if tiled else x.unsqueeze(dim)
            whole = self.ctx.all_gather(block.detach(), self.mesh, names, dim)
            if not (x.requires_grad and torch.is_grad_enabled()):
                return whole
            return _Sliced.apply(block, whole, dim, index, size)
        return self._run("all_gather_invariant", x, names, _GATHER_FORBIDS, gather, lambda t: AxisType(INVARIANT))

    def psum_scatter(self, x: torch.Tensor, axis: str, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """The sum over ``axis``, this member keeping its block of ``dim`` (a reduce_scatter); varying."""
        if self.types is None and tiled:
            return self.ctx.reduce_scatter(x, self.mesh, axis, dim)
        names = self._axes(axis)
        ndim = x.dim() - (0 if tiled else 1)
        d = dim if dim >= 0 else dim + x.dim()

        def scatter() -> torch.Tensor:
            out = self.ctx.reduce_scatter(x, self.mesh, names, d)
            return out if tiled else out.squeeze(d)
        return self._run("psum_scatter", x, names, {INVARIANT: "it is already reduced (the same on every member); "
                                                    "fix: slice it (or drop the earlier psum)"},
                         scatter, lambda t: AxisType(VARYING, d - ndim))

    def ppermute(self, x: torch.Tensor, axis: str, perm: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``ctx.ppermute`` along ``axis``; the result varies along it."""
        names = self._axes(axis)
        return self._run("ppermute", x, names, {PARTIAL: "a pending sum moved between members is not one; fix: "
                                                "psum it first"},
                         lambda: self.ctx.ppermute(x, self.mesh, names[0], perm),
                         lambda t: AxisType(VARYING, t.dim if t.kind == VARYING else None))


_GATHER_FORBIDS = {
    PARTIAL: "a pending sum gathered stays unsummed; fix: ax.psum_scatter(...) (a reduce_scatter) where this "
             "all_gather is, or ax.psum(...) first",
    INVARIANT: "it is already the same on every member; gathering copies it once per member; fix: drop this "
               "all_gather (or slice it)",
}


class _Sliced(torch.autograd.Function):  # type: ignore[misc]
    """The gathered ``whole`` forward; the backward is this member's slice of the gradient (no collective)."""

    @staticmethod
    def forward(ctx: Any, block: torch.Tensor, whole: torch.Tensor, dim: int, index: int, size: int) -> torch.Tensor:
        ctx.link = (dim, index, block.shape[dim])
        return whole

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        dim, index, n = ctx.link
        return grad.narrow(dim, index * n, n), None, None, None, None


def _specs(specs: PartitionSpec | Sequence[PartitionSpec], count: int | None, what: str) -> tuple[PartitionSpec, ...]:
    found = (specs,) if isinstance(specs, PartitionSpec) else tuple(specs)
    if count is not None and len(found) != count:
        raise ValueError(f"{what}: expected one spec per value ({count}), but got {len(found)}: {found!r}")
    return found


def _types_of(mesh: Mesh, spec: PartitionSpec, ndim: int) -> tuple[AxisType, ...]:
    dims = {axis: d - ndim for d, entry in enumerate(spec.entries) for axis in dim_axes(entry)}
    return tuple(AxisType(PARTIAL) if axis in spec.partial else AxisType(VARYING, dims[axis]) if axis in dims
                 else AxisType(INVARIANT) for axis in mesh.axis_names)


def _local(device_mesh: Any, mesh: Mesh, spec: PartitionSpec, want: tuple[Any, ...], value: Any,
           index: int) -> torch.Tensor:
    if isinstance(value, DTensor):
        if value.device_mesh is not device_mesh or tuple(value.placements) != want:
            raise ValueError(f"input {index}: expected a DTensor on ctx.device_mesh(mesh) with placements {want} "
                             f"(in_specs[{index}] = {spec!r}), but got {tuple(value.placements)}; redistribute it")
        return value.to_local()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"input {index}: expected a tensor (a DTensor or this rank's block), but got {value!r}")
    check_spec(mesh, spec, value.dim(), f"in_specs[{index}]")
    return value


def shard_map(f: Callable[..., Any], *, mesh: Mesh, in_specs: PartitionSpec | Sequence[PartitionSpec],
              out_specs: PartitionSpec | Sequence[PartitionSpec], ctx: Context, check: bool = True,
              names: Sequence[str] = ()) -> Callable[..., Any]:
    """``f(ax, *blocks)`` on every rank as a function of global tensors (JAX's ``shard_map``).

    Inputs are DTensors on ``ctx.device_mesh(mesh)`` or this rank's blocks, one ``in_specs`` entry each; the
    outputs (one tensor, or a tuple) come back as DTensors per ``out_specs``. ``names`` name the inputs in
    error messages (default ``input 0``, ...).

    >>> import fmesh, torch
    >>> from fmesh.spmd import P
    >>> with fmesh.Context.fake(2) as ctx:
    ...     mesh = fmesh.make_mesh((2,), ("tp",))
    ...     total = shard_map(lambda ax, x: ax.psum(x, "tp"), mesh=mesh, in_specs=P(partial="tp"),
    ...                       out_specs=P(), ctx=ctx)
    ...     total(torch.ones(3)).shape
    torch.Size([3])
    >>> with fmesh.Context.fake(2) as ctx:
    ...     mesh = fmesh.make_mesh((2,), ("tp",))
    ...     shard_map(lambda ax, x: x.exp(), mesh=mesh, in_specs=P(partial="tp"), out_specs=P(), ctx=ctx,
    ...               names=["x"])(torch.ones(3))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: exp on x (shape rank 1), which is partial along 'tp': a non-linear operation ... before it
    """
    # Values made here, not in the region: a compiled region only reads them. The exported DeviceMesh too: its
    # lookup hashes the mesh's layouts, which Dynamo before torch 2.13 cannot do (a user-defined __hash__).
    plain, ins, outs = Axes(ctx, mesh), _specs(in_specs, None, "in_specs"), _specs(out_specs, None, "out_specs")
    placed_in = [to_placements(Sharding(mesh, spec)) for spec in ins]
    placed_out = [to_placements(Sharding(mesh, spec)) for spec in outs]
    exported = [ctx.device_mesh(mesh)]

    def region(*args: Any) -> Any:
        if not compiling():  # eager: the context's export now (the same object, unless the context changed it)
            exported[0] = ctx.device_mesh(mesh)
        device_mesh = exported[0]
        specs = _specs(ins, len(args), "in_specs")
        blocks = [_local(device_mesh, mesh, s, p, a, i)
                  for i, (s, p, a) in enumerate(zip(specs, placed_in, args, strict=True))]
        if not check or compiling():
            out = f(plain, *blocks)
            return _assemble(device_mesh, mesh, outs, placed_out, out, None)
        types = Types(mesh)
        for i, (spec, block) in enumerate(zip(specs, blocks, strict=True)):
            types.set(block, _types_of(mesh, spec, block.dim()), names[i] if i < len(names) else f"input {i}")
        with types:
            out = f(Axes(ctx, mesh, types), *blocks)
        return _assemble(device_mesh, mesh, outs, placed_out, out, types)
    return region


def _assemble(device_mesh: Any, mesh: Mesh, out_specs: tuple[PartitionSpec, ...], placed: list[tuple[Any, ...]],
              out: Any, types: Types | None) -> Any:
    single = isinstance(out, torch.Tensor)
    values = (out,) if single else tuple(out)
    specs = _specs(out_specs, len(values), "out_specs")
    results = []
    for i, (spec, placements, value) in enumerate(zip(specs, placed, values, strict=True)):
        check_spec(mesh, spec, value.dim(), f"out_specs[{i}]")
        if types is not None:
            operand = types.operand(value)
            dims = {axis: d - value.dim() for d, entry in enumerate(spec.entries) for axis in dim_axes(entry)}
            try:  # a psum of the members' means left undivided: named with the count over all its axes
                means_summed("return", [operand], [], mesh.axis_names, types.sizes)
            except SpmdTypeError as error:
                raise SpmdTypeError(f"out_specs[{i}] = {spec!r}, output {i}: {error}") from None
            for axis, found in zip(mesh.axis_names, operand.types, strict=True):
                try:
                    check_output(dims, spec.partial, axis, operand.name, found, value.dim(),
                                 mesh.shape[axis])
                except SpmdTypeError as error:
                    raise SpmdTypeError(f"out_specs[{i}] = {spec!r}, output {i}: {error}") from None
        results.append(DTensor.from_local(value, device_mesh, placements, run_check=False))
    return results[0] if single else tuple(results)
