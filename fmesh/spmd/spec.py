"""Partition specs and shardings over fmesh meshes, as pure values (JAX's ``P`` and ``NamedSharding``).

A spec says, per tensor dimension, which mesh axes split it: an axis name, a tuple of axes (the first the
major one), or ``None`` (not split). A sharding is a mesh and a spec; from it come a rank's block of a tensor and
its local shape. No ``torch.distributed`` here: a notebook on a laptop can draw a sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from fmesh.mesh import Mesh

Entry = str | tuple[str, ...] | None


def _entry(entry: Any) -> Entry:
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        names = tuple(entry)
        return None if not names else names[0] if len(names) == 1 else names
    raise TypeError(f"a spec entry is an axis name, a tuple of axis names or None, but got {entry!r}")


@attrs.frozen(init=False, repr=False)
class PartitionSpec:
    """Per tensor dimension, the mesh axes that split it (JAX's ``PartitionSpec``; ``P`` for short).

    >>> PartitionSpec("dp", None, ("tp", "cp"))
    P('dp', None, ('tp', 'cp'))
    >>> P("dp").axes
    ('dp',)
    >>> P(None, "tp", reduced="dp")
    P(None, 'tp', reduced=('dp',))

    ``partial``: the mesh axes along which the value is a pending sum (DTensor's ``Partial``; JAX's
    ``unreduced``). ``reduced`` (an input's spec only; JAX's ``reduced``): axes along which the value is the same
    on every member, but its gradient is left a pending sum (no collective in the backward): gradient
    accumulation over micro-batches then costs one reduction, where the gradient is used.
    """

    entries: tuple[Entry, ...]
    partial: tuple[str, ...]
    reduced: tuple[str, ...]

    def __init__(self, *entries: Any, partial: Sequence[str] = (), reduced: Sequence[str] = ()) -> None:
        if isinstance(partial, str):
            partial = (partial,)
        if isinstance(reduced, str):
            reduced = (reduced,)
        self.__attrs_init__(tuple(_entry(e) for e in entries), tuple(partial), tuple(reduced))

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis that splits a dimension, in order (partial axes not included)."""
        return tuple(a for e in self.entries for a in dim_axes(e))

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        inner = ", ".join(repr(e) for e in self.entries)
        if self.partial:
            inner += (", " if inner else "") + f"partial={self.partial!r}"
        if self.reduced:
            inner += (", " if inner else "") + f"reduced={self.reduced!r}"
        return f"P({inner})"


P = PartitionSpec


def dim_axes(entry: Entry) -> tuple[str, ...]:
    """The axes of one spec entry, major first.

    >>> dim_axes(None), dim_axes("tp"), dim_axes(("dp", "tp"))
    ((), ('tp',), ('dp', 'tp'))
    """
    return () if entry is None else (entry,) if isinstance(entry, str) else entry


def check_spec(mesh: Mesh, spec: PartitionSpec, ndim: int | None = None, what: str = "spec") -> PartitionSpec:
    """``spec`` if it fits ``mesh`` (and a tensor of ``ndim`` dimensions), else a ``ValueError`` naming the fault.

    >>> import fmesh
    >>> check_spec(fmesh.make_mesh((2, 2), ("dp", "tp")), P("x"))
    Traceback (most recent call last):
    ...
    ValueError: spec P('x'): expected one of the mesh's axes ('dp', 'tp'), but got 'x'
    """
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"{what}: expected a PartitionSpec (fmesh.spmd.P(...)), but got {spec!r}")
    seen: set[str] = set()
    for axis in spec.axes + spec.partial + spec.reduced:
        if axis not in mesh.axis_names:
            raise ValueError(f"{what} {spec!r}: expected one of the mesh's axes {mesh.axis_names}, but got {axis!r}")
        if axis in seen:
            raise ValueError(f"{what} {spec!r}: expected each axis at most once, but got {axis!r} twice")
        seen.add(axis)
    if ndim is not None and len(spec) > ndim:
        raise ValueError(
            f"{what} {spec!r}: expected at most {ndim} entries (one per tensor dimension), but got {len(spec)}")
    return spec


@attrs.frozen
class Sharding:
    """A mesh and a spec (JAX's ``NamedSharding``): how a global tensor lies on the mesh's ranks.

    >>> import fmesh
    >>> s = Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P("dp", "tp"))
    >>> s.local_shape((8, 6)), s.block(3, (8, 6))
    ((4, 3), ((4, 8), (3, 6)))
    """

    mesh: Mesh
    spec: PartitionSpec = attrs.field()

    @spec.validator
    def _check(self, _: Any, spec: PartitionSpec) -> None:
        check_spec(self.mesh, spec)

    def split(self, entry: Entry) -> int:
        """How many pieces one spec entry cuts its dimension into."""
        count = 1
        for axis in dim_axes(entry):
            count *= self.mesh.shape[axis]
        return count

    def local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape each rank holds of a global tensor of ``shape`` (each split dimension must divide)."""
        check_spec(self.mesh, self.spec, len(shape))
        local = list(shape)
        for d, entry in enumerate(self.spec.entries):
            n = self.split(entry)
            if shape[d] % n:
                raise ValueError(f"{self.spec!r}: expected dimension {d} (size {shape[d]}) to divide by {n} "
                                 f"(the size of {dim_axes(entry)}), but it does not")
            local[d] = shape[d] // n
        return tuple(local)

    def global_shape(self, local: Sequence[int]) -> tuple[int, ...]:
        """The global shape whose blocks have shape ``local``."""
        check_spec(self.mesh, self.spec, len(local))
        out = list(local)
        for d, entry in enumerate(self.spec.entries):
            out[d] = local[d] * self.split(entry)
        return tuple(out)

    def piece(self, rank: int, d: int) -> int:
        """Which piece of dimension ``d`` ``rank`` holds (0 where the dimension is not split)."""
        coordinate = self.mesh.coordinate(rank)
        if coordinate is None:
            raise ValueError(f"rank {rank} is not covered by {self.mesh!r}")
        index = 0
        entry = self.spec.entries[d] if d < len(self.spec) else None
        for axis in dim_axes(entry):
            index = index * self.mesh.shape[axis] + coordinate[self.mesh.axis_index(axis)]
        return index

    def block(self, rank: int, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The ``(start, stop)`` per dimension of the block of a global tensor of ``shape`` that ``rank`` holds."""
        local = self.local_shape(shape)
        return tuple((self.piece(rank, d) * n, (self.piece(rank, d) + 1) * n) for d, n in enumerate(local))

    def holders(self, shape: Sequence[int]) -> dict[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """Each block of a global tensor of ``shape``, and the ranks that hold it (replicas), in rank order."""
        found: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for rank in self.mesh.group(self.mesh.rank_at(0), self.mesh.axis_names) if self.mesh.size else ():
            found.setdefault(self.block(rank, shape), []).append(rank)
        return {block: tuple(sorted(ranks)) for block, ranks in sorted(found.items())}
