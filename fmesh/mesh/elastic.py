"""Elastic meshes: the mesh after ranks are lost or join, as a pure value in a new universe.

:func:`without` drops every slice along one axis that holds a lost rank; :func:`resize` makes an
axis smaller (dropping its last coordinates) or larger (adding coordinates for joining ranks). Both return
the same axes over a new universe whose :class:`~fmesh.mesh.lineage.Lineage` says where each slot
came from, so :func:`old_rank` and :func:`new_rank` convert a rank between the two numberings.

New numbering: the ranks that remain, in ascending order of their old rank, are ``0, 1, ...``; the
ranks a join adds come after them, in slot order. So a loss renumbers the survivors as a restarted
job would, and a join keeps every old rank's number (the universe's rank map puts the newcomers
where the larger mesh has them).

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 4, 2), ("dp_replicate", "dp_shard", "tp"))
>>> smaller = fmesh.without(mesh, [5], "dp_replicate")
>>> smaller, smaller.group(3, "tp"), fmesh.old_rank(smaller, 3), fmesh.new_rank(smaller, 5)
(Mesh(dp_replicate=1, dp_shard=4, tp=2; world=8), (2, 3), 11, None)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate

import attrs

from fmesh.layout.int_tuple import is_int, is_many
from fmesh.layout.layout import Layout
from fmesh.mesh.lineage import Lineage
from fmesh.mesh.mesh import Mesh
from fmesh.mesh.universe import Universe

__all__ = ["new_rank", "old_rank", "resize", "without"]


def without(mesh: Mesh, ranks: Iterable[int], axis: str) -> Mesh:
    """The mesh over the ranks left when every slice along ``axis`` that holds one of ``ranks`` is dropped.

    A slice along ``axis`` is every rank of the universe at one coordinate of ``axis``; the axis
    loses one coordinate per distinct coordinate of ``ranks``, every other axis keeps its size, and
    the survivors are renumbered ``0, 1, ...`` in ascending order of their old rank.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((4, 2), ("dp", "tp"))
    >>> smaller = fmesh.without(mesh, [2, 3, 7], "dp")
    >>> smaller, smaller.groups("dp"), [fmesh.old_rank(smaller, r) for r in range(4)]
    (Mesh(dp=2, tp=2; world=4), ((0, 2), (1, 3)), [0, 1, 4, 5])
    """
    position = _check_mesh(mesh, axis)
    if not is_many(ranks):
        raise TypeError(f"without takes an iterable of ranks such as [5], got {ranks!r}")
    ranks = tuple(ranks)
    size = mesh.axis_sizes[position]
    dropped = set()
    for rank in ranks:
        mesh.universe.check_rank(rank)
        coordinate = mesh.coordinate(rank)
        if coordinate is None:
            raise ValueError(
                f"rank {rank} is not covered by {mesh!r}, so it has no coordinate along {axis!r}; "
                f"give ranks the mesh covers, or apply without() to the mesh select() was applied to"
            )
        dropped.add(coordinate[position])
    kept = tuple(c for c in range(size) if c not in dropped)
    if not kept:
        raise ValueError(
            f"without({sorted(ranks)!r}, {axis!r}) would drop every coordinate of axis {axis!r} "
            f"(size {size}) and leave no rank; at least one slice along {axis!r} must keep all its ranks"
        )
    return _change(mesh, position, kept)


def resize(mesh: Mesh, axis: str, size: int) -> Mesh:
    """``mesh`` with axis ``axis`` of size ``size``: a smaller size drops its last coordinates, a
    larger one adds new ones after the old (the ranks that join, numbered after the old ranks, which keep theirs).

    A size-1 axis has no stride of its own; a join places it as :func:`fmesh.make_mesh` would:
    just inside the nearest earlier axis (in the mesh's order) of size > 1, or outermost.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    >>> larger = fmesh.resize(mesh, "dp", 3)
    >>> larger.groups("dp"), fmesh.new_rank(larger, 3), fmesh.old_rank(larger, 5)
    (((0, 2, 4), (1, 3, 5)), 3, None)
    >>> fmesh.resize(larger, "dp", 2) == mesh
    True
    """
    position = _check_mesh(mesh, axis)
    if not is_int(size) or size < 1:
        raise ValueError(f"resize({axis!r}, {size!r}): expected a positive int size for axis {axis!r}, got {size!r}")
    old = mesh.axis_sizes[position]
    coordinates = (*range(min(old, size)), *(None for _ in range(size - old)))
    return _change(mesh, position, coordinates)


def old_rank(mesh: Mesh | Universe, rank: int) -> int | None:
    """The rank that ``rank`` (of the universe made by ``without``/``resize``) had before, or ``None``
    for a rank that joined.

    >>> import fmesh
    >>> smaller = fmesh.without(fmesh.make_mesh((3, 2), ("dp", "tp")), [1], "dp")
    >>> [fmesh.old_rank(smaller, r) for r in range(4)]
    [2, 3, 4, 5]
    """
    universe, lineage = _lineage(mesh)
    old = lineage.old_slot(universe.slot_of(rank))
    return None if old is None else lineage.parent.rank_of(old)


def new_rank(mesh: Mesh | Universe, rank: int) -> int | None:
    """The rank that old ``rank`` has in the universe made by ``without``/``resize``, or ``None``
    if it was dropped.

    >>> import fmesh
    >>> smaller = fmesh.without(fmesh.make_mesh((3, 2), ("dp", "tp")), [1], "dp")
    >>> [fmesh.new_rank(smaller, r) for r in range(6)]
    [None, None, 0, 1, 2, 3]
    """
    universe, lineage = _lineage(mesh)
    new = lineage.new_slot(lineage.parent.slot_of(rank))
    return None if new is None else universe.rank_of(new)


def _lineage(mesh: Mesh | Universe) -> tuple[Universe, Lineage]:
    universe = mesh.universe if isinstance(mesh, Mesh) else mesh
    if not isinstance(universe, Universe):
        raise TypeError(f"expected a Mesh or a Universe, but got {mesh!r}")
    if universe.lineage is None:
        raise ValueError(
            f"{universe!r} has no lineage: it was not made by fmesh.without() or fmesh.resize(), "
            "so there is no old numbering to convert from or to"
        )
    return universe, universe.lineage


def _check_mesh(mesh: Mesh, axis: str) -> int:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected a Mesh, but got {mesh!r}")
    position = mesh.axis_index(axis)
    if mesh.frame:
        raise ValueError(
            f"{mesh!r} re-indexes its universe (an unflatten split a strided axis unevenly); "
            "apply without()/resize() to the mesh before that unflatten"
        )
    return position


def _axis_stride(mesh: Mesh, position: int) -> int:
    """The slot stride of the axis at ``position``: its one mode's stride, or for a size-1 axis the
    place :func:`fmesh.make_mesh` would give it (just inside the nearest earlier axis of size > 1)."""
    layout = mesh.layouts[position]
    if len(layout.modes) > 1:
        raise ValueError(
            f"axis {mesh.axis_names[position]!r} is laid out as {layout!r}: its ranks are not one stride apart "
            "(it was flattened from axes that are not adjacent, or not in the mesh's order), so changing its "
            "size leaves no layout; change one of the axes it was flattened from instead"
        )
    if layout.modes:
        return layout.modes[0][1]
    earlier = [lay for lay in mesh.layouts[:position] if lay.modes]
    stride = min(d for _, d in earlier[-1].modes) if earlier else mesh.world_size
    modes = [mode for lay in (*mesh.layouts, mesh.pinned) for mode in lay.modes]
    if any(d < stride < s * d for s, d in modes):
        raise ValueError(
            f"axis {mesh.axis_names[position]!r} has size 1 and the nearest earlier axis does not say where "
            f"it lies in {mesh!r}; resize it in a mesh whose axes are in row-major order (as make_mesh builds)"
        )
    return stride


def _change(mesh: Mesh, position: int, coordinates: tuple[int | None, ...]) -> Mesh:
    """``mesh`` with the axis at ``position`` keeping these old coordinates (``None``: new ones)."""
    stride = _axis_stride(mesh, position)
    old_size, new_size = mesh.axis_sizes[position], len(coordinates)
    lineage = Lineage(mesh.universe, mesh.axis_names[position], stride, old_size, coordinates)

    def restride(layout: Layout) -> Layout:
        # Digits above the axis move by the change of its extent; digits below it stay.
        if all(d < stride for _, d in layout.modes):
            return layout
        modes = tuple((s, d if d < stride else d // old_size * new_size) for s, d in layout.modes)
        return Layout(tuple(s for s, _ in modes), tuple(d for _, d in modes))

    layouts = [restride(lay) for lay in mesh.layouts]
    layouts[position] = Layout(new_size, stride)
    high, low = divmod(mesh.offset, old_size * stride)  # the offset has no digit along the axis
    universe = Universe(
        lineage.world_size, _rank_map(lineage), mesh.universe.device_type, lineage=lineage
    )
    return attrs.evolve(
        mesh, universe=universe, layouts=layouts, pinned=restride(mesh.pinned),
        offset=high * new_size * stride + low,
    )


def _rank_map(lineage: Lineage) -> tuple[int, ...] | None:
    """The new universe's rank of each slot: the old ranks that remain, renumbered in ascending order,
    then the new slots' ranks in slot order. ``None`` (the identity) without listing where that is so."""
    parent, stride = lineage.parent, lineage.stride
    grown = any(c is None for c in lineage.coordinates)
    ordered = all(a < b for a, b in zip(lineage.coordinates, lineage.coordinates[1:], strict=False)
                  if a is not None and b is not None)
    outermost = parent.world_size == lineage.old_size * stride
    if parent.is_identity and ordered and (not grown or outermost):
        return None
    old_ranks = parent.rank_map
    # The new slots in order, one block of `stride` slots at a time: old ranks, or None for new slots.
    blocks: list[Sequence[int] | None] = []
    for high in range(parent.world_size // (lineage.old_size * stride)):
        for old in lineage.coordinates:
            start = (high * lineage.old_size + (old or 0)) * stride
            blocks.append(None if old is None else old_ranks[start : start + stride])
    renumber: list[int] | None = None  # None: every old rank remains and keeps its number
    if sum(c is not None for c in lineage.coordinates) < lineage.old_size:
        remains = bytearray(parent.world_size)
        for block in blocks:
            for rank in block or ():
                remains[rank] = 1
        renumber = [0, *accumulate(remains)]  # renumber[r]: how many remaining old ranks are below r
    joined = renumber[-1] if renumber else parent.world_size  # the first new slot's rank
    ranks: list[int] = []
    for block in blocks:
        if block is None:
            ranks.extend(range(joined, joined + stride))
            joined += stride
        else:
            ranks.extend(block if renumber is None else (renumber[rank] for rank in block))
    return tuple(ranks)
