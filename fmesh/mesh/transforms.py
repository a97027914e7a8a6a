"""Pure functions from meshes to meshes in the same universe.

Each returns a new :class:`~fmesh.Mesh` built with ``attrs.evolve`` (so the
mesh validators run on every result) and never changes its argument. None of
them looks at more than the few layout modes of the axes involved.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import attrs

from fmesh.layout.int_tuple import IntTuple, is_int, product
from fmesh.layout.layout import Layout
from fmesh.layout.layout import concat as concat_layouts
from fmesh.mesh import frame as frames
from fmesh.mesh.universe import Universe

if TYPE_CHECKING:
    from fmesh.mesh.mesh import Mesh


def check_not_compiling(what: str) -> None:
    """``RuntimeError`` inside ``torch.compile``: Dynamo cannot build attrs values (and meshes are values: build
    them once, outside). Torch-free: it looks only at a torch that is imported already.

    >>> check_not_compiling("make_mesh")
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        raise RuntimeError(
            f"{what} inside torch.compile: build meshes outside the compiled function (they are values: make them "
            "once), create their groups with ctx.materialize(mesh), and call the collectives inside")


def _names(axis_names: Sequence[object]) -> tuple[object, ...]:
    # slice(mesh, ("dp", "tp")) reads as slice(mesh, "dp", "tp"), like DeviceMesh.__getitem__.
    if len(axis_names) == 1 and isinstance(axis_names[0], (tuple, list)):
        return tuple(axis_names[0])
    return tuple(axis_names)


def slice(mesh: Mesh, *axis_names: str) -> Mesh:
    """Keep only these axes, in this order (any order, any subset).

    >>> import fmesh; mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> fmesh.slice(mesh, "tp", "dp")
    Mesh(tp=4, dp=2; world=16)
    """
    check_not_compiling("fmesh.slice (or mesh[...])")
    names = _names(axis_names)
    if not names:
        raise ValueError(f"slice needs at least one axis name; this mesh has axes {mesh.axis_names}")
    resolved = mesh.resolve_axes(names)  # type: ignore[arg-type]
    return attrs.evolve(mesh, axis_names=resolved, layouts=[mesh.axis_layout(n) for n in resolved])


def flatten(mesh: Mesh, axis_names: Sequence[str], name: str) -> Mesh:
    """Merge these axes, in this order, into one axis ``name`` placed where the first stood.

    The axes need not be adjacent; the merged axis is row-major in the order given.

    >>> import fmesh; mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> flat = fmesh.flatten(mesh, ("dp", "cp"), "dp_cp")
    >>> flat, flat.group(0, "dp_cp")
    (Mesh(dp_cp=4, tp=4; world=16), (0, 4, 8, 12))
    """
    check_not_compiling("fmesh.flatten")
    if isinstance(axis_names, str):
        raise TypeError(f"flatten takes a sequence of axis names such as ('dp', 'cp'), got the string {axis_names!r}")
    merged = mesh.resolve_axes(axis_names)
    if not merged:
        raise ValueError(f"flatten needs at least one axis name; this mesh has axes {mesh.axis_names}")
    _check_new_name(name)
    kept = [n for n in mesh.axis_names if n not in merged]
    if name in kept:
        raise ValueError(f"cannot name the flattened axis {name!r}: the mesh keeps an axis of that name; kept: {kept}")
    layout = concat_layouts(*(mesh.axis_layout(n) for n in merged))
    position = mesh.axis_index(merged[0])
    names, layouts = [], []
    for index, (axis, axis_layout) in enumerate(zip(mesh.axis_names, mesh.layouts, strict=True)):
        if index == position:
            names.append(name)
            layouts.append(layout)
        elif axis not in merged:
            names.append(axis)
            layouts.append(axis_layout)
    return attrs.evolve(mesh, axis_names=names, layouts=layouts)


