"""Pure functions over integers and nested tuples of integers ("int tuples").

An int tuple is either an ``int`` or a tuple whose elements are int tuples, e.g.
``4``, ``(2, 3)`` or ``((2, 2), 4)``. Everything here is recursive over that
structure and never looks at anything but the integers it is given.

>>> flatten(((2, 2), 4))
(2, 2, 4)
>>> suffix_product((2, 3, 4))
(12, 4, 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias, TypeGuard

IntTuple: TypeAlias = int | tuple["IntTuple", ...]


def is_int(value: object) -> TypeGuard[int]:
    """True for a Python ``int`` that is not a ``bool``.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_many(value: object) -> TypeGuard[Iterable[Any]]:
    """True for an iterable that is not a string: a list of ranks such as ``[5, 9]`` (``5`` and ``"5"`` are not).

    >>> is_many([5, 9]), is_many(range(2)), is_many(5), is_many("59")
    (True, True, False, False)
    """
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes))


def is_int_tuple(value: object) -> TypeGuard[IntTuple]:
    """True if ``value`` is an int or a (nested) tuple of ints.

    >>> is_int_tuple(((2, 2), 4)), is_int_tuple([2, 2])
    (True, False)
    """
    if isinstance(value, tuple):
        return all(is_int_tuple(v) for v in value)
    return is_int(value)


def flatten(value: IntTuple) -> tuple[int, ...]:
    """All the integers of a nested int tuple, left to right.

    >>> flatten(((2, 2), 4)), flatten(5)
    ((2, 2, 4), (5,))
    """
    if isinstance(value, tuple):
        return tuple(x for v in value for x in flatten(v))
    return (value,)


def product(value: IntTuple) -> int:
    """Product of all the integers (1 for an empty tuple).

    >>> product(((2, 2), 4))
    16
    """
    result = 1
    for x in flatten(value):
        result *= x
    return result


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """True if ``a`` and ``b`` have the same nesting structure.

    >>> congruent((2, (3, 4)), (1, (5, 6))), congruent((2, 3), 6)
    (True, False)
    """
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b, strict=True))
    return not isinstance(a, tuple) and not isinstance(b, tuple)


def unflatten(flat: Sequence[int], like: IntTuple) -> IntTuple:
    """Give the flat sequence ``flat`` the nesting structure of ``like``.

    >>> unflatten((12, 4, 1), ((2, 3), 4))
    ((12, 4), 1)
    """
    items = iter(flat)

    def build(shape: IntTuple) -> IntTuple:
        if isinstance(shape, tuple):
            return tuple(build(s) for s in shape)
        return next(items)

    return build(like)


def suffix_product(shape: IntTuple) -> IntTuple:
    """Row-major (lexicographic) compact strides for ``shape``, same structure.

    The last integer varies fastest, as in a contiguous PyTorch tensor.

    >>> suffix_product((2, 3, 4))
    (12, 4, 1)
    >>> suffix_product(((2, 3), 4))
    ((12, 4), 1)
    """
    flat = flatten(shape)
    strides: list[int] = []
    running = 1
    for size in reversed(flat):
        strides.append(running)
        running *= size
    strides.reverse()
    return unflatten(strides, shape)


def row_major_coordinate(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Split a linear index into a coordinate of ``shape``, last entry fastest.

    >>> row_major_coordinate(7, (2, 4))
    (1, 3)
    """
    coordinate = []
    for size in reversed(shape):
        index, digit = divmod(index, size)
        coordinate.append(digit)
    coordinate.reverse()
    return tuple(coordinate)


def row_major_index(coordinate: Sequence[int], shape: Sequence[int]) -> int:
    """The linear index of a coordinate of ``shape``, last entry fastest (:func:`row_major_coordinate`'s inverse).

    >>> row_major_index((1, 3), (2, 4))
    7
    """
    index = 0
    for digit, size in zip(coordinate, shape, strict=True):
        index = index * size + digit
    return index
