"""CuTe-style integer layouts, lexicographic (row-major) like PyTorch.

A :class:`Layout` is a function from indices to integers given by a ``shape``
and a ``stride`` of the same nesting structure: index ``i`` is split into a
row-major coordinate of ``shape`` (last entry fastest), and the value is the dot
product of that coordinate with ``stride``. Layouts are how fmesh writes down
which ranks sit where, without ever listing them.

This is NVIDIA CuTe's algebra (coalesce, composition, complement) re-derived for
row-major order: CuTe itself is column-major (first entry fastest), so the
algorithms below walk modes from the innermost (last) one outwards.

>>> layout = Layout((2, 4))           # a contiguous 2 x 4 grid
>>> layout.stride, layout(5), layout.size, layout.cosize
((4, 1), 5, 8, 8)
>>> Layout((2, 4), (1, 2))(5)         # the transposed grid
3
"""

from __future__ import annotations

from typing import Any, cast

import attrs

from fmesh.layout import flat
from fmesh.layout.flat import Modes
from fmesh.layout.int_tuple import (
    IntTuple,
    congruent,
    flatten,
    is_int,
    is_int_tuple,
    product,
    row_major_coordinate,
    suffix_product,
)


def _to_int_tuple(value: Any) -> Any:
    """Accept lists for convenience; the validators check what comes out."""
    if isinstance(value, (list, tuple)):
        return tuple(_to_int_tuple(v) for v in value)
    return value


def _check_shape(instance: Layout, attribute: attrs.Attribute[Any], shape: Any) -> None:
    if not is_int_tuple(shape):
        raise TypeError(f"Layout shape must be an int or a nested tuple of ints, got {shape!r}")
    if any(s < 1 for s in flatten(shape)):
        raise ValueError(f"Layout shape entries must be positive integers, got {shape!r}")


def _check_stride(instance: Layout, attribute: attrs.Attribute[Any], stride: Any) -> None:
    if not is_int_tuple(stride):
        raise TypeError(f"Layout stride must be an int or a nested tuple of ints, got {stride!r}")
    if not congruent(instance.shape, stride):
        raise ValueError(
            f"Layout stride {stride!r} must have the same structure as shape {instance.shape!r}"
        )
    if any(d < 0 for d in flatten(stride)):
        raise ValueError(f"Layout stride entries must be non-negative integers, got {stride!r}")


def _default_stride(layout: Layout) -> IntTuple:
    return suffix_product(layout.shape)


def _flat_modes(layout: Layout) -> Modes:
    # attrs runs this default before the validators: a stride of another structure is reported by
    # _check_stride, so do not fail here on lengths.
    return tuple(zip(flatten(layout.shape), flatten(layout.stride), strict=False))


