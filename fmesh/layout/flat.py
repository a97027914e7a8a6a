"""The layout operations on flat modes, ``((size, stride), ...)`` outermost first: the form :class:`Layout`'s
methods use inside and the mesh's hot paths use without making a :class:`Layout` for each step. Each operation
has one name, here and on :class:`Layout` (``flat.coalesce(modes)`` is ``Layout.coalesce`` on a layout's
``modes``).

>>> coalesce(((2, 4), (4, 1))), complement(((4, 2),), 16), decompose(((2, 4),), 13)
(((8, 1),), ((2, 8), (2, 1)), (1, 9))
"""

from __future__ import annotations

__all__ = ["Modes", "coalesce", "complement", "decompose", "nesting_gap", "values"]

Modes = tuple[tuple[int, int], ...]  # flat (size, stride) pairs, outermost first



def coalesce(modes: Modes) -> Modes:
    """Drop size-1 modes and merge an outer mode into its inner neighbour when
    the outer stride is exactly the inner span.

    >>> coalesce(((2, 4), (1, 9), (4, 1)))
    ((8, 1),)
    """
    merged: list[tuple[int, int]] = []
    for size, stride in reversed(modes):  # innermost first
        if size == 1:
            continue
        if merged and merged[-1][0] * merged[-1][1] == stride:
            inner_size, inner_stride = merged[-1]
            merged[-1] = (inner_size * size, inner_stride)
        else:
            merged.append((size, stride))
    return tuple(reversed(merged))



def complement(modes: Modes, size: int, label: str | None = None) -> Modes:
    """Flat modes of the complement of ``modes`` in ``range(size)``, outermost first.

    >>> complement(((4, 2),), 16)
    ((2, 8), (2, 1))
    """
    gap = nesting_gap(modes)
    if gap is not None:
        stride, span = gap
        raise ValueError(
            f"{label or modes} overlaps itself: a mode of stride {stride} falls inside "
            f"the span {span} of the smaller modes; strides must be multiples of that span"
        )
    holes: list[tuple[int, int]] = []
    covered = 1
    for stride, mode_size in sorted((d, s) for s, d in modes if s > 1):
        if stride > covered:
            holes.append((stride // covered, covered))
        covered = stride * mode_size
    if size % covered != 0:
        raise ValueError(
            f"{label or modes} spans {covered} values, which does not divide {size}; "
            f"the size must be a multiple of {covered}"
        )
    if size > covered:
        holes.append((size // covered, covered))
    return tuple(reversed(holes))



def decompose(modes: Modes, value: int) -> tuple[int, int]:
    """:meth:`~fmesh.layout.Layout.decompose` on flat modes: ``(row-major index along modes, rest)``.

    >>> decompose(((2, 4),), 13)
    (1, 9)
    """
    index = 0
    rest = value
    for size, stride in modes:
        digit = (value // stride) % size if stride else 0
        index = index * size + digit
        rest -= digit * stride
    return index, rest



def values(base: int, modes: Modes) -> list[int]:
    """``base + layout(i)`` for every index ``i`` of a layout with these modes, in order.

    >>> values(10, ((2, 4), (2, 1)))
    [10, 11, 14, 15]
    """
    values = [base]
    for size, stride in modes:
        values = [v + c * stride for v in values for c in range(size)]
    return values



def nesting_gap(modes: Modes) -> tuple[int, int] | None:
    """The first ``(stride, span)`` pair that breaks nesting (a mode whose stride is not a multiple of the span of
    the smaller modes), or ``None``: :meth:`~fmesh.layout.Layout.non_overlapping` on flat modes.

    >>> nesting_gap(((2, 2), (2, 1))), nesting_gap(((2, 1), (2, 1)))
    (None, (1, 2))
    """
    span = 1
    for stride, size in sorted((d, s) for s, d in modes if s > 1):
        if stride == 0 or stride % span != 0:
            return stride, span
        span = stride * size
    return None
