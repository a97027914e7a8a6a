"""Rescaling a job: the degrees of a training job after ranks are lost or join, as pure values.

A job *scales down* or *up* ("shrink" is kept for a communicator that drops members,
:mod:`fmesh.plan.communicators`). :func:`scale_down` answers a loss and :func:`scale_up` a join with a new
:class:`~fmesh.ParallelDims` whose meshes live in the universe :func:`fmesh.without`/:func:`fmesh.resize` make, so
:func:`fmesh.old_rank` and :func:`fmesh.new_rank` convert ranks between the two jobs from any of
its meshes. One axis absorbs the change, the first of ``axes`` that can:

* ``dp_replicate`` first: dropping a replica loses no state (every other replica holds a full copy
  of the sharded model and optimizer), and the replicas that remain keep their shards;
* then ``dp_shard``: the parameters and optimizer state are resharded over fewer (or more) ranks,
  so they must be loaded again (from a checkpoint, or from the survivors);
* ``pp`` only when ``axes`` names it: losing a stage re-splits the model's layers over fewer stages.

``tp`` and ``cp`` never absorb a change: every member of a tensor- or context-parallel group holds
a part of each step's computation that the others wait for, so a group cannot lose one. Dropping a
slice drops every rank at that coordinate of the axis, also the ranks that did not fail: a loss in
replica 1 drops all of replica 1. The groups of the smaller job are exactly those of a restarted
job with that degree, for every mesh of :data:`fmesh.plan.parallel.MESH_NAMES`, and every group of the
smaller job is the survivors of a group of the old one, except the expert meshes when ``dp_shard``
changes and ``ep * etp`` does not divide ``cp * tp`` (``ep`` is carved from ``dp_shard * cp * tp``, so
the experts are laid out again); where the smaller ``dp_shard`` leaves no valid ``ep``, that axis
cannot absorb the loss and the error says why.

>>> import fmesh
>>> dims = fmesh.ParallelDims(16, dp_replicate=2, dp_shard=4, tp=2)
>>> smaller = fmesh.plan.rescale.scale_down(dims, [9])
>>> smaller
ParallelDims(world_size=8, pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=2, ep=1, etp=1)
>>> smaller.mesh("dp_shard").group(0), fmesh.old_rank(smaller.world_mesh, 0)
((0, 2, 4, 6), 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fmesh.layout.int_tuple import is_int, is_many
from fmesh.mesh import Mesh, resize, without
from fmesh.plan.parallel import WORLD_AXES, ParallelDims

__all__ = ["ELASTIC_AXES", "scale_down", "scale_up"]

ELASTIC_AXES: tuple[str, ...] = ("dp_replicate", "dp_shard")
"""The axes that absorb a loss or a join unless told otherwise, in the order tried."""

_ABSORBING = ("pp", "dp_replicate", "dp_shard")
_WHY_NOT = (
    "tp and cp cannot absorb a change: every member of a tensor- or context-parallel group holds a part "
    "of each step's computation that the others wait for"
)


def scale_down(dims: ParallelDims, lost: Iterable[int], *, axes: Sequence[str] = ELASTIC_AXES) -> ParallelDims:
    """The job left when ranks ``lost`` are gone: every slice along the first of ``axes`` that can
    absorb the loss and holds a lost rank is dropped (see :func:`fmesh.without`), and the survivors
    are renumbered in ascending order.

    ``ValueError`` when no axis of ``axes`` can: the lost ranks are in every slice of it, or the
    smaller degree leaves no valid expert-parallel layout; the message gives each axis's reason.

    >>> import fmesh
    >>> dims = fmesh.ParallelDims(8, dp_shard=4, tp=2)
    >>> fmesh.plan.rescale.scale_down(dims, [3]).degrees["dp_shard"]
    3
    >>> fmesh.plan.rescale.scale_down(dims, [3], axes=("pp",))
    Traceback (most recent call last):
    ...
    ValueError: no axis of ('pp',) can absorb the loss of ranks [3] in ParallelDims(world_size=8, pp=1, \
dp_replicate=1, dp_shard=4, cp=1, tp=2, ep=1, etp=1): pp=1: the lost ranks lie in all 1 of its slices
    """
    order = _check_axes(axes)
    if not is_many(lost):
        raise TypeError(f"scale_down takes an iterable of lost ranks such as [5], got {lost!r}")
    lost = sorted(set(lost))
    if not lost:
        raise ValueError("scale_down needs at least one lost rank, got none")
    world = dims.world_mesh
    for rank in lost:
        world.universe.check_rank(rank)
    reasons = []
    for axis in order:
        position = world.axis_index(axis)
        size = world.axis_sizes[position]
        hit = {coordinate[position] for coordinate in map(world.coordinate, lost) if coordinate is not None}
        if len(hit) == size:
            reasons.append(f"{axis}={size}: the lost ranks lie in all {size} of its slices")
            continue
        try:
            return _dims(dims, without(world, lost, axis))
        except ValueError as error:
            reasons.append(f"{axis} {size} -> {size - len(hit)}: {error}")
    raise ValueError(f"no axis of {order} can absorb the loss of ranks {lost} in {dims!r}: " + "; ".join(reasons)
                     + ("" if "pp" in order else f" (pp is tried only when axes names it; {_WHY_NOT})"))


def scale_up(dims: ParallelDims, joining: int, *, axes: Sequence[str] = ELASTIC_AXES) -> ParallelDims:
    """The job after ``joining`` ranks join: the first of ``axes`` whose slices they fill (a whole
    number of replicas for ``dp_replicate``, of ``dp_shard`` slices for ``dp_shard``) grows (see
    :func:`fmesh.resize`); the old ranks keep their numbers, the new ones are numbered after them.

    >>> import fmesh
    >>> dims = fmesh.ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
    >>> larger = fmesh.plan.rescale.scale_up(dims, 4)
    >>> larger.degrees["dp_replicate"], fmesh.new_rank(larger.world_mesh, 7)
    (3, 7)
    >>> fmesh.plan.rescale.scale_up(dims, 4, axes=("dp_shard",)).degrees["dp_shard"]
    3
    """
    order = _check_axes(axes)
    if not is_int(joining) or joining < 1:
        raise ValueError(f"scale_up: expected a positive int count of joining ranks, got {joining!r}")
    world = dims.world_mesh
    reasons = []
    for axis in order:
        size = world.shape[axis]
        block = world.world_size // size  # the ranks of one slice along the axis
        if joining % block:
            reasons.append(f"{axis}: a slice along it has {block} ranks, and {joining} is not a multiple of {block}")
            continue
        try:
            return _dims(dims, resize(world, axis, size + joining // block))
        except ValueError as error:
            reasons.append(f"{axis} {size} -> {size + joining // block}: {error}")
    raise ValueError(f"no axis of {order} can absorb {joining} joining ranks in {dims!r}: " + "; ".join(reasons))


def _dims(dims: ParallelDims, world: Mesh) -> ParallelDims:
    universe = world.universe
    return ParallelDims(
        world.world_size,
        **dict(world.shape),
        ep=dims.ep,
        etp=dims.etp,
        device_type=dims.device_type,
        rank_map=None if universe.is_identity else universe.rank_map,
        lineage=universe.lineage,
    )


def _check_axes(axes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(axes, str) or not isinstance(axes, Sequence) or not axes:
        raise TypeError(f"axes must be a non-empty sequence of axis names such as {ELASTIC_AXES}, got {axes!r}")
    for axis in axes:
        if axis in ("tp", "cp"):
            raise ValueError(f"axes names {axis!r}: {_WHY_NOT}; choose from {_ABSORBING}")
        if axis not in _ABSORBING:
            raise ValueError(f"unknown axis {axis!r} in axes: expected names from {_ABSORBING} "
                             f"(the world axes are {WORLD_AXES})")
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes {tuple(axes)!r} names an axis twice")
    return tuple(axes)