@attrs.frozen(repr=False)
class Layout:
    """An integer layout ``shape:stride``; ``stride`` defaults to row-major compact.

    >>> Layout((2, 3))
    Layout((2, 3):(3, 1))
    >>> Layout(((2, 2), 4), ((8, 1), 2)).size
    16
    """

    shape: IntTuple = attrs.field(converter=_to_int_tuple, validator=_check_shape)
    stride: IntTuple = attrs.field(
        default=attrs.Factory(_default_stride, takes_self=True),
        converter=_to_int_tuple,
        validator=_check_stride,
    )

    # Derived once: every query walks these flat modes.
    _modes: Modes = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_flat_modes, takes_self=True)
    )

    def __repr__(self) -> str:
        return f"Layout({self.shape}:{self.stride})"

    @property
    def modes(self) -> Modes:
        """The flat ``(size, stride)`` pairs, outermost first.

        >>> Layout(((2, 3), 4)).modes
        ((2, 12), (3, 4), (4, 1))
        """
        return self._modes

    @property
    def size(self) -> int:
        """Number of indices (the product of the shape).

        >>> Layout((2, 3), (1, 2)).size
        6
        """
        return product(self.shape)

    @property
    def cosize(self) -> int:
        """One past the largest value the layout takes.

        >>> Layout((2, 3), (1, 2)).cosize
        6
        """
        return 1 + sum((s - 1) * d for s, d in self.modes)

    def __call__(self, index: IntTuple) -> int:
        """The value at a linear index, or at a coordinate congruent to the top level.

        >>> Layout((2, 4), (1, 2))(5), Layout((2, 4), (1, 2))((1, 1))
        (3, 3)
        """
        return _evaluate(self.shape, self.stride, index)

    def coalesce(self) -> Layout:
        """The same function on ``range(size)`` with the fewest flat modes.

        >>> Layout((2, 1, 4), (4, 7, 1)).coalesce()
        Layout((8,):(1,))
        """
        modes = flat.coalesce(self._modes)
        if self.shape == tuple(s for s, _ in modes) and self.stride == tuple(d for _, d in modes):
            return self  # already flat and coalesced: values are immutable, share it
        return from_modes(modes)

    def composition(self, other: Layout) -> Layout:
        """``self ∘ other``: the layout ``i -> self(other(i))``, shaped like ``other``.

        ``other`` must map into ``range(self.size)``. Raises ``ValueError`` when
        the result is not a layout (the strides of ``other`` cut across the
        modes of ``self`` unevenly).

        >>> Layout((2, 4)).composition(Layout(4, 2))
        Layout(4:2)
        >>> Layout((4, 2), (1, 4)).composition(Layout((2, 4)))
        Layout((2, (2, 2)):(2, (1, 4)))
        """
        if other.cosize > self.size:
            raise ValueError(
                f"cannot compose {self!r} with {other!r}: it reaches index {other.cosize - 1}, "
                f"but {self!r} has only {self.size} indices"
            )
        outer = flat.coalesce(self.modes)
        return Layout(*_compose(outer, other.shape, other.stride, self, other))

    def complement(self, size: int) -> Layout:
        """The layout of the values in ``range(size)`` that ``self`` does not reach.

        ``concat(self.complement(size), self)`` is a bijection onto ``range(size)``
        (the complement varies slowest). Raises ``ValueError`` if ``self``
        overlaps or cannot tile ``range(size)``.

        >>> Layout(4, 2).complement(16)
        Layout((2, 2):(8, 1))
        """
        if not is_int(size) or size < 1:
            raise ValueError(f"complement size must be a positive integer, got {size!r}")
        return from_modes(flat.complement(self.modes, size, repr(self)))

    def non_overlapping(self) -> bool:
        """True when the modes nest: sorted by stride, each stride is a multiple
        of the span of the smaller ones.

        This implies the layout is injective and has an exact complement; it is
        the condition a set of mesh axes must meet. An injective layout whose
        modes interleave, such as ``(2, 3):(4, 1)``, is reported as overlapping
        on purpose: it cannot tile a universe of ranks.

        >>> Layout((2, 2), (1, 2)).non_overlapping(), Layout((2, 2), (1, 1)).non_overlapping()
        (True, False)
        """
        return flat.nesting_gap(self.modes) is None

    def inverse(self) -> Layout:
        """The layout ``g`` with ``g(self(i)) == i``, for a bijection onto ``range(size)``.

        >>> Layout((2, 3), (1, 2)).inverse()
        Layout((3, 2):(1, 3))
        """
        if self.cosize != self.size or not self.non_overlapping():
            raise ValueError(f"{self!r} is not a bijection onto range({self.size}), so it has no inverse")
        modes = [(s, d) for s, d in self.modes if s > 1]
        weights = flatten(suffix_product(tuple(s for s, _ in modes)))
        by_value = sorted(zip(modes, weights, strict=True), key=lambda item: -item[0][1])
        return from_modes(flat.coalesce(tuple((s, w) for (s, _), w in by_value)))

    def decompose(self, value: int) -> tuple[int, int]:
        """Split ``value`` into ``(index, rest)`` with ``value == self(index) + rest``.

        ``rest`` has no component along this layout's modes. Meaningful for a
        non-overlapping layout and a value of a universe it tiles.

        >>> Layout(2, 4).decompose(13)
        (1, 9)
        """
        return flat.decompose(self._modes, value)


