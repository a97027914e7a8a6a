"""Frames: re-indexings of a universe's slots, for splits that cut a strided axis unevenly.

A mesh's layouts map coordinates to *indices*; its ``frame``, a tuple of bijections of
``range(world)``, maps indices to slots: ``slot = frame[0](frame[1](...(index)))``. The frame is
empty for every mesh torch's ``DeviceMesh`` can express; it is needed where a layout cannot say
the groups, because they are no longer translates of one layout.

Worked example: in a 3 x 2 x 2 world, flatten ``(a, c)`` into ``ac = (3, 2):(4, 1)`` (slots
0, 1, 4, 5, 8, 9) and split it into ``p=2, q=3``. ``q`` would need the slots 0, 1, 4 — stride 1
then stride 3 inside a mode of size 2: not a layout. The frame ``to_old = (2, 3, 2):(2, 4, 1)``
(the complement of ``ac`` outermost, then ``ac``) re-indexes the universe so that ``ac`` becomes
the contiguous ``6:1`` and every factorisation of it is a layout again; ``q = 3:1`` in the new
index space reaches old slots 0, 1, 4.

Every function here is a small, pure step over ``(layouts, pinned, offset)``: the axes, the
digits ``select`` fixed, and the base index of the covered instances.

>>> from fmesh.layout import Layout
>>> to_old = reindexing(Layout((3, 2), (4, 1)), 12)
>>> to_old, [to_slot((to_old,), i) for i in (0, 1, 2)]
(Layout((2, 3, 2):(2, 4, 1)), [0, 1, 4])
"""

from __future__ import annotations

from collections.abc import Sequence

from fmesh.layout import flat
from fmesh.layout.layout import Layout, concat, sorted_by_stride

Frame = tuple[Layout, ...]
Placement = tuple[list[Layout], Layout, int]  # layouts, pinned, offset


def check(frame: Frame, world: int) -> None:
    """``ValueError`` unless every frame layout is a bijection of ``range(world)``.

    >>> check((Layout((2, 2), (1, 2)),), 4)
    """
    for layout in frame:
        if layout.size != world or layout.cosize != world or not layout.non_overlapping():
            raise ValueError(f"frame layout {layout!r} is not a bijection of range(0, {world})")


def to_slot(frame: Frame, index: int) -> int:
    """The universe slot of ``index``: apply the frame from the innermost layout out.

    >>> to_slot((Layout((2, 2), (1, 2)),), 1)
    2
    """
    for layout in reversed(frame):
        index = layout(index)
    return index


def to_index(frame: Frame, slot: int) -> int:
    """The index of universe ``slot``: the inverse of :func:`to_slot`.

    >>> to_index((Layout((2, 2), (1, 2)),), 2)
    1
    """
    for layout in frame:
        slot = flat.decompose(layout.modes, slot)[0]
    return slot


def reindexing(axis: Layout, world: int) -> Layout:
    """The frame layout (new index -> old index) under which ``axis`` is contiguous and innermost:
    the complement of ``axis`` varies slowest, then ``axis`` itself.

    >>> reindexing(Layout(2, 4), 8)
    Layout((4, 2):(1, 4))
    """
    return concat(axis.complement(world), axis).coalesce()


def enter(to_old: Layout, placement: Placement) -> Placement:
    """``placement`` (over old indices) re-expressed over the new indices of ``to_old``.

    Raises ``ValueError`` where a layout cannot be expressed there.

    >>> enter(Layout((4, 2), (1, 4)), ([Layout(2, 4)], Layout((), ()), 0))[0]
    [Layout(2:1)]
    """
    to_new = to_old.inverse()
    layouts, pinned, offset = placement
    return [to_new.composition(layout) for layout in layouts], to_new.composition(pinned), to_new(offset)


def leave(frame: Frame, placement: Placement, world: int) -> Placement:
    """``placement`` (over the frame's indices) composed back to universe slots, if the result
    still tiles the universe; ``ValueError`` otherwise (the frame is needed).

    >>> frame = (Layout((4, 2), (1, 4)),)
    >>> leave(frame, ([Layout(2, 1)], Layout((), ()), 0), 8)[0]
    [Layout(2:4)]
    """
    layouts, pinned, offset = placement
    composed = [*layouts, pinned]
    for layout in reversed(frame):
        composed = [layout.composition(part) for part in composed]
        offset = layout(offset)
    flat.complement(tuple(mode for part in composed for mode in part.modes), world)
    return composed[:-1], composed[-1], offset


def express(from_frame: Frame, onto: Frame, placement: Placement) -> Placement:
    """``placement``, over ``from_frame``'s indices, re-expressed over ``onto``'s (for concat).

    Only a frameless placement can move into another frame; ``ValueError`` otherwise.

    >>> express((), (), ([Layout(2, 1)], Layout((), ()), 0))[0]
    [Layout(2:1)]
    """
    if from_frame == onto:
        return placement
    if from_frame:
        raise ValueError("both meshes were re-indexed, by different frames")
    for to_old in onto:  # slot = onto[0](onto[1](...(index))): peel from the outside in
        placement = enter(to_old, placement)
    layouts, pinned, offset = placement
    return layouts, sorted_by_stride(pinned), offset


def axes_modes(layouts: Sequence[Layout]) -> tuple[tuple[int, int], ...]:
    """All flat modes of ``layouts``, in order.

    >>> axes_modes([Layout(2, 4), Layout(4, 1)])
    ((2, 4), (4, 1))
    """
    return tuple(mode for layout in layouts for mode in layout.modes)