def unflatten(mesh: Mesh, axis_name: str, sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> Mesh:
    """Split axis ``axis_name`` into several, row-major; ``sizes`` maps new names to sizes.

    Any axis can be split by any sizes that multiply to its size, flattened and
    strided axes included (where the split cuts the strided modes unevenly the
    result carries a ``frame``; see :class:`~fmesh.Mesh`).

    >>> import fmesh; mesh = fmesh.make_mesh((8, 2), ("world", "x"))
    >>> fmesh.unflatten(mesh, "world", {"dp": 2, "tp": 4})
    Mesh(dp=2, tp=4, x=2; world=16)
    """
    check_not_compiling("fmesh.unflatten")
    layout = mesh.axis_layout(axis_name)
    items = _size_items(sizes)
    new_names = [n for n, _ in items]
    for new_name in new_names:
        _check_new_name(new_name)
    clashes = [n for n in new_names if n in mesh.axis_names and n != axis_name]
    if clashes:
        raise ValueError(f"unflatten names {clashes} are already axes of the mesh {mesh.axis_names}")
    new_sizes = tuple(s for _, s in items)
    if product(new_sizes) != layout.size:
        raise ValueError(
            f"unflatten sizes {dict(items)} multiply to {product(new_sizes)}, "
            f"but axis {axis_name!r} has size {layout.size}; they must multiply to {layout.size}"
        )
    position = mesh.axis_index(axis_name)
    layouts, pinned, offset, frame = list(mesh.layouts), mesh.pinned, mesh.offset, mesh.frame
    try:
        split = layout.composition(Layout(new_sizes))
    except ValueError:
        # The sizes cut the axis's strided modes unevenly (torch's _unflatten fails here):
        # re-index the universe so that this axis is contiguous, where any factorisation is a layout.
        to_old = frames.reindexing(layout, mesh.world_size)
        layouts, pinned, offset = frames.enter(to_old, (layouts, pinned, offset))
        frame = (*frame, to_old)
        split = layouts[position].composition(Layout(new_sizes))
    shapes, strides = cast(tuple[IntTuple, ...], split.shape), cast(tuple[IntTuple, ...], split.stride)
    layouts[position : position + 1] = [Layout(s, d) for s, d in zip(shapes, strides, strict=True)]
    names = [*mesh.axis_names[:position], *new_names, *mesh.axis_names[position + 1 :]]
    return attrs.evolve(mesh, axis_names=names, layouts=layouts, pinned=pinned, offset=offset, frame=frame)


def concat(*meshes: Mesh) -> Mesh:
    """All axes of all meshes, in order; they must share a universe and not overlap.

    >>> import fmesh; mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> fmesh.concat(mesh["tp"], mesh["dp"])
    Mesh(tp=4, dp=2; world=16)
    """
    check_not_compiling("fmesh.concat")
    if not meshes:
        raise ValueError("concat needs at least one mesh")
    for index, mesh in enumerate(meshes):
        # Told by its universe, not isinstance(mesh, Mesh): mesh.py imports this module, so importing it back,
        # even inside this function, would be an import cycle.
        if not isinstance(getattr(mesh, "universe", None), Universe) or not hasattr(mesh, "layouts"):
            raise TypeError(f"concat takes Mesh values, got {mesh!r} at position {index}")
    first = next((m for m in meshes if m.frame), meshes[0])  # a re-indexed mesh sets the index space
    parts = []
    for index, mesh in enumerate(meshes):
        if mesh.universe != first.universe:
            raise ValueError(
                f"cannot concat meshes from different universes: {mesh.universe!r} at position {index} "
                f"vs {first.universe!r}; derive both from one make_mesh() call"
            )
        try:
            layouts, pinned, offset = frames.express(mesh.frame, first.frame, (list(mesh.layouts), mesh.pinned,
                                                                               mesh.offset))
        except ValueError:
            raise ValueError(
                f"cannot concat {mesh!r} (position {index}): another mesh split a strided axis unevenly and "
                "this one cannot be expressed over its re-indexed universe; concat before that unflatten"
            ) from None
        if (pinned, offset) != (first.pinned, first.offset):
            raise ValueError(
                f"cannot concat {mesh!r} (position {index}) with {first!r}: they select different ranks; "
                "apply select() after concat instead"
            )
        parts.append((mesh.axis_names, layouts))
    axes = [(name, layout) for names, layouts in parts for name, layout in zip(names, layouts, strict=True)]
    for i, (name_i, layout_i) in enumerate(axes):
        for name_j, layout_j in axes[i + 1 :]:
            if name_i == name_j:
                raise ValueError(f"cannot concat: axis {name_i!r} appears in more than one mesh; rename one first")
            if not concat_layouts(layout_i, layout_j, first.pinned).non_overlapping():
                raise ValueError(
                    f"cannot concat: axes {name_i!r} and {name_j!r} overlap (they share ranks); "
                    "concat needs meshes over disjoint sets of axes"
                )
    return attrs.evolve(first, axis_names=[n for n, _ in axes], layouts=[lay for _, lay in axes])


def rename(mesh: Mesh, mapping: Mapping[str, str]) -> Mesh:
    """New axis names; axes not in ``mapping`` keep theirs.

    >>> import fmesh; fmesh.rename(fmesh.make_mesh((2, 4), ("dp", "tp")), {"dp": "fsdp"})
    Mesh(fsdp=2, tp=4; world=8)
    """
    check_not_compiling("fmesh.rename")
    if not isinstance(mapping, Mapping):
        raise TypeError(f"rename takes a mapping of old to new names such as {{'dp': 'fsdp'}}, got {mapping!r}")
    for old, new in mapping.items():
        mesh.axis_index(old)
        _check_new_name(new)
    return attrs.evolve(mesh, axis_names=[mapping.get(n, n) for n in mesh.axis_names])


def select(mesh: Mesh, **coordinates: int) -> Mesh:
    """Fix some axes at a coordinate and drop them; only the matching ranks stay covered.

    >>> import fmesh; mesh = fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"))
    >>> stage1 = fmesh.select(mesh, pp=1)
    >>> stage1, stage1.groups("tp")
    (Mesh(dp=2, tp=2; world=8, covers 4), ((4, 5), (6, 7)))
    """
    check_not_compiling("fmesh.select")
    pinned_modes = list(mesh.pinned.modes)
    offset = mesh.offset
    for name, coordinate in coordinates.items():
        layout = mesh.axis_layout(name)
        if not is_int(coordinate) or not 0 <= coordinate < layout.size:
            raise ValueError(
                f"select({name}={coordinate!r}): axis {name!r} has size {layout.size}, "
                f"so its coordinate must be an int in 0..{layout.size - 1}"
            )
        pinned_modes.extend(layout.modes)
        offset += layout(coordinate)
    kept = [n for n in mesh.axis_names if n not in coordinates]
    return attrs.evolve(
        mesh,
        axis_names=kept,
        layouts=[mesh.axis_layout(n) for n in kept],
        pinned=Layout(tuple(s for s, _ in pinned_modes), tuple(d for _, d in pinned_modes)),  # Mesh sorts it
        offset=offset,
    )


def _check_new_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"axis names must be non-empty strings, got {name!r}")


def _size_items(sizes: Mapping[str, int] | Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if isinstance(sizes, Mapping):
        items = list(sizes.items())
    elif isinstance(sizes, Sequence) and all(isinstance(i, tuple) and len(i) == 2 for i in sizes):
        items = [(n, s) for n, s in sizes]
    else:
        raise TypeError(f"unflatten sizes must map new axis names to sizes, e.g. {{'dp': 2, 'tp': 4}}; got {sizes!r}")
    if not items:
        raise ValueError("unflatten needs at least one new axis in sizes, e.g. {'dp': 2, 'tp': 4}")
    for name, size in items:
        if not is_int(size) or size < 1:
            raise ValueError(f"unflatten size for {name!r} must be a positive int, got {size!r}")
    names = [n for n, _ in items]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"unflatten names {duplicates} are given twice")
    return items
