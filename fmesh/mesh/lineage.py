"""Lineage: which slot of the universe before an elastic change each slot of the universe after it was.

:func:`fmesh.without` and :func:`fmesh.resize` change the size of one axis, whose ranks lie one
``stride`` apart in the slots of the old universe. Every old slot reads, in that axis's digits,
``slot = high * (old_size * stride) + coordinate * stride + low`` with ``low < stride``; the new
universe has the same ``high`` and ``low`` digits around a new coordinate. ``coordinates[c]`` says
which old coordinate new coordinate ``c`` keeps, or ``None`` where it is new (the ranks of a join).
Converting a slot either way is three divisions: nothing is listed per rank.

>>> from fmesh.mesh.universe import Universe
>>> lineage = Lineage(Universe(8), "dp", stride=2, old_size=4, coordinates=(0, 2, 3))
>>> lineage.world_size, lineage.old_slot(2), lineage.new_slot(2), lineage.new_slot(3)
(6, 4, None, None)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from fmesh.layout.int_tuple import is_int

if TYPE_CHECKING:
    from fmesh.mesh.universe import Universe


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"Lineage.{attribute.name} must be a positive int, got {value!r}")


def _coordinates(value: Iterable[int | None]) -> tuple[int | None, ...]:
    return tuple(value)


def _inverse(lineage: Lineage) -> tuple[int | None, ...]:
    new: list[int | None] = [None] * lineage.old_size
    for index, old in enumerate(lineage.coordinates):
        if old is not None:
            new[old] = index
    return tuple(new)


@attrs.frozen
class Lineage:
    """How the universe made by one ``without``/``resize`` derives from ``parent``, along ``axis``.

    ``stride`` and ``old_size`` place the axis in ``parent``'s slots; ``coordinates`` has one entry
    per new coordinate along it: the old coordinate it keeps, or ``None`` for a new one. A universe
    made by several changes has a lineage whose ``parent`` has its own: the whole history.

    >>> from fmesh.mesh.universe import Universe
    >>> Lineage(Universe(4), "dp", stride=1, old_size=4, coordinates=(0, 1, 2, 3, None, None)).world_size
    6
    """

    parent: Universe
    axis: str
    stride: int = attrs.field(validator=_positive)
    old_size: int = attrs.field(validator=_positive)
    coordinates: tuple[int | None, ...] = attrs.field(converter=_coordinates)
    _new_coordinates: tuple[int | None, ...] = attrs.field(
        init=False, default=attrs.Factory(_inverse, takes_self=True), eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        if not self.coordinates:
            raise ValueError("a lineage needs at least one new coordinate")
        kept = [c for c in self.coordinates if c is not None]
        if any(not is_int(c) or not 0 <= c < self.old_size for c in kept) or len(set(kept)) != len(kept):
            raise ValueError(
                f"lineage coordinates must be distinct old coordinates in range(0, {self.old_size}) or None, "
                f"got {self.coordinates!r}"
            )
        if self.parent.world_size % (self.old_size * self.stride):
            raise ValueError(
                f"an axis of size {self.old_size} and stride {self.stride} does not fit a universe of "
                f"{self.parent.world_size} ranks"
            )

    @property
    def new_size(self) -> int:
        """The axis's size after the change.

        >>> from fmesh.mesh.universe import Universe
        >>> Lineage(Universe(4), "dp", stride=1, old_size=4, coordinates=(1, 3)).new_size
        2
        """
        return len(self.coordinates)

    @property
    def world_size(self) -> int:
        """How many slots the new universe has.

        >>> from fmesh.mesh.universe import Universe
        >>> Lineage(Universe(8), "tp", stride=1, old_size=2, coordinates=(0,)).world_size
        4
        """
        return self.parent.world_size // self.old_size * self.new_size

    def old_slot(self, slot: int) -> int | None:
        """The parent slot that new ``slot`` was, or ``None`` for a slot added by a join.

        >>> from fmesh.mesh.universe import Universe
        >>> Lineage(Universe(4), "dp", stride=1, old_size=4, coordinates=(1, 3)).old_slot(1)
        3
        """
        return _move(slot, self.stride, (self.new_size, self.old_size), self.coordinates)

    def new_slot(self, slot: int) -> int | None:
        """The new slot of parent ``slot``, or ``None`` where the change dropped it.

        >>> from fmesh.mesh.universe import Universe
        >>> Lineage(Universe(4), "dp", stride=1, old_size=4, coordinates=(1, 3)).new_slot(3)
        1
        """
        return _move(slot, self.stride, (self.old_size, self.new_size), self._new_coordinates)


def _move(slot: int, stride: int, sizes: tuple[int, int], coordinates: tuple[int | None, ...]) -> int | None:
    """``slot`` of a universe where the axis has ``sizes[0]`` coordinates, in the universe where it has
    ``sizes[1]``: the digits above and below the axis stay, its coordinate ``c`` becomes ``coordinates[c]``."""
    high, rest = divmod(slot, sizes[0] * stride)
    coordinate, low = divmod(rest, stride)
    moved = coordinates[coordinate]
    return None if moved is None else (high * sizes[1] + moved) * stride + low
