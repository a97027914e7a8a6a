"""Mesh values: named axes laid out over the slots of a universe. No process groups here.

A mesh assigns each named axis a :class:`~fmesh.layout.Layout` over the slots
``0..world_size-1`` of its :class:`Universe`. The axes together describe one
*instance*; congruent instances, shifted by the values the axes do not reach,
tile the universe, exactly as a sliced ``DeviceMesh`` does on each rank.
:func:`fmesh.select` pins some slot digits, so that only the instances with
those digits are covered.

Every question about one rank is answered by digit arithmetic on a handful of
layout modes; nothing is ever enumerated over the world.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from fmesh.layout import flat
from fmesh.layout.flat import Modes
from fmesh.layout.int_tuple import IntTuple, is_int, product
from fmesh.layout.layout import Layout, concat, sorted_by_stride
from fmesh.mesh import frame as frames
from fmesh.mesh import transforms
from fmesh.mesh.lineage import Lineage
from fmesh.mesh.transforms import check_not_compiling
from fmesh.mesh.universe import Universe

if TYPE_CHECKING:
    import torch

AxesArg = str | Sequence[str] | None

_EMPTY = Layout((), ())


def _one_edit(typed: str, choice: str) -> bool:
    """Whether ``choice`` is ``typed`` with one letter changed, added, dropped, or two neighbours swapped.

    >>> _one_edit("tq", "tp"), _one_edit("pd", "dp"), _one_edit("d", "dp"), _one_edit("tq", "dp")
    (True, True, True, False)
    """
    if typed == choice or abs(len(typed) - len(choice)) > 1:
        return False
    if len(typed) == len(choice):
        diffs = [i for i, (a, b) in enumerate(zip(typed, choice, strict=True)) if a != b]
        swapped = len(diffs) == 2 and diffs[1] == diffs[0] + 1 and typed[diffs[0]] == choice[diffs[1]] \
            and typed[diffs[1]] == choice[diffs[0]]
        return len(diffs) == 1 or swapped
    short, long = sorted((typed, choice), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'tp'?"`` when a choice is close to ``name`` (a typo), else nothing.

    >>> _did_you_mean("tq", ("dp", "tp")), _did_you_mean("pd", ("dp", "tp")), _did_you_mean("xp", ("dp", "tp"))
    ("; did you mean 'tp'?", "; did you mean 'dp'?", "; did you mean 'dp' or 'tp'?")
    """
    folded = [choice for choice in choices if choice.casefold() == name.casefold()]
    # difflib's ratio misses one slip in a two-letter name ('tq' for 'tp': 0.5): one edit away is close too
    close = folded or [choice for choice in choices if _one_edit(name, choice)] \
        or difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""


def _canonical_layouts(layouts: Sequence[Layout]) -> tuple[Layout, ...]:
    for layout in layouts:
        if not isinstance(layout, Layout):
            raise TypeError(f"mesh layouts must be fmesh.Layout values, got {layout!r}")
    return tuple(layout.coalesce() for layout in layouts)


def _canonical_pinned(layout: Layout) -> Layout:
    # Pinned modes form a set of digits; sorting them makes equal sets compare equal.
    if not isinstance(layout, Layout):
        raise TypeError(f"pinned must be an fmesh.Layout, got {layout!r}")
    return _EMPTY if layout.size == 1 else sorted_by_stride(layout)


def _canonical_frame(frame: Iterable[Layout]) -> tuple[Layout, ...]:
    return tuple(_canonical_layouts(tuple(frame)))


def _to_names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(names)


def _check_axis_names(mesh: Mesh, attribute: attrs.Attribute[Any], names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"axis names must be strings, got {name!r} in {names!r}")
        if not name:
            raise ValueError(f"axis names must be non-empty strings, got {names!r}")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"axis names must be unique, but {duplicates} appear more than once in {names!r}")


def _hashed_when_built(cls: type[Any]) -> type[Any]:
    """``cls`` whose instances compute their (cached) hash when built or unpickled, never first inside
    ``torch.compile`` (Dynamo cannot trace attrs' hash cache: a compiled region looking a mesh up in a dict must
    read a number), and are never built inside ``torch.compile`` (Dynamo cannot build attrs values: say what to do
    instead of Dynamo's "Unsupported")."""
    init, setstate = cls.__init__, cls.__setstate__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        check_not_compiling("building a Mesh (make_mesh, fmesh.slice, flatten, mesh[...], ...)")
        init(self, *args, **kwargs)
        hash(self)

    @functools.wraps(setstate)
    def __setstate__(self: Any, state: Any) -> None:
        setstate(self, state)
        hash(self)

    setattr(cls, "__init__", __init__)  # noqa: B010 (assigning a method: mypy refuses cls.__init__ = ...)
    setattr(cls, "__setstate__", __setstate__)  # noqa: B010
    return cls


