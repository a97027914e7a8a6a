"""Which communicators a set of meshes needs, in which order: the one planner of distinct groups.

Asked for meshes (every axis, one by one) and ``(mesh, axes)`` pairs, :func:`plan_communicators` lists each
distinct communicator once, in the order it is first asked for, with every request that uses it. Two requests
share a communicator exactly when every rank's group has the same ranks in the same order: the same universe,
the same frame (re-indexing) and the same coalesced layout of the axes (a rank ``r``'s group is
``r - layout(i_r) + layout(j)`` for every ``j``). A communicator of size 1 is a group of one rank each.

Pure: no torch, no process group. :meth:`fmesh.Context.plan` adds the backend, the options and the process
groups on top; :mod:`fmesh.plan.manifest` writes the plan of a training job down.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
>>> plan = plan_communicators(requests_of([mesh, mesh["tp"], (mesh, ("tp", "dp"))]))
>>> [(c.order, c.size, [r.label for r in c.requests]) for c in plan.communicators]
[(0, 2, ['dp']), (1, 4, ['tp', 'tp']), (2, 8, ['tp*dp'])]
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from fmesh.layout.layout import Layout
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg

__all__ = ["Communicator", "CommunicatorPlan", "Request", "plan_communicators", "requests_of"]

PlanItem = Mesh | tuple[Mesh, AxesArg]
"""What a plan is asked for: a mesh (each of its axes in turn) or a ``(mesh, axes)`` pair."""

Key = tuple[str, tuple[Layout, ...], Layout]


@attrs.frozen
class Request:
    """One use of a communicator: the groups of ``mesh`` along ``axes``, named ``label`` in a plan."""

    mesh: Mesh
    axes: tuple[str, ...]
    label: str

    @property
    def key(self) -> Key:
        """Equal for two requests exactly when their groups have the same ranks in the same order."""
        return self.mesh.universe.id, self.mesh.frame, self.mesh.axes_layout(self.axes).coalesce()


@attrs.frozen
class Communicator:
    """One distinct communicator: its place in creation order and every request that uses it (first: the one
    that made it)."""

    order: int
    requests: tuple[Request, ...]

    @property
    def first(self) -> Request:
        """The request that asked for it first."""
        return self.requests[0]

    @property
    def layout(self) -> Layout:
        """Its layout, coalesced, over the indices of its universe (re-indexed by the frame, if any)."""
        return self.first.key[2]

    @property
    def size(self) -> int:
        """Ranks per group."""
        return self.layout.size

    @property
    def num_groups(self) -> int:
        """Groups of the first mesh that asked for it (all covered ranks, ``size`` at a time)."""
        return self.first.mesh.num_covered // self.size


@attrs.frozen
class CommunicatorPlan:
    """The distinct communicators of some requests, in creation order; ``of_request[i]`` is the ``order`` of the
    communicator request ``i`` uses.

    >>> CommunicatorPlan((), ()).communicators
    ()
    """

    communicators: tuple[Communicator, ...]
    of_request: tuple[int, ...]


def requests_of(items: Iterable[object], what: str = "plans") -> list[Request]:
    """Meshes (every axis, one by one) and ``(mesh, axes)`` pairs as checked requests, labelled by their axes.

    >>> import fmesh
    >>> [r.label for r in requests_of([fmesh.make_mesh((2, 2), ("dp", "tp"))])]
    ['dp', 'tp']
    """
    found: list[Request] = []
    for item in items:
        if isinstance(item, Mesh):
            found.extend(Request(item, (name,), name) for name in item.axis_names)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Mesh):
            axes = item[0].resolve_axes(item[1])
            found.append(Request(item[0], axes, "*".join(axes)))
        else:
            raise TypeError(f"{what} take meshes or (mesh, axes) pairs, but got {item!r}")
    return found


def plan_communicators(requests: Iterable[Request]) -> CommunicatorPlan:
    """Each distinct communicator of ``requests`` once, in the order first asked for (see the module).

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((4, 2), ("dp", "tp"))
    >>> plan = plan_communicators(requests_of([mesh, fmesh.flatten(mesh, ("dp", "tp"), "all")]))
    >>> [c.size for c in plan.communicators], plan.of_request
    ([4, 2, 8], (0, 1, 2))
    """
    uses: dict[Key, list[Request]] = {}
    of_request: list[int] = []
    order: dict[Key, int] = {}
    for request in requests:
        key = request.key
        if key not in order:
            order[key] = len(order)
            uses[key] = []
        uses[key].append(request)
        of_request.append(order[key])
    communicators = tuple(Communicator(order[key], tuple(found)) for key, found in uses.items())
    return CommunicatorPlan(communicators, tuple(of_request))