def concat(*layouts: Layout) -> Layout:
    """One layout whose top-level modes are the given layouts, in order.

    >>> concat(Layout(2, 4), Layout(4, 1))
    Layout((2, 4):(4, 1))
    """
    for layout in layouts:
        if not isinstance(layout, Layout):
            raise TypeError(f"concat takes Layout values, got {layout!r}")
    return Layout(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def from_modes(modes: Modes) -> Layout:
    """The flat layout of ``(size, stride)`` pairs, outermost first: the inverse of :attr:`Layout.modes`.

    >>> from_modes(((2, 8), (4, 1)))
    Layout((2, 4):(8, 1))
    >>> from_modes(Layout(((2, 3), 4)).modes) == Layout((2, 3, 4))
    True
    """
    return Layout(tuple(s for s, _ in modes), tuple(d for _, d in modes))


def _evaluate(shape: IntTuple, stride: IntTuple, index: IntTuple) -> int:
    if isinstance(index, tuple):
        if not isinstance(shape, tuple) or len(index) != len(shape):
            raise ValueError(f"coordinate {index!r} does not match layout shape {shape!r}")
        strides = cast(tuple[IntTuple, ...], stride)  # congruent with shape since construction
        return sum(_evaluate(s, d, i) for s, d, i in zip(shape, strides, index, strict=True))
    size = product(shape)
    if not is_int(index) or not 0 <= index < size:
        raise ValueError(f"index {index!r} is outside the layout's range(0, {size})")
    digits = row_major_coordinate(index, flatten(shape))
    return sum(c * d for c, d in zip(digits, flatten(stride), strict=True))


def sorted_by_stride(layout: Layout) -> Layout:
    """A flat layout over the same modes, largest stride first, coalesced: one form per set of digits.

    >>> sorted_by_stride(Layout((2, 4), (1, 2)))
    Layout((8,):(1,))
    """
    return from_modes(flat.coalesce(tuple(sorted(layout.modes, key=lambda mode: -mode[1]))))


def _compose_mode(outer: Modes, size: int, stride: int) -> Modes:
    """``outer ∘ (size:stride)`` as flat modes; ``outer`` is coalesced."""
    if size == 1:
        return ()
    if stride == 0:
        return ((size, 0),)
    result: list[tuple[int, int]] = []  # innermost first
    rest_size, rest_stride = size, stride
    for position in range(len(outer) - 1, 0, -1):  # every mode but the outermost
        mode_size, mode_stride = outer[position]
        if rest_stride % mode_size == 0:  # each step jumps over this whole mode
            rest_stride //= mode_size
            continue
        if mode_size % rest_stride != 0:
            raise ValueError(f"stride {rest_stride} cuts mode {mode_size} unevenly")
        taken = min(mode_size // rest_stride, rest_size)
        if rest_size % taken != 0:
            raise ValueError(f"size {rest_size} cuts mode {mode_size} unevenly")
        result.append((taken, rest_stride * mode_stride))
        rest_size //= taken
        rest_stride = 1
        if rest_size == 1:
            break
    if rest_size > 1:
        result.append((rest_size, rest_stride * (outer[0][1] if outer else 0)))
    return flat.coalesce(tuple(reversed(result)))


def _compose(
    outer: Modes, shape: IntTuple, stride: IntTuple, left: Layout, right: Layout
) -> tuple[IntTuple, IntTuple]:
    if isinstance(shape, tuple):
        strides = cast(tuple[IntTuple, ...], stride)
        parts = [_compose(outer, s, d, left, right) for s, d in zip(shape, strides, strict=True)]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    try:
        modes = _compose_mode(outer, shape, cast(int, stride))
    except ValueError as error:
        raise ValueError(
            f"{left!r} ∘ {right!r} is not a layout: mode {shape}:{stride} {error}; "
            "valid strides and sizes divide, or are multiples of, the modes they cross"
        ) from None
    if not modes:
        return 1, 0
    if len(modes) == 1:
        return modes[0]
    return tuple(s for s, _ in modes), tuple(d for _, d in modes)