@_hashed_when_built
@attrs.frozen(repr=False, cache_hash=True)
class Mesh:
    """Named axes over a universe of ranks: a frozen, hashable, picklable value.

    Build one with :func:`fmesh.make_mesh`; derive others with ``slice``,
    ``flatten``, ``unflatten``, ``concat``, ``rename`` and ``select``.

    Fields: ``layouts`` (one per axis), ``pinned``/``offset`` (the slot digits
    fixed by ``select``), and ``frame``: empty unless an ``unflatten`` split a
    strided axis unevenly, in which case the layouts index a re-ordering of the
    slots, ``slot = frame[0](frame[1](...(index)))``. Meshes with an empty frame
    are equal exactly when they have the same groups along every axis.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> mesh
    Mesh(dp=2, cp=2, tp=4; world=16)
    >>> mesh.group(5, "tp"), mesh.coordinate(5)
    ((4, 5, 6, 7), (0, 1, 1))
    """

    universe: Universe = attrs.field(validator=attrs.validators.instance_of(Universe))
    axis_names: tuple[str, ...] = attrs.field(converter=_to_names, validator=_check_axis_names)
    layouts: tuple[Layout, ...] = attrs.field(converter=_canonical_layouts)
    pinned: Layout = attrs.field(default=_EMPTY, converter=_canonical_pinned)
    offset: int = attrs.field(default=0)
    frame: tuple[Layout, ...] = attrs.field(default=(), converter=_canonical_frame)

    def __attrs_post_init__(self) -> None:
        if len(self.layouts) != len(self.axis_names):
            raise ValueError(
                f"a mesh needs one layout per axis: {len(self.axis_names)} names {self.axis_names!r} "
                f"but {len(self.layouts)} layouts"
            )
        world = self.universe.world_size
        if self.frame:
            self._drop_frame_if_redundant()
            frames.check(self.frame, world)
        modes = frames.axes_modes((*self.layouts, self.pinned))
        try:
            flat.complement(modes, world)
        except ValueError:  # say it again with the layouts named (built only on this path: it costs µs)
            try:
                flat.complement(modes, world, self._describe_layouts())
            except ValueError as error:
                raise ValueError(f"these axes do not tile a universe of {world} ranks: {error}") from None
        if not is_int(self.offset) or not 0 <= self.offset < world:
            raise ValueError(f"offset must be a slot in range(0, {world}), got {self.offset!r}")
        if self.pinned.decompose(self.offset)[1] != 0:
            raise ValueError(f"offset {self.offset} has components outside the pinned modes {self.pinned!r}")

    def _drop_frame_if_redundant(self) -> None:
        # If every layout survives composition back to slots, the frame adds nothing:
        # dropping it keeps one canonical value per set of groups (equal meshes compare equal).
        # The instances count too: the complement of the axes in the frame's index space must also compose
        # to a layout, or dropping the frame would tile the universe with other instances (other groups).
        world = self.universe.world_size
        try:
            rest = flat.complement(frames.axes_modes((*self.layouts, self.pinned)), world)
            instances = Layout(tuple(n for n, _ in rest), tuple(d for _, d in rest))
            layouts, pinned, offset = frames.leave(
                self.frame, ([*self.layouts, instances], self.pinned, self.offset), world
            )
        except ValueError:
            return
        layouts = layouts[:-1]
        object.__setattr__(self, "layouts", _canonical_layouts(layouts))
        object.__setattr__(self, "pinned", _canonical_pinned(pinned))
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "frame", ())

    def _describe_layouts(self) -> str:
        named = zip(self.axis_names, self.layouts, strict=True)
        parts = [f"{name}={layout.shape}:{layout.stride}" for name, layout in named]
        if self.pinned.size > 1:
            parts.append(f"pinned={self.pinned.shape}:{self.pinned.stride}")
        return "(" + ", ".join(parts) + ")"

    # ------------------------------------------------------------------ shape

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """The size of each axis, in order.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).axis_sizes
        (2, 4)
        """
        return tuple(layout.size for layout in self.layouts)

    @property
    def shape(self) -> Mapping[str, int]:
        """Ordered, read-only mapping from axis name to size (like ``jax.sharding.Mesh.shape``).

        >>> import fmesh; dict(fmesh.make_mesh((2, 4), ("dp", "tp")).shape)
        {'dp': 2, 'tp': 4}
        """
        return MappingProxyType(dict(zip(self.axis_names, self.axis_sizes, strict=True)))

    @property
    def size(self) -> int:
        """Number of ranks in one instance (the product of the axis sizes).

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp"))["tp"].size
        4
        """
        return product(self.axis_sizes)

    @property
    def ndim(self) -> int:
        """Number of axes.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).ndim
        2
        """
        return len(self.axis_names)

    @property
    def device_type(self) -> str:
        """The universe's device type.

        >>> import fmesh; fmesh.make_mesh((2,), ("dp",), device_type="cuda").device_type
        'cuda'
        """
        return self.universe.device_type

    @property
    def world_size(self) -> int:
        """The universe's world size.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp"))["tp"].world_size
        8
        """
        return self.universe.world_size

    @property
    def num_instances(self) -> int:
        """How many congruent instances the mesh covers.

        >>> import fmesh; m = fmesh.make_mesh((2, 4), ("dp", "tp"))
        >>> m["tp"].num_instances, fmesh.select(m, dp=1).num_instances
        (2, 1)
        """
        return self.world_size // (self.size * self.pinned.size)

    @property
    def num_covered(self) -> int:
        """How many ranks the mesh covers (all of them unless ``select`` pinned some axes).

        >>> import fmesh; fmesh.select(fmesh.make_mesh((2, 4), ("pp", "tp")), pp=0).num_covered
        4
        """
        return self.size * self.num_instances

    def axis_index(self, name: str) -> int:
        """Position of axis ``name``; ``KeyError`` naming the valid axes otherwise.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).axis_index("tp")
        1
        """
        if not isinstance(name, str):
            raise TypeError(f"axis names are strings, got {name!r}; this mesh has axes {self.axis_names}")
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise KeyError(f"unknown axis {name!r}: this mesh has axes {self.axis_names}"
                           f"{_did_you_mean(name, self.axis_names)}") from None

    def axis_layout(self, name: str) -> Layout:
        """The layout of axis ``name`` over the universe's slots.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).axis_layout("dp")
        Layout((2,):(4,))
        """
        return self.layouts[self.axis_index(name)]

    def as_axes(self, axes: AxesArg) -> tuple[str, ...]:
        """The normal form of an ``axes`` argument, not yet checked against the mesh: ``None`` is
        every axis, a string one axis, any other sequence a tuple. Every entry point that takes
        ``axes`` goes through here (and :meth:`resolve_axes`), so caches key on one form.

        >>> import fmesh; m = fmesh.make_mesh((2, 4), ("dp", "tp"))
        >>> m.as_axes("tp"), m.as_axes(["dp", "tp"]), m.as_axes(None)
        (('tp',), ('dp', 'tp'), ('dp', 'tp'))
        """
        if axes is None:
            return self.axis_names
        if isinstance(axes, str):
            return (axes,)
        if isinstance(axes, tuple):
            return axes
        if isinstance(axes, Sequence):
            return tuple(axes)
        raise TypeError(
            f"expected axes as an axis name, a sequence of names or None, but got {axes!r}; "
            f"this mesh has axes {self.axis_names}"
        )

    def resolve_axes(self, axes: AxesArg) -> tuple[str, ...]:
        """:meth:`as_axes`, checked: every name an axis of this mesh, none twice.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).resolve_axes("tp")
        ('tp',)
        """
        names = self.as_axes(axes)
        for name in names:
            self.axis_index(name)
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"axes {duplicates} given more than once in {names!r}")
        return names

    def axes_layout(self, axes: AxesArg = None) -> Layout:
        """The layout of several axes taken together (row-major in the order given).

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).axes_layout(("tp", "dp"))
        Layout(((4,), (2,)):((1,), (4,)))
        """
        layouts = [self.axis_layout(name) for name in self.resolve_axes(axes)]
        return concat(*layouts) if layouts else _EMPTY

    def _axes_modes(self, axes: AxesArg) -> Modes:
        return tuple(mode for name in self.resolve_axes(axes) for mode in self.layouts[self.axis_index(name)].modes)

    # ---------------------------------------------------------------- queries

    def rank_at(self, index: int) -> int:
        """The global rank at ``index`` of this mesh's index space (the universe's slots,
        re-indexed by the ``frame`` if there is one): the inverse of :meth:`index_of`.

        >>> import fmesh; fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 2, 1, 0]).rank_at(1)
        2
        """
        return self.universe.rank_of(frames.to_slot(self.frame, index))

    def _covered_index(self, rank: int) -> int | None:
        index = frames.to_index(self.frame, self.universe.slot_of(rank))
        if not self.pinned.modes:
            return index
        _, rest = flat.decompose(self.pinned.modes, index)
        return index if index - rest == self.offset else None

    def index_of(self, rank: int) -> int:
        """The index of ``rank`` in this mesh's index space; ``ValueError`` if no instance covers it.

        The layouts map coordinates to these indices: ``mesh.rank_at(mesh.index_of(r)) == r``.

        >>> import fmesh; fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 2, 1, 0]).index_of(2)
        1
        """
        index = self._covered_index(rank)
        if index is None:
            raise ValueError(
                f"rank {rank} is not covered by {self!r}: select() kept only the ranks whose "
                f"pinned coordinates match; use mesh.coordinate(rank) to test membership"
            )
        return index

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """The rank's coordinate in its instance, or ``None`` if no instance holds it.

        >>> import fmesh; m = fmesh.make_mesh((2, 4), ("pp", "tp"))
        >>> m.coordinate(6), fmesh.select(m, pp=0).coordinate(6)
        ((1, 2), None)
        """
        index = self._covered_index(rank)
        if index is None:
            return None
        return tuple(flat.decompose(layout.modes, index)[0] for layout in self.layouts)

    def group(self, rank: int, axes: AxesArg = None) -> tuple[int, ...]:
        """Global ranks of ``rank``'s group along ``axes`` (default: all), row-major.

        >>> import fmesh; m = fmesh.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
        >>> m.group(0, "cp"), m.group(0, ("tp", "dp"))
        ((0, 2), (0, 4, 1, 5))
        """
        modes = self._axes_modes(axes)
        _, base = flat.decompose(modes, self.index_of(rank))
        if not self.frame and self.universe.is_identity:  # index = slot = rank
            return tuple(flat.values(base, modes))
        return tuple(self.rank_at(index) for index in flat.values(base, modes))

    def groups(self, axes: AxesArg = None) -> tuple[tuple[int, ...], ...]:
        """Every group along ``axes``; together they partition the covered ranks.

        >>> import fmesh; fmesh.make_mesh((2, 2), ("dp", "tp")).groups("dp")
        ((0, 2), (1, 3))
        """
        modes = self._axes_modes(axes)
        others = flat.complement(modes + self.pinned.modes, self.world_size)
        rank_at = self.rank_at
        return tuple(
            tuple(rank_at(index) for index in flat.values(base, modes))
            for base in flat.values(self.offset, others)
        )

    def rank_grid(self, rank: int | None = None) -> IntTuple:
        """The global ranks of the instance holding ``rank``, nested tuples of shape ``axis_sizes``.

        The same answer as :meth:`ranks`, without torch. ``rank`` may be left out when the mesh
        has a single instance.

        >>> import fmesh; fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 2, 1, 0]).rank_grid()
        ((3, 2), (1, 0))
        """
        modes = self._axes_modes(None)
        if rank is None:
            if self.num_instances != 1:
                raise ValueError(
                    f"{self!r} has {self.num_instances} instances; pass a rank to say which one"
                )
            base = self.offset
        else:
            _, base = flat.decompose(modes, self.index_of(rank))
        grid: list[IntTuple] = [self.rank_at(index) for index in flat.values(base, modes)]
        for size in reversed(self.axis_sizes):  # nest the innermost axis first
            grid = [tuple(grid[i : i + size]) for i in range(0, len(grid), size)]
        return grid[0]

    def ranks(self, rank: int | None = None) -> torch.Tensor:
        """``torch.Tensor`` of shape ``axis_sizes``: the global ranks of the instance holding ``rank``
        (:meth:`rank_grid` as a tensor; the one query that needs torch).

        >>> import fmesh; fmesh.make_mesh((2, 2), ("dp", "tp"))["tp"].ranks(3)
        tensor([2, 3])
        """
        import torch

        return torch.tensor(self.rank_grid(rank), dtype=torch.long)

    # ------------------------------------------------------------ transforms

    def __getitem__(self, axes: str | tuple[str, ...]) -> Mesh:
        """``mesh["tp"]`` or ``mesh["dp", "tp"]``: the same as :meth:`slice`.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp"))["tp", "dp"]
        Mesh(tp=4, dp=2; world=8)
        """
        return transforms.slice(self, *((axes,) if isinstance(axes, str) else axes))

    def slice(self, *axis_names: str) -> Mesh:
        """See :func:`fmesh.slice`.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).slice("tp")
        Mesh(tp=4; world=8)
        """
        return transforms.slice(self, *axis_names)

    def flatten(self, axis_names: Sequence[str], name: str) -> Mesh:
        """See :func:`fmesh.flatten`.

        >>> import fmesh; fmesh.make_mesh((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
        Mesh(ac=4, b=2; world=8)
        """
        return transforms.flatten(self, axis_names, name)

    def unflatten(self, axis_name: str, sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> Mesh:
        """See :func:`fmesh.unflatten`.

        >>> import fmesh; fmesh.make_mesh((8,), ("world",)).unflatten("world", {"dp": 2, "tp": 4})
        Mesh(dp=2, tp=4; world=8)
        """
        return transforms.unflatten(self, axis_name, sizes)

    def rename(self, mapping: Mapping[str, str]) -> Mesh:
        """See :func:`fmesh.rename`.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("dp", "tp")).rename({"dp": "fsdp"})
        Mesh(fsdp=2, tp=4; world=8)
        """
        return transforms.rename(self, mapping)

    def select(self, **coordinates: int) -> Mesh:
        """See :func:`fmesh.select`.

        >>> import fmesh; fmesh.make_mesh((2, 4), ("pp", "tp")).select(pp=1).ranks()
        tensor([4, 5, 6, 7])
        """
        return transforms.select(self, **coordinates)

    def __repr__(self) -> str:
        axes = ", ".join(f"{name}={size}" for name, size in zip(self.axis_names, self.axis_sizes, strict=True))
        covered = f", covers {self.num_covered}" if self.num_covered != self.world_size else ""
        return f"Mesh({axes}; world={self.world_size}{covered})"


def make_mesh(
    axis_sizes: Sequence[int],
    axis_names: Sequence[str],
    *,
    device_type: str = "cpu",
    rank_map: Any = None,
    lineage: Lineage | None = None,
) -> Mesh:
    """A root mesh whose axes cover the whole universe, row-major like ``init_device_mesh``.

    ``rank_map`` (any permutation of ``range(world_size)``, also a tensor of
    shape ``axis_sizes``) says which global rank sits in each slot; ``lineage`` is for the
    universe of a job made smaller or larger (see :func:`fmesh.without`).

    >>> make_mesh((2, 4), ("dp", "tp"))
    Mesh(dp=2, tp=4; world=8)
    >>> make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 2, 1, 0]).group(3, "tp")
    (3, 2)
    """
    check_not_compiling("make_mesh")
    if isinstance(axis_sizes, (str, bytes)) or not isinstance(axis_sizes, Sequence):
        raise TypeError(f"axis_sizes must be a sequence of ints such as (2, 4), got {axis_sizes!r}")
    if isinstance(axis_names, str) or not isinstance(axis_names, Sequence):
        raise TypeError(f"axis_names must be a sequence of strings such as ('dp', 'tp'), got {axis_names!r}")
    for size in axis_sizes:
        if not is_int(size):
            raise TypeError(f"axis sizes must be ints, got {size!r} in {tuple(axis_sizes)!r}")
        if size < 1:
            raise ValueError(f"axis sizes must be positive, got {size} in {tuple(axis_sizes)!r}")
    if len(axis_sizes) != len(axis_names):
        raise ValueError(
            f"got {len(axis_sizes)} sizes {tuple(axis_sizes)!r} but {len(axis_names)} names {tuple(axis_names)!r}; "
            "give one name per axis"
        )
    root = Layout(tuple(axis_sizes))
    layouts = [Layout(s, d) for s, d in root.modes]
    universe = Universe(root.size, rank_map=rank_map, device_type=device_type, lineage=lineage)
    return Mesh(universe, tuple(axis_names), layouts)
