"""The layout algebra against brute force: every law is checked by enumerating indices."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import assume, given, reject
from hypothesis import strategies as st
from laws import holds

from fmesh.layout import Layout, concat
from fmesh.layout.int_tuple import flatten


def brute_values(shape: object, stride: object) -> list[int]:
    """Values of a layout by the definition: row-major coordinates dotted with strides."""
    sizes, strides = flatten(shape), flatten(stride)  # type: ignore[arg-type]
    return [sum(c * d for c, d in zip(coord, strides, strict=True)) for coord in itertools.product(*map(range, sizes))]


flat_sizes = st.lists(st.integers(1, 5), min_size=0, max_size=4).filter(lambda s: math.prod(s) <= 96)


@st.composite
def layouts(draw: st.DrawFn, max_stride: int = 24) -> Layout:
    sizes = draw(flat_sizes)
    strides = [draw(st.integers(0, max_stride)) for _ in sizes]
    if draw(st.booleans()) and len(sizes) >= 2:  # nest the first two modes
        return Layout(((sizes[0], sizes[1]), *sizes[2:]), ((strides[0], strides[1]), *strides[2:]))
    return Layout(tuple(sizes), tuple(strides))


@st.composite
def tiling_layouts(draw: st.DrawFn) -> tuple[Layout, int]:
    """A non-overlapping layout made of some digits of a shuffled mixed radix, and the size it tiles."""
    radix = draw(st.lists(st.integers(2, 4), min_size=1, max_size=5).filter(lambda r: math.prod(r) <= 256))
    weights = [math.prod(radix[i + 1 :]) for i in range(len(radix))]
    chosen = draw(st.lists(st.sampled_from(range(len(radix))), unique=True, max_size=len(radix)))
    return Layout(tuple(radix[i] for i in chosen), tuple(weights[i] for i in chosen)), math.prod(radix)


@given(layouts())
def test_call_size_cosize_match_definition(layout: Layout) -> None:
    values = brute_values(layout.shape, layout.stride)
    assert [layout(i) for i in range(layout.size)] == values
    assert layout.size == len(values)
    assert layout.cosize == max(values) + 1


def test_coordinate_call_agrees_with_linear_call() -> None:
    def law(layout: Layout) -> None:
        assume(isinstance(layout.shape, tuple) and layout.shape)
        modes = [Layout(s, d) for s, d in zip(layout.shape, layout.stride, strict=True)]  # type: ignore[arg-type]
        for index, coordinate in enumerate(itertools.product(*(range(m.size) for m in modes))):
            assert layout(coordinate) == layout(index)

    holds(law, layouts())


@given(layouts())
def test_coalesce_is_same_function_and_minimal(layout: Layout) -> None:
    coalesced = layout.coalesce()
    assert [coalesced(i) for i in range(layout.size)] == brute_values(layout.shape, layout.stride)
    modes = coalesced.modes
    assert all(size > 1 for size, _ in modes)
    for (_, outer_stride), (inner_size, inner_stride) in itertools.pairwise(modes):
        assert outer_stride != inner_size * inner_stride, f"{coalesced} could merge further"


def test_composition_is_function_composition() -> None:
    def law(left: Layout, data: st.DataObject) -> None:
        # Right-hand layouts that stay inside the left's domain, built from divisors so most compose;
        # the few whose strides cut the left's modes unevenly are redrawn (see the rejection test below).
        divisors = [d for d in range(1, left.size + 1) if left.size % d == 0]
        size = data.draw(st.sampled_from(divisors))
        stride = data.draw(st.sampled_from([d for d in divisors if (size - 1) * d < left.size] or [0]))
        inner = data.draw(st.sampled_from([d for d in divisors if size % d == 0]))
        right = Layout((size // inner, inner), (stride * inner, stride))
        try:
            composed = left.composition(right)
        except ValueError as error:
            assert "is not a layout" in str(error)
            reject()
        expected = [left(right(i)) for i in range(right.size)]
        assert [composed(i) for i in range(right.size)] == expected
        assert composed.size == right.size

    holds(law, layouts(), st.data())


@given(layouts())
def test_composition_with_compact_layout_is_identity(layout: Layout) -> None:
    composed = layout.composition(Layout(layout.size))
    assert [composed(i) for i in range(layout.size)] == [layout(i) for i in range(layout.size)]


def test_composition_of_unflatten_shape_splits_row_major() -> None:
    def law(pair: tuple[Layout, int], data: st.DataObject) -> None:
        layout, _ = pair
        first = data.draw(st.sampled_from([d for d in range(1, layout.size + 1) if layout.size % d == 0]))
        split = Layout((first, layout.size // first))
        try:
            composed = layout.composition(split)
        except ValueError:
            reject()  # an uneven cut: the mesh layer re-indexes with a frame (tested in test_mesh)
        for a, b in itertools.product(range(first), range(layout.size // first)):
            assert composed((a, b)) == layout(a * (layout.size // first) + b)

    holds(law, tiling_layouts(), st.data())


def test_composition_rejects_out_of_domain_and_uneven_cuts() -> None:
    with pytest.raises(ValueError, match="has only 4 indices"):
        Layout(4).composition(Layout(3, 2))
    with pytest.raises(ValueError, match="is not a layout"):
        Layout((3, 2), (4, 1)).composition(Layout((2, 3)))


@given(tiling_layouts(), st.integers(1, 3))
def test_complement_completes_a_bijection(pair: tuple[Layout, int], copies: int) -> None:
    layout, world = pair
    size = world * copies
    complement = layout.complement(size)
    together = concat(complement, layout)
    values = [together(i) for i in range(together.size)]
    assert sorted(values) == list(range(size))
    starts = [complement(i) for i in range(complement.size)]
    assert starts == sorted(starts), "the complement enumerates its offsets in increasing order"


@given(layouts())
def test_non_overlapping_implies_injective_and_complementable(layout: Layout) -> None:
    values = brute_values(layout.shape, layout.stride)
    injective = len(set(values)) == len(values)
    if layout.non_overlapping():
        assert injective
        span = max(values) + 1
        while True:  # the smallest multiple the complement accepts exists and works
            try:
                complement = layout.complement(span)
                break
            except ValueError:
                span += 1
        together = concat(complement, layout)
        assert sorted(together(i) for i in range(together.size)) == list(range(span))
    else:
        with pytest.raises(ValueError):
            layout.complement(max(values) + 1)
    if not injective:
        assert not layout.non_overlapping()


def test_interleaved_injective_layout_counts_as_overlapping() -> None:
    layout = Layout((2, 3), (4, 1))
    assert len(set(brute_values(layout.shape, layout.stride))) == 6
    assert not layout.non_overlapping()


@given(tiling_layouts())
def test_decompose_inverts_call_plus_rest(pair: tuple[Layout, int]) -> None:
    layout, world = pair
    holes = {layout.complement(world)(i) for i in range(world // layout.size)}
    for value in range(world):
        index, rest = layout.decompose(value)
        assert layout(index) + rest == value
        assert rest in holes


@given(tiling_layouts())
def test_inverse_of_a_bijection(pair: tuple[Layout, int]) -> None:
    layout, world = pair
    bijection = concat(layout.complement(world), layout).coalesce()
    inverse = bijection.inverse()
    assert [inverse(bijection(i)) for i in range(world)] == list(range(world))


def test_inverse_rejects_non_bijections() -> None:
    with pytest.raises(ValueError, match="not a bijection"):
        Layout(4, 2).inverse()


@given(layouts(), layouts())
def test_concat_adds_modes(a: Layout, b: Layout) -> None:
    both = concat(a, b)
    assert both.size == a.size * b.size
    for i, j in itertools.product(range(a.size), range(b.size)):
        assert both((i, j)) == a(i) + b(j) == both(i * b.size + j)


def test_default_stride_is_row_major() -> None:
    assert Layout((2, 3, 4)).stride == (12, 4, 1)
    assert Layout(((2, 3), 4)).stride == ((12, 4), 1)
    assert Layout(5).stride == 1
