"""Shardings as DTensor placements on the mesh's exported ``DeviceMesh``, and back.

One placement per mesh axis (the exported ``DeviceMesh`` has one dim per axis, whatever the axis is: permuted,
flattened or sliced): ``Shard(d)`` where the spec names the axis at dimension ``d``, ``Partial()`` where the
spec lists it as partial, ``Replicate()`` otherwise. Several axes on one dimension are ``Shard(d)`` on each;
DTensor splits them in mesh-dim order, so the spec must list them in the mesh's order (the other orders need
DTensor's ``_StridedShard``, whose meaning changed across torch 2.10–2.15: refused, with the fix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.distributed.tensor import Partial, Replicate, Shard

from fmesh.mesh import Mesh
from fmesh.spmd.spec import PartitionSpec, Sharding, check_spec, dim_axes


def to_placements(sharding: Sharding) -> tuple[Any, ...]:
    """DTensor placements (one per mesh axis) of ``sharding``.

    >>> import fmesh
    >>> from fmesh.spmd.spec import P
    >>> to_placements(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P(None, "tp", partial="dp")))
    (Partial(sum), Shard(dim=1))
    """
    mesh, spec = sharding.mesh, sharding.spec
    placements: list[Any] = [Replicate()] * mesh.ndim
    for d, entry in enumerate(spec.entries):
        axes = dim_axes(entry)
        order = [mesh.axis_index(a) for a in axes]
        if order != sorted(order):
            in_mesh_order = tuple(sorted(axes, key=mesh.axis_index))
            raise ValueError(
                f"{spec!r}: DTensor splits a dimension over several axes in the mesh's order {mesh.axis_names}; "
                f"expected {in_mesh_order!r} at dimension {d}, but got {axes!r} (permute the mesh's axes, "
                "e.g. mesh.rename/transpose, or list them in its order)")
        for index in order:
            placements[index] = Shard(d)
    for axis in spec.partial:
        placements[mesh.axis_index(axis)] = Partial()
    return tuple(placements)


def grad_placements(sharding: Sharding) -> tuple[Any, ...]:
    """The placements of the gradient of a value placed by ``sharding``: ``Partial()`` along its ``reduced`` axes
    (the gradient left a pending sum there), else its own.

    >>> import fmesh
    >>> from fmesh.spmd.spec import P
    >>> grad_placements(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P(None, "tp", reduced="dp")))
    (Partial(sum), Shard(dim=1))
    """
    placements = list(to_placements(sharding))
    for axis in sharding.spec.reduced:
        placements[sharding.mesh.axis_index(axis)] = Partial()
    return tuple(placements)


def from_placements(mesh: Mesh, placements: Sequence[Any]) -> Sharding:
    """The sharding whose placements on ``mesh``'s export are ``placements``.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    >>> from_placements(mesh, (Shard(0), Shard(0))).spec
    P(('dp', 'tp'))
    """
    if len(placements) != mesh.ndim:
        raise ValueError(f"expected {mesh.ndim} placements (one per axis of {mesh.axis_names}), "
                         f"but got {len(placements)}: {tuple(placements)!r}")
    dims: dict[int, list[str]] = {}
    partial: list[str] = []
    for axis, placement in zip(mesh.axis_names, placements, strict=True):
        if type(placement) is Shard:
            dims.setdefault(placement.dim, []).append(axis)
        elif isinstance(placement, Partial):
            if placement.reduce_op != "sum":  # a spec's partial= is a pending sum; a pending mean, max... is not
                raise ValueError(
                    f"axis {axis!r}: expected a Partial sum (a spec's partial=), but got {placement!r}: a pending "
                    f"{placement.reduce_op} has no spec; fix: redistribute it to Replicate() (or, for a pending "
                    "mean, divide each member's value by the axis size and use Partial())")
            partial.append(axis)
        elif not isinstance(placement, Replicate):
            raise ValueError(f"axis {axis!r}: expected Shard, Replicate or Partial, but got {placement!r} "
                             "(a strided shard has no spec: its axes split a dimension out of the mesh's order)")
    if any(d < 0 for d in dims):
        raise ValueError(f"expected non-negative Shard dims, but got {sorted(dims)}")
    entries = [tuple(dims.get(d, ())) for d in range(max(dims, default=-1) + 1)]
    return Sharding(mesh, check_spec(mesh, PartitionSpec(*entries, partial=partial)))


def place(tensor: Any, sharding: Sharding, ctx: Any) -> Any:
    """``tensor`` (the whole, the same on every rank) placed by ``sharding`` as a DTensor on
    ``ctx.device_mesh(sharding.mesh)`` (JAX's ``device_put(x, NamedSharding(...))``); a partial axis keeps the
    whole on the member at coordinate 0 and zeros on the others.

    >>> import fmesh, torch
    >>> from fmesh.spmd.spec import P
    >>> with fmesh.Context.fake(2) as ctx:
    ...     mesh = fmesh.make_mesh((2,), ("tp",))
    ...     placed = place(torch.arange(4.0), Sharding(mesh, P("tp")), ctx)
    ...     placed.placements, placed.to_local().shape
    ((Shard(dim=0),), torch.Size([2]))
    """
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(tensor, ctx.device_mesh(sharding.mesh), to_placements(sharding))
