"""A picture of a tensor's sharding (JAX's ``visualize_array_sharding``): which ranks hold which block.

A sharding with the tensor's global shape, or a DTensor (its mesh, placements and shape), is cut here into plain
pieces (each dimension's length and the sizes of the axes that cut it) and drawn by
:mod:`fmesh.pictures.sharding` on the grid every picture shares: any number of dimensions (three or more as one
2-D view per block of the leading ones), each cell as large as its block (uneven blocks, as DTensor cuts them,
look uneven), and with a topology (or ``gpus_per_node``) lines where the holders' host changes, as in the mesh
pictures. Pure for a sharding: no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from fmesh.layout.int_tuple import row_major_coordinate, row_major_index
from fmesh.mesh import Mesh
from fmesh.pictures.grid import Grid, picture_hosts
from fmesh.pictures.markup import markup
from fmesh.pictures.sharding import HTML_LIMITS, TEXT_LIMITS, Limits, Split, sharding_grid
from fmesh.pictures.text import text
from fmesh.plan.topology import Topology
from fmesh.spmd.spec import Sharding, check_spec, dim_axes

__all__ = ["sharding_html", "sharding_text"]


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, Sequence) and not isinstance(shape, str) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return tuple(shape)
    raise ValueError(f"expected the tensor's global shape as a sequence of non-negative ints, but got {shape!r}")


def _rank(mesh: Mesh, rank: Any) -> int:
    """``rank`` if ``mesh`` covers it (the picture draws the instance holding it), else a ``ValueError``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or mesh.coordinate(rank) is None:
        raise ValueError(f"expected rank= as a rank that {mesh!r} covers, but got {rank!r}")
    return rank


def _drawn(value: Any, shape: Sequence[int] | None, rank: int | None) -> tuple[Sharding, tuple[int, ...], int]:
    """The sharding, global shape and a rank of the instance that a picture of ``value`` (a sharding with ``shape``,
    or a DTensor: this process's instance) draws."""
    if isinstance(value, Sharding):
        if shape is None:
            raise ValueError(f"expected the tensor's global shape with {value!r}, but got shape=None")
        shape = _shape(shape)
        check_spec(value.mesh, value.spec, len(shape))
        return value, shape, value.mesh.rank_at(0) if rank is None else _rank(value.mesh, rank)
    tensors = sys.modules.get("torch.distributed.tensor")  # a DTensor exists only if this module was imported
    if tensors is not None and isinstance(value, tensors.DTensor):
        from fmesh.context import from_device_mesh
        from fmesh.spmd.placements import from_placements

        global_shape = tuple(value.shape)
        if shape is not None and _shape(shape) != global_shape:
            raise ValueError(f"expected no shape (or the DTensor's own, {global_shape}) with a DTensor, but got "
                             f"{tuple(shape)!r}")
        sharding = from_placements(from_device_mesh(value.device_mesh), value.placements)
        return sharding, global_shape, _rank(sharding.mesh, value.device_mesh.get_rank() if rank is None else rank)
    raise TypeError(f"expected an fmesh.spmd.Sharding (with the global shape) or a DTensor, but got "
                    f"{type(value).__name__}: {value!r}")


def _grid(sharding: Sharding, shape: tuple[int, ...], rank: int, hosts: Topology | None, limits: Limits) -> Grid:
    mesh, spec = sharding.mesh, sharding.spec
    entries = spec.entries + (None,) * (len(shape) - len(spec))
    splits = [Split(n, tuple(mesh.shape[a] for a in dim_axes(e))) for n, e in zip(shape, entries, strict=True)]
    members = mesh.group(rank, mesh.axis_names)  # the instance holding rank, row-major

    def holders(index: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks whose coordinates along each dimension's axes spell its piece ``index[d]``: the group, along
        the axes that cut no dimension, of the one among them whose other coordinates are 0."""
        coordinate = [0] * mesh.ndim
        for piece, entry in zip(index, entries, strict=True):
            axes = dim_axes(entry)
            for axis, digit in zip(axes, row_major_coordinate(piece, [mesh.shape[a] for a in axes]), strict=True):
                coordinate[mesh.axis_index(axis)] = digit
        first = members[row_major_index(coordinate, mesh.axis_sizes)]
        replicas = tuple(a for a in mesh.axis_names if a not in spec.axes)
        return mesh.group(first, replicas) if replicas else (first,)

    sizes = ", ".join(f"{n}={s}" for n, s in mesh.shape.items())
    title = f"{spec!r} of {shape} on ({sizes})"
    if mesh.num_instances > 1:
        title += f", the instance holding rank {rank} (one of {mesh.num_instances})"
    if spec.partial:
        title += f"; a pending sum along {', '.join(spec.partial)}"
    return sharding_grid(title, splits, holders, hosts, limits)


def sharding_text(value: Any, shape: Sequence[int] | None = None, topology: Topology | None = None,
                  gpus_per_node: int | None = None, *, rank: int | None = None) -> str:
    """Which ranks hold which block of a tensor, as text: ``value`` is a :class:`~fmesh.spmd.spec.Sharding` with
    the tensor's global ``shape``, or a DTensor. Each box is as wide and as tall as its block; ``‖`` and ``=`` mark
    where the host changes. A mesh of several instances (a sub-mesh) is drawn in the one holding ``rank`` (by
    default a DTensor's own process, else the first).

    >>> import fmesh
    >>> from fmesh.spmd import P
    >>> print(sharding_text(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P("dp")), (4, 6), gpus_per_node=2))
    P('dp') of (4, 6) on (dp=2, tp=2)
    rows: dimension 0 (4 in 2), columns: dimension 1 (6 in 1)
    each block (2, 6)
    hosts: 2 hosts of 2 ranks (block order); ‖ and = mark where the host changes
    <BLANKLINE>
             0:6
         +----------+
    0:2  | rank 0,1 |
         +==========+
    2:4  | rank 2,3 |
         +----------+
    """
    sharding, shape, rank = _drawn(value, shape, rank)
    hosts = picture_hosts(sharding.mesh.world_size, topology, gpus_per_node)
    return text(_grid(sharding, shape, rank, hosts, TEXT_LIMITS))


def sharding_html(value: Any, shape: Sequence[int] | None = None, topology: Topology | None = None,
                  gpus_per_node: int | None = None, *, rank: int | None = None) -> str:
    """The same picture as notebook HTML: one coloured cell per block, as large as the block, thick host lines.

    >>> import fmesh
    >>> from fmesh.spmd import P
    >>> "rank 0,2" in sharding_html(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P("tp")), (4, 6))
    True
    """
    sharding, shape, rank = _drawn(value, shape, rank)
    hosts = picture_hosts(sharding.mesh.world_size, topology, gpus_per_node)
    return markup(_grid(sharding, shape, rank, hosts, HTML_LIMITS), "fmesh-sharding")
