"""Recovering from lost ranks: which ranks form the new world.

Pure functions; :meth:`fmesh.Context.recover` acts on them. The new world is the survivors, renumbered
``0, 1, ...`` in ascending order of their old rank (as :func:`fmesh.without` and
:func:`fmesh.plan.rescale.scale_down` number them), or the ranks of a mesh made by :func:`fmesh.without`. What
becomes of each group this rank holds (keep, shrink or create) is the planner's one rule,
:func:`fmesh.plan.communicators.renewal`, which ``python -m fmesh plan --lose`` prints by too.
"""

from __future__ import annotations

from collections.abc import Sequence

from fmesh.layout.int_tuple import is_int, is_many
from fmesh.mesh import Mesh
from fmesh.mesh.elastic import old_rank


def check_lost(lost: object, world_size: int, rank: int) -> tuple[int, ...]:
    """``lost`` as sorted distinct ranks of a world of ``world_size``, checked from where ``rank`` stands:
    ``TypeError``/``ValueError`` naming the offending value otherwise.

    >>> check_lost({3, 1}, 4, 0)
    (1, 3)
    >>> check_lost([0], 4, 0)
    Traceback (most recent call last):
    ...
    ValueError: recover: rank 0 is calling recover, so it is not lost; expected the ranks that are gone, but got [0]
    """
    if not is_many(lost):
        raise TypeError(f"recover: expected an iterable of lost ranks such as [3], but got {lost!r}")
    ranks = list(lost)
    bad = [r for r in ranks if not is_int(r) or not 0 <= r < world_size]
    if bad:
        raise ValueError(f"recover: expected lost ranks in 0..{world_size - 1}, but got {bad!r} in {ranks!r}")
    if not ranks:
        raise ValueError("recover: expected at least one lost rank, but got none; a world that lost nobody "
                         "needs no recovery")
    if rank in ranks:
        raise ValueError(f"recover: rank {rank} is calling recover, so it is not lost; expected the ranks that are "
                         f"gone, but got {ranks!r}")
    return tuple(sorted(set(ranks)))


def new_world(world_size: int, lost: Sequence[int], mesh: Mesh | None = None) -> tuple[int, ...]:
    """The old ranks of the new world, in new rank order: the survivors in ascending order, or, given a
    ``mesh`` made from the old world by :func:`fmesh.without` (or a shrinking :func:`fmesh.resize`), the
    ranks it covers (a survivor outside it leaves the job).

    >>> new_world(4, (1,))
    (0, 2, 3)
    >>> import fmesh
    >>> new_world(4, (3,), fmesh.without(fmesh.make_mesh((2, 2), ("dp", "tp")), [3], "dp"))
    (0, 1)
    """
    if mesh is None:
        return tuple(r for r in range(world_size) if r not in set(lost))
    if not isinstance(mesh, Mesh):
        raise TypeError(f"recover: expected an fmesh.Mesh made by fmesh.without(), but got {mesh!r}")
    lineage = mesh.universe.lineage
    if lineage is None or lineage.parent.world_size != world_size:
        found = "has no lineage" if lineage is None else f"comes from a world of {lineage.parent.world_size}"
        raise ValueError(f"recover: expected a mesh made from this world of {world_size} ranks by "
                         f"fmesh.without(mesh, lost, axis), but {mesh!r} {found}")
    olds = [old_rank(mesh, r) for r in range(mesh.world_size)]
    if any(r is None for r in olds):
        raise ValueError(f"recover: {mesh!r} adds ranks (a grow): recover shrinks onto survivors only; expected a "
                         "mesh made by fmesh.without()")
    kept = [r for r in olds if r is not None]
    still = sorted(set(kept).intersection(lost))
    if still:
        raise ValueError(f"recover: {mesh!r} still holds lost ranks {still}; expected fmesh.without(mesh, "
                         f"{list(lost)}, axis), which drops every slice holding one")
    return tuple(kept)
