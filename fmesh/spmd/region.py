"""The manual region (JAX's ``shard_map``): a function of local tensors, run on every rank, over named axes.

``shard_map(f, mesh=..., in_specs=..., out_specs=..., ctx=...)`` returns a :class:`Region`: called on DTensors
on ``ctx.device_mesh(mesh)`` (or whole tensors where a spec is ``P()``) it returns DTensors per ``out_specs``;
``region.local(*blocks)`` takes this rank's blocks and returns its local outputs. Either way it calls
``f(ax, *blocks)``, where ``ax`` is an :class:`Axes` whose collectives name mesh axes (``ax.psum(x, "tp")``).
Inputs and outputs may be pytrees (tuples, lists, dicts), the specs a prefix of them.

With ``check=True`` (the default) the region is **checked once per signature** (its inputs' shapes, dtypes and
``requires_grad``): the first call with a new one runs ``f`` on copies of the inputs with rehearsed collectives
(each computed locally at the right shape: no communication) under :mod:`fmesh.spmd.check`, where every aten
call is typed per axis by :mod:`fmesh.spmd.registry`'s rules; a program whose gradient or result would be wrong raises
:class:`~fmesh.errors.SpmdTypeError` there, before any collective. Then, and on every later call, ``f`` runs
unchecked: the steady state costs what ``check=False`` costs. Under ``torch.compile`` the same check runs once
when Dynamo traces the region (on stand-in tensors of the traced shapes), so a compiled region is checked too.
The check also makes every group the region's collectives name (``ctx.materialize``), several axes at once
included, so a region compiled first finds its groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.distributed.tensor import DTensor

from fmesh.context.collectives import compiling
from fmesh.errors import SpmdTypeError
from fmesh.mesh import Mesh
from fmesh.spmd.call import Rule
from fmesh.spmd.check import MemberInt, Types, called
from fmesh.spmd.fix import Fix, text
from fmesh.spmd.placements import grad_placements, to_placements
from fmesh.spmd.rehearsal import Collectives, Rehearsal, random_state_kept
from fmesh.spmd.spec import PartitionSpec, Sharding, check_spec, dim_axes
from fmesh.spmd.trees import broadcast, leaves, rebuild
from fmesh.spmd.types import (
    COMPLETES,
    COPY,
    INV,
    INVARIANT,
    PARTIAL,
    VAR,
    VARYING,
    AxisType,
    Operand,
    check_output,
    gathered,
    means_summed,
)

AxesArg = str | Sequence[str]


def _said(axes: Sequence[str]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


class Axes:
    """What the region's function receives first: its mesh's axes and their collectives.

    Each collective is the context's (``ctx.sum_partials``, ``ctx.all_gather``, ...), so it differentiates and
    compiles like them; while the region is checked, it also checks its operand and types its result.
    """

    def __init__(self, ctx: Collectives, mesh: Mesh, types: Types | None = None) -> None:
        self.ctx, self.mesh, self.types = ctx, mesh, types

    def _axes(self, axes: AxesArg) -> tuple[str, ...]:
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        for name in names:
            if name not in self.mesh.axis_names:
                raise ValueError(f"expected one of the mesh's axes {self.mesh.axis_names}, but got {name!r}")
        return names

    def _run(self, what: str, x: torch.Tensor, axes: tuple[str, ...], becomes: Callable[[AxisType, str], AxisType],
             result: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``result()``; checked, ``x``'s type along each of ``axes`` becomes ``becomes(type, axis)`` (which raises
        for a type the collective refuses), the other axes' types kept."""
        types = self.types
        if types is None:
            return result()
        operand = types.operand(x)
        found = {axis: becomes(operand.types[self.mesh.axis_index(axis)], axis) for axis in axes}
        if operand.types and any(t.kind == INVARIANT and t.mean for t in operand.types):
            means_summed(what, [operand], [], types.axes, types.sizes, tensors=[x])
        types.quiet += 1
        try:
            out = result()
        finally:
            types.quiet -= 1
        new = tuple(found.get(axis, t) for axis, t in zip(self.mesh.axis_names, operand.types, strict=True))
        same = what in ("pvary", "reinterpret")
        types.set(out, new, operand.name if same else called(what, [operand.name, _said(axes)]))
        return out

    def _refuse(self, what: str, x: torch.Tensor, t: AxisType, axis: str, why: str,
                fix: Fix | str) -> SpmdTypeError:
        name = self.types.operand(x).name if self.types is not None else "the value"
        record = text(fix) if isinstance(fix, str) else attrs.evolve(fix, value=fix.value or name, target=x)
        return SpmdTypeError.refused(f"{what} of {name}, which is {t!r} along {axis!r}: {why}", record)

    def axis_index(self, axis: str) -> int:
        """This rank's coordinate along ``axis`` (JAX's ``lax.axis_index``); checked, a number marked as differing
        per member, so that what is built from it is typed varying."""
        index = self.ctx.index(self.mesh, self._axes(axis)[0])
        return MemberInt(index, {axis}, (axis, 1, 0)) if self.types is not None else index

    def axis_size(self, axis: AxesArg) -> int:
        """The number of members along ``axis`` (or the product over several)."""
        size = 1
        for name in self._axes(axis):
            size *= self.mesh.shape[name]
        return size

    def psum(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The sum over ``axes`` of a pending sum or of varying values, invariant along them; the gradient passes
        unchanged (``ctx.sum_partials``)."""
        names = self._axes(axes)

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == INVARIANT:
                raise self._refuse("psum", x, t, axis, "it is already the same on every member (reduced); a second "
                                   "sum multiplies it by the axis size", Fix("drop", "psum"))
            if t.kind == PARTIAL and t.pending in ("max", "min"):
                raise self._refuse("psum", x, t, axis, f"the sum of a pending {t.pending}",
                                   Fix("replace", f"p{t.pending}", axes=(axis,), where="psum"))
            if t.kind == VARYING and t.copy:
                raise self._refuse("psum", x, t, axis, "the members' values are alike (gathered or pvary-ed): their "
                                   "sum is the axis size times the value", Fix("drop", "psum", note=(
                                       "(or scale it by ax.axis_size)")))
            if t.kind == VARYING and t.dim is not None and not (t.strided or t.extent):
                pending = [a for a, o in zip(self.mesh.axis_names, self.types.operand(x).types, strict=True)
                           if o.kind == PARTIAL and o.pending == "sum" and a not in names] if self.types else []
                raise self._refuse("psum", x, t, axis, f"it is split along {axis!r} at dimension {t.dim}: the sum "
                                   "adds the members' different blocks elementwise",
                                   Fix("replace", "psum", axes=(pending[0],), where="psum", note="(the axis it is "
                                       "a pending sum along)") if pending else
                                   f"ax.all_gather(..., {axis!r}, dim={t.dim}) for the whole, or reduce dimension "
                                   f"{t.dim} first")
            return AxisType(INVARIANT, mean=t.kind == PARTIAL and t.pending == "mean")
        return self._run("psum", x, names, becomes, lambda: self.ctx.sum_partials(x, self.mesh, names))

    def pmean(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The mean over ``axes`` of a pending mean (a mean along a split dimension, a loss averaged over a split
        batch) or of varying values (:meth:`psum` divided by their size)."""
        names = self._axes(axes)

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == PARTIAL and t.pending != "mean":
                raise self._refuse("pmean", x, t, axis, f"the mean of a pending {t.pending} divides it by the axis "
                                   "size", Fix("replace", COMPLETES[t.pending], axes=(axis,), where="pmean",
                                               note="(or divide by the whole's count yourself)"))
            if t.kind == INVARIANT:
                raise self._refuse("pmean", x, t, axis, "it is already the same on every member; its value stays, "
                                   "but its gradient is divided by the axis size", Fix("drop", "pmean"))
            return INV
        size = self.axis_size(names)
        return self._run("pmean", x, names, becomes,
                         lambda: self.ctx.sum_partials(x, self.mesh, names) / size)

    def _extreme(self, op: str, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        names = self._axes(axes)

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == PARTIAL and t.pending != op:
                raise self._refuse(f"p{op}", x, t, axis, f"the {op} of each member's part is not the {op} of the "
                                   f"pending {t.pending}", Fix("replace", COMPLETES[t.pending], axes=(axis,),
                                                               where=f"p{op}"))
            return INV
        return self._run(f"p{op}", x, names, becomes, lambda: self.ctx.all_reduce(x, self.mesh, names, op=op))

    def pmax(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The elementwise max over ``axes`` (of a pending max, or varying values); no gradient (detach first)."""
        return self._extreme("max", x, axes)

    def pmin(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """The elementwise min over ``axes`` (of a pending min, or varying values); no gradient (detach first)."""
        return self._extreme("min", x, axes)

    def pvary(self, x: torch.Tensor, axes: AxesArg) -> torch.Tensor:
        """``x`` itself, from now on varying along ``axes``; its gradient is summed over them (``sum_gradients``)."""
        names = self._axes(axes)

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == VARYING:
                raise self._refuse("pvary", x, t, axis, "it already varies, its gradient is already each member's "
                                   "own; a second pvary sums the gradient twice", Fix("drop", "pvary"))
            if t.kind == PARTIAL:
                raise self._refuse("pvary", x, t, axis, "a pending sum", Fix("replace", COMPLETES[t.pending],
                                                                             axes=(axis,), where="pvary"))
            return COPY
        return self._run("pvary", x, names, becomes, lambda: self.ctx.sum_gradients(x, self.mesh, names))

    def _gathering(self, x: torch.Tensor, names: tuple[str, ...], dim: int) -> None:
        """Refuse a tiled gather at a dimension other than the one its axis splits."""
        if self.types is None:
            return
        operand = self.types.operand(x)
        d = dim - x.dim() if dim >= 0 else dim
        split: dict[int, list[str]] = {}
        for axis, found in zip(self.mesh.axis_names, operand.types, strict=True):
            if found.kind == VARYING and found.dim is not None:
                split.setdefault(found.dim, []).append(axis)
        for axis in names:
            gathered(axis, self.mesh.axis_index(axis), operand, d, split)

    def _nested(self, out: torch.Tensor, names: tuple[str, ...], dim: int) -> torch.Tensor:
        """After a gather along ``names`` at ``dim``: another axis that split that dimension too now holds pieces
        of it that are not its blocks in order (strided)."""
        if self.types is not None:
            record = self.types.operand(out)
            d = dim - out.dim() if dim >= 0 else dim
            new = tuple(attrs.evolve(t, strided=True) if axis not in names and t.kind == VARYING and t.dim == d
                        else t for axis, t in zip(self.mesh.axis_names, record.types, strict=True))
            self.types.set(out, new, record.name)
        return out

    def _gather_type(self, x: torch.Tensor, tiled: bool, invariant: bool,
                     dim: int = 0) -> Callable[[AxisType, str], AxisType]:
        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == PARTIAL and tiled:
                raise self._refuse("all_gather", x, t, axis, "a pending sum gathered stays unsummed",
                                   Fix("replace", "psum_scatter", axes=(axis,), kwargs=(("dim", dim),),
                                       where="all_gather", note="(a reduce_scatter), or ax.psum(...) first (or "
                                       "tiled=False to stack the members' parts)"))
            if t.kind == INVARIANT:
                raise self._refuse("all_gather", x, t, axis, "it is already the same on every member; gathering "
                                   "copies it once per member", Fix("drop", "all_gather", note="(or slice it)"))
            return INV if invariant else COPY
        return becomes

    def all_gather(self, x: torch.Tensor, axis: AxesArg, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """Every member's ``x`` along ``dim`` (stacked on a new ``dim`` unless ``tiled``); the result varies and its
        backward is a reduce_scatter (Megatron's sequence-parallel gather)."""
        names = self._axes(axis)
        if tiled:
            self._gathering(x, names, dim)

        def gather() -> torch.Tensor:
            return self.ctx.all_gather(x if tiled else x.unsqueeze(dim), self.mesh, names, dim)
        out = self._run("all_gather", x, names, self._gather_type(x, tiled, False, dim), gather)
        return self._nested(out, names, dim) if tiled else out

    def all_gather_invariant(self, x: torch.Tensor, axis: AxesArg, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """Every member's ``x`` along ``dim``, invariant: its backward keeps this member's slice, no collective."""
        names = self._axes(axis)
        size, index = self.axis_size(names), self.ctx.index(self.mesh, names)
        if tiled:
            self._gathering(x, names, dim)

        def gather() -> torch.Tensor:
            block = x if tiled else x.unsqueeze(dim)
            whole = self.ctx.all_gather(block.detach(), self.mesh, names, dim)
            if not (x.requires_grad and torch.is_grad_enabled()):
                return whole
            return _Sliced.apply(block, whole, dim, index, size)
        out = self._run("all_gather_invariant", x, names, self._gather_type(x, tiled, True, dim), gather)
        return self._nested(out, names, dim) if tiled else out

    def psum_scatter(self, x: torch.Tensor, axis: AxesArg, dim: int = 0, tiled: bool = True) -> torch.Tensor:
        """The sum over ``axis``, this member keeping its block of ``dim`` (a reduce_scatter); varying."""
        names = self._axes(axis)
        ndim = x.dim() - (0 if tiled else 1)
        d = dim if dim >= 0 else dim + x.dim()

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == INVARIANT:
                name = self.types.operand(x).name if self.types is not None else ""
                raise self._refuse("psum_scatter", x, t, axis, "it is already reduced (the same on every member)",
                                   Fix("drop", "psum", name, made=True, note="(or slice it)")
                                   if name.startswith("psum(") else "slice it")
            if t.kind == PARTIAL and t.pending != "sum":
                raise self._refuse("psum_scatter", x, t, axis, f"the sum-scatter of a pending {t.pending}",
                                   Fix("replace", COMPLETES[t.pending], axes=(axis,), where="psum_scatter"))
            if t.kind == VARYING and t.dim == d - x.dim():
                raise self._refuse("psum_scatter", x, t, axis, f"it is split at dimension {t.dim} already",
                                   "scatter another dimension, or all_gather it first")
            return AxisType(VARYING, d - ndim)

        def scatter() -> torch.Tensor:
            out = self.ctx.reduce_scatter(x, self.mesh, names, d)
            return out if tiled else out.squeeze(d)
        return self._run("psum_scatter", x, names, becomes, scatter)

    def ppermute(self, x: torch.Tensor, axis: str, perm: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``ctx.ppermute`` along ``axis``: varies along it. A pending sum stays one under a whole permutation (a
        ring reduce-scatter moves partial accumulators)."""
        names = self._axes(axis)
        size = self.axis_size(names)
        whole = sorted(s for s, _ in perm) == sorted(d for _, d in perm) == list(range(size))

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind == PARTIAL:
                if not whole:
                    raise self._refuse("ppermute", x, t, axis, "a member that receives nothing gets zeros, so the "
                                       "pending sum loses the parts not sent", Fix("insert", "psum", axes=(axis,),
                                                                                   note="(or permute all)"))
                return t
            # another member's block: a partition of the dimension, not in the spec's order
            return AxisType(VARYING, t.dim, strided=True) if t.kind == VARYING and t.dim is not None else VAR
        return self._run("ppermute", x, names, becomes, lambda: self.ctx.ppermute(x, self.mesh, names[0], perm))

    def all_to_all(self, x: torch.Tensor, axis: AxesArg, split_dim: int, concat_dim: int) -> torch.Tensor:
        """JAX's ``all_to_all``: ``x`` cut into chunks along ``split_dim``, chunk j to member j, the chunks received
        joined along ``concat_dim``: a value split at ``concat_dim`` comes out split at ``split_dim``."""
        names = self._axes(axis)
        n = x.dim()
        s, c = (split_dim % n) - n, (concat_dim % n) - n

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind != VARYING or (t.dim is not None and t.dim != c) or t.strided or t.extent:
                swapped = t.kind == VARYING and t.dim == s and not t.strided and not t.extent
                raise self._refuse("all_to_all", x, t, axis, f"all_to_all makes a value split at dimension {c} "
                                   f"split at {s}", Fix("replace", "all_to_all", axes=(axis,), kwargs=(
                                       ("split_dim", c), ("concat_dim", s)), where="all_to_all",
                                       note="(the dimensions swapped)") if swapped else
                                   f"split it at dimension {c} along {axis!r} first")
            return AxisType(VARYING, s) if t.dim is not None else VAR
        return self._run("all_to_all", x, names, becomes,
                         lambda: self.ctx.all_to_all(x, self.mesh, names, split_dim % n, concat_dim % n))

    def reinterpret(self, x: torch.Tensor, axis: str, kind: str, dim: int | None = None,
                    same: bool = False) -> torch.Tensor:
        """``x`` itself, its type along ``axis`` declared ``kind`` (``"invariant"``, ``"varying"``, ``"partial"``) at
        ``dim`` (``same``: varying, but the same values on every member, as a gathered value is): unchecked, the way
        out where the types cannot see a program is right (the blocks a ring all-gather put in order, the
        accumulator a ring reduce-scatter completed). The claim is yours; nothing moves."""
        names = self._axes(axis)
        if kind not in (INVARIANT, VARYING, PARTIAL):
            raise ValueError(f"expected one of 'invariant', 'varying', 'partial', but got {kind!r}")
        d = None if dim is None else (dim % x.dim()) - x.dim()
        declared = AxisType(kind, d if kind == VARYING else None,
                            copy=same and kind == VARYING and d is None)
        return self._run("reinterpret", x, names, lambda t, a: declared, lambda: x.view_as(x))

    def cumsum(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        """The running sum along dimension ``dim``, which ``axis`` splits: each member's running sum plus the
        totals of the members before it (one all_gather of the totals)."""
        names = self._axes(axis)
        d = dim % x.dim()
        index, size = self.ctx.index(self.mesh, names), self.axis_size(names)

        def running() -> torch.Tensor:
            local = x.cumsum(d)
            totals = self.ctx.all_gather(local.narrow(d, x.shape[d] - 1, 1).unsqueeze(0), self.mesh, names, 0)
            before = (torch.arange(size, device=x.device) < index).to(x.dtype)
            return local + (totals * before.view(-1, *[1] * x.dim())).sum(0)

        def becomes(t: AxisType, axis: str) -> AxisType:
            if t.kind != VARYING or t.dim != d - x.dim() or t.strided or t.extent:
                raise self._refuse("cumsum", x, t, axis, f"ax.cumsum is the running sum along the dimension {axis!r} "
                                   "splits in blocks", f"x.cumsum({dim}) where it is not split")
            return t
        return self._run("cumsum", x, names, becomes, running)


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


def _orders(names: Sequence[str]) -> list[tuple[str, ...]]:
    """Every ordering of two or more of ``names``.

    >>> _orders(("dp", "tp"))
    [('dp', 'tp'), ('tp', 'dp')]
    """
    import itertools

    return [order for n in range(2, len(names) + 1) for order in itertools.permutations(names, n)]


def _spec(value: Any) -> bool:
    return isinstance(value, PartitionSpec)


def types_of(mesh: Mesh, spec: PartitionSpec, ndim: int) -> tuple[AxisType, ...]:
    """The per-axis types of an input of ``ndim`` dimensions under ``spec``."""
    dims = {axis: d - ndim for d, entry in enumerate(spec.entries) for axis in dim_axes(entry)}
    return tuple(AxisType(PARTIAL) if axis in spec.partial else AxisType(VARYING, dims[axis]) if axis in dims
                 else COPY if axis in spec.reduced else INV for axis in mesh.axis_names)


def check_outputs(types: Types, mesh: Mesh, specs: Sequence[PartitionSpec], values: Sequence[torch.Tensor]) -> None:
    """Refuse an output whose type its out spec does not describe."""
    for i, (spec, value) in enumerate(zip(specs, values, strict=True)):
        operand: Operand = types.operand(value)
        dims = {axis: d - value.dim() for d, entry in enumerate(spec.entries) for axis in dim_axes(entry)}
        for axis, found in zip(mesh.axis_names, operand.types, strict=True):
            try:
                check_output(dims, spec.partial, axis, operand.name, found, value.dim(), mesh.shape[axis], i, spec,
                             value)
            except SpmdTypeError as error:
                raise SpmdTypeError(f"out_specs[{i}] = {spec!r}, output {i}: {error}", error.fix) from None


class Region:
    """A function of global tensors (DTensors) made of a function of local blocks (see :func:`shard_map`)."""

    def __init__(self, f: Callable[..., Any], mesh: Mesh, in_specs: Any, out_specs: Any, ctx: Collectives,
                 check: bool, names: Sequence[str], rules: Mapping[Any, str | Rule]) -> None:
        self.f, self.mesh, self.ctx, self.check, self.names = f, mesh, ctx, check, tuple(names)
        self.in_specs = (in_specs,) if _spec(in_specs) else tuple(in_specs)
        self.out_specs, self.rules = out_specs, dict(rules)
        self.checked: set[Any] = set()  # the signatures checked
        self.plain = Axes(ctx, mesh)
        # The export looked up here and refreshed in eager calls: a compiled region only reads it (Dynamo before
        # torch 2.13 cannot hash a mesh, a user-defined __hash__).
        device_mesh = getattr(ctx, "device_mesh", None)
        self.exported = device_mesh(mesh) if device_mesh is not None else None
        # Every group a collective can name (one axis, or several up to three), made and looked up now (in eager,
        # every rank alike): a region compiled first cannot while Dynamo traces. Meshes of more axes:
        # ctx.materialize((mesh, axes)) for the tuples of four or more axes the region names.
        if device_mesh is not None and not compiling():
            named = [(name,) for name in mesh.axis_names] + (_orders(mesh.axis_names) if mesh.ndim <= 3 else [])
            ctx.materialize(mesh, *((mesh, axes) for axes in named))
        # Each spec's placements, made here: a compiled region only looks them up (by identity)
        self.placed = [(spec, to_placements(Sharding(mesh, check_spec(mesh, spec))))
                       for spec in leaves(self.in_specs, _spec) + leaves(out_specs, _spec)]
        self.grads = [(spec, grad_placements(Sharding(mesh, spec))) for spec in leaves(self.in_specs, _spec)
                      if spec.reduced]
        for i, spec in enumerate(leaves(out_specs, _spec)):
            if spec.reduced:
                raise ValueError(f"out_specs[{i}] = {spec!r}: reduced= is for inputs (the axes along which an "
                                 "input's gradient is left a pending sum); an output's pending sum is partial=")

        def hook(key: Any) -> bool:  # Dynamo calls it once, with constants, while it traces (see _traced_check)
            self._check_signature(key)
            return True
        self.hook = torch.compiler.assume_constant_result(hook)

    def local(self, *blocks: Any) -> Any:
        """``f`` on this rank's blocks (tensors, or pytrees of them, one per in spec): its local outputs.

        >>> import fmesh, torch
        >>> from fmesh.spmd import P
        >>> with fmesh.Context.fake(2) as ctx:
        ...     mesh = fmesh.make_mesh((2,), ("tp",))
        ...     shard_map(lambda ax, x: ax.psum(x.sum(), "tp"), mesh=mesh, in_specs=P("tp"), out_specs=P(),
        ...               ctx=ctx).local(torch.ones(3))
        tensor(3.)
        """
        specs = broadcast(self.in_specs, blocks, _spec, "in_specs")
        flat = leaves(blocks)
        for i, (spec, block) in enumerate(zip(specs, flat, strict=True)):
            if not isinstance(block, torch.Tensor):
                raise TypeError(f"input {i}: expected a tensor (this rank's block), but got {block!r}")
            check_spec(self.mesh, spec, block.dim(), f"in_specs[{i}]")
        if self.check:
            if compiling():
                self.hook(self._key(flat))
            else:
                self._check_once(blocks, flat, specs)
        return self.f(self.plain, *blocks)

    def __call__(self, *args: Any) -> Any:
        """``f`` on DTensors on ``ctx.device_mesh(mesh)`` (a plain tensor only where its spec is ``P()``: the whole
        is every rank's block); DTensors out, per ``out_specs``."""
        if not compiling():
            self.exported = self.ctx.device_mesh(self.mesh)  # type: ignore[attr-defined]
        device_mesh = self.exported
        specs = broadcast(self.in_specs, args, _spec, "in_specs")
        blocks = [self._block(device_mesh, spec, value, i) for i, (spec, value) in enumerate(zip(
            specs, leaves(args), strict=True))]
        out = self.local(*rebuild(args, blocks))
        values = leaves(out)
        out_specs = broadcast(self._out_prefix(out), out, _spec, "out_specs")
        placed = [DTensor.from_local(v, device_mesh, self._placements(s), run_check=False)
                  for v, s in zip(values, out_specs, strict=True)]
        return rebuild(out, placed)

    def _placements(self, spec: PartitionSpec) -> tuple[Any, ...]:
        return next(placed for known, placed in self.placed if known is spec)

    def _grad_placements(self, spec: PartitionSpec) -> tuple[Any, ...]:
        return next(placed for known, placed in self.grads if known is spec)

    def _out_prefix(self, out: Any) -> Any:
        """The out specs for ``out``: one spec in a one-element sequence stands for a single output."""
        specs = self.out_specs
        if isinstance(out, torch.Tensor) and isinstance(specs, (tuple, list)) and len(specs) == 1:
            return specs[0]
        return specs

    def _block(self, device_mesh: Any, spec: PartitionSpec, value: Any, index: int) -> torch.Tensor:
        want = self._placements(spec)
        if isinstance(value, DTensor):
            if value.device_mesh is not device_mesh or tuple(value.placements) != want:
                raise ValueError(f"input {index}: expected a DTensor on ctx.device_mesh(mesh) with placements {want} "
                                 f"(in_specs[{index}] = {spec!r}), but got {tuple(value.placements)}; redistribute it")
            if spec.reduced:  # its gradient left a pending sum along them (Partial): no collective in the backward
                return value.to_local(grad_placements=self._grad_placements(spec))
            return value.to_local()
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"input {index}: expected a DTensor, but got {value!r}")
        if spec.axes or spec.partial:
            raise TypeError(f"input {index}: expected a DTensor for in_specs[{index}] = {spec!r}, but got a plain "
                            f"tensor of shape {tuple(value.shape)}: is it the whole, or this rank's block? Place the "
                            f"whole with fmesh.spmd.place(t, Sharding(mesh, {spec!r}), ctx), or pass blocks to "
                            "region.local(...)")
        return value

    @staticmethod
    def _key(flat: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        return (torch.is_grad_enabled(), *((tuple(t.shape), str(t.dtype), t.device.type, bool(t.requires_grad))
                                           for t in flat))

    def _check_once(self, blocks: tuple[Any, ...], flat: list[torch.Tensor], specs: list[PartitionSpec]) -> None:
        key = self._key(flat)
        if key in self.checked:
            return
        stand = [t.detach().clone().requires_grad_(t.requires_grad) for t in flat]
        self._rehearse(rebuild(blocks, stand), stand, specs)
        self.checked.add(key)

    def _check_signature(self, key: tuple[Any, ...]) -> None:
        """The check from a signature alone (under Dynamo): stand-in tensors of its shapes."""
        if key in self.checked:
            return
        grad, described = key[0], key[1:]
        g = torch.Generator().manual_seed(0)
        stand = [(torch.randn(shape, generator=g, dtype=getattr(torch, dtype.removeprefix("torch.")))
                  if getattr(torch, dtype.removeprefix("torch.")).is_floating_point else
                  torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch."))))
                 .to(device).requires_grad_(wants) for shape, dtype, device, wants in described]
        with torch.set_grad_enabled(grad):
            self._rehearse(tuple(stand), stand, broadcast(self.in_specs, tuple(stand), _spec, "in_specs"))
        self.checked.add(key)

    def _rehearse(self, blocks: Any, flat: list[torch.Tensor], specs: list[PartitionSpec]) -> None:
        """``f`` on stand-in blocks, every call typed, the collectives rehearsed; then the groups they name made."""
        types = Types(self.mesh, self.rules)
        for i, (spec, block) in enumerate(zip(specs, flat, strict=True)):
            types.set(block, types_of(self.mesh, spec, block.dim()), self.names[i] if i < len(self.names) else
                      f"input {i}")
        rehearsal = Rehearsal(self.ctx)
        devices = sorted({t.device.index or 0 for t in flat if t.device.type == "cuda"})
        calls, ops = types.modes()
        with random_state_kept(devices), calls, ops:
            out = self.f(Axes(rehearsal, self.mesh, types), *blocks)
        values = leaves(out)
        for i, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"output {i}: expected a tensor, but got {value!r}")
        out_specs = broadcast(self._out_prefix(out), out, _spec, "out_specs")
        for i, (spec, value) in enumerate(zip(out_specs, values, strict=True)):
            check_spec(self.mesh, spec, value.dim(), f"out_specs[{i}]")
            operand = types.operand(value)
            try:  # a psum of pending means left undivided: named with the count over all its axes
                means_summed("return", [operand], [], types.axes, types.sizes, tensors=[value])
            except SpmdTypeError as error:
                raise SpmdTypeError(f"out_specs[{i}] = {spec!r}, output {i}: {error}", error.fix) from None
        check_outputs(types, self.mesh, out_specs, values)
        if rehearsal.named:
            self.ctx.materialize(*((self.mesh, axes) for axes in sorted(rehearsal.named)))


def shard_map(f: Callable[..., Any], *, mesh: Mesh, in_specs: Any, out_specs: Any, ctx: Any, check: bool = True,
              names: Sequence[str] = (), rules: Mapping[Any, str | Rule] | None = None) -> Region:
    """``f(ax, *blocks)`` on every rank, as a :class:`Region` (JAX's ``shard_map``).

    ``in_specs``/``out_specs``: one spec per input/output, or a pytree prefix of them. ``names`` name the
    inputs in error messages (default ``input 0``, ...). ``rules``: the rule of an aten op the registry lacks
    (``{torch.ops.aten.foo: "pointwise"}``, see :data:`fmesh.spmd.registry.KINDS`).

    >>> import fmesh, torch
    >>> from fmesh.spmd import P
    >>> with fmesh.Context.fake(2) as ctx:
    ...     mesh = fmesh.make_mesh((2,), ("tp",))
    ...     total = shard_map(lambda ax, x: ax.psum(x, "tp"), mesh=mesh, in_specs=P(partial="tp"),
    ...                       out_specs=P(), ctx=ctx)
    ...     total.local(torch.ones(3)).shape
    torch.Size([3])
    >>> with fmesh.Context.fake(2) as ctx:
    ...     mesh = fmesh.make_mesh((2,), ("tp",))
    ...     shard_map(lambda ax, x: x.exp(), mesh=mesh, in_specs=P(partial="tp"), out_specs=P(), ctx=ctx,
    ...               names=["x"]).local(torch.ones(3))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: exp on x (rank 1), which is partial along 'tp': exp is not linear in a pending sum...
    """
    return Region(f, mesh, in_specs, out_specs, ctx, check, names, rules or {})
