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

from collections.abc import Container, Iterable, Sequence
from typing import Literal, get_args

import attrs

from fmesh.layout.int_tuple import is_int
from fmesh.layout.layout import Layout
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg

__all__ = ["ACTIONS", "CREATE", "KEEP", "SHRINK", "SHRINK_NCCL", "SHRINK_TORCH", "Action", "Communicator",
           "CommunicatorPlan", "Request", "can_shrink", "plan_communicators", "renewal", "renewals", "requests_of"]

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


# ------------------------------------------------------------------------ after a loss: the one rule

Action = Literal["keep", "shrink", "create"]
"""What becomes of a communicator after a loss (:func:`renewal`)."""
ACTIONS: tuple[Action, ...] = get_args(Action)
KEEP, SHRINK, CREATE = ACTIONS

SHRINK_TORCH: tuple[int, int] = (2, 10)
"""The first torch release with ``torch.distributed.shrink_group`` (pytorch/pytorch#164518; 2.10.0 has it)."""

SHRINK_NCCL: tuple[int, int, int] = (2, 27, 0)
"""The first NCCL with ``ncclCommShrink``: torch's NCCL backend reports ``supports_shrinking`` only when built with
NCCL >= 2.27 (``NCCL_HAS_COMM_SHRINK``), and its shrink checks the NCCL it runs with against the same version."""


def can_shrink(backend: str, torch_release: tuple[int, int], nccl_version: tuple[int, ...] | None = None) -> bool:
    """Whether a communicator of ``backend`` can be shrunk: NCCL only, with torch >= :data:`SHRINK_TORCH` and NCCL
    >= :data:`SHRINK_NCCL` (``torch.cuda.nccl.version()``; ``None``: unknown, so no). Gloo cannot (its backend does
    not support shrinking in any torch release up to 2.15), nor can any other backend.

    >>> can_shrink("nccl", (2, 13), (2, 27, 5)), can_shrink("nccl", (2, 13), (2, 26, 2)), can_shrink("gloo", (2, 15))
    (True, False, False)
    """
    if not isinstance(backend, str):
        raise TypeError(f"expected a backend name such as 'nccl' or 'gloo', but got {backend!r}")
    if not (isinstance(torch_release, tuple) and len(torch_release) == 2 and all(map(is_int, torch_release))):
        raise TypeError(f"expected the torch release as (major, minor) such as (2, 13), but got {torch_release!r}")
    if nccl_version is not None and not (isinstance(nccl_version, tuple) and all(map(is_int, nccl_version))):
        raise TypeError(f"expected the NCCL version as a tuple such as (2, 27, 5) or None, but got {nccl_version!r}")
    return (backend == "nccl" and torch_release >= SHRINK_TORCH and nccl_version is not None
            and nccl_version >= SHRINK_NCCL)


def renewal(members: Sequence[int], kept: Container[int], *, shrinkable: bool,
            held_everywhere: bool = True) -> Action:
    """What becomes of the communicator of ``members`` (old ranks, in group order) when only the old ranks in
    ``kept`` go on (the new world: a survivor that :func:`fmesh.without` dropped is not kept). The one rule, read
    by the printed plan (:func:`fmesh.plan.recovery.plan_recovery`, ``python -m fmesh plan --lose``) and by what
    runs (:meth:`fmesh.Context.recover`):

    * ``keep``: every member goes on: the same communicator, renumbered;
    * ``shrink``: some do not, at least two do, and the backend can drop members in place (``shrinkable``:
      :func:`can_shrink`); the members that do not go on, lost or dropped alive, are excluded from it;
    * ``create``: anything else: aborted now, made anew when the new job first needs it.

    ``held_everywhere``: whether every member holds the communicator (one still connecting it cannot keep it; a
    planned job holds every one).

    ``ParallelDims(8, dp_shard=4, tp=2)`` losing rank 2 goes on without ranks 2 and 3 (the slice of dp_shard
    that held rank 2): the dp_shard group ``(1, 3, 5, 7)`` lost no member but rank 3 does not go on, so it is
    shrunk to ``(1, 5, 7)`` where the backend can, and made anew where it cannot:

    >>> kept = (0, 1, 4, 5, 6, 7)
    >>> renewal((1, 3, 5, 7), kept, shrinkable=True), renewal((1, 3, 5, 7), kept, shrinkable=False)
    ('shrink', 'create')
    >>> renewal((4, 5), kept, shrinkable=False), renewal((2, 3), kept, shrinkable=True)
    ('keep', 'create')
    """
    going_on = sum(1 for member in members if member in kept)
    if going_on == len(members) and held_everywhere:
        return KEEP
    if shrinkable and going_on > 1 and held_everywhere:
        return SHRINK
    return CREATE


def renewals(groups: Sequence[Sequence[int]], kept: Container[int], *, shrinkable: Sequence[bool],
             held_everywhere: Sequence[bool]) -> tuple[Action, ...]:
    """:func:`renewal` of every group a rank holds, in the order given (smallest first: ``Context.recover`` sorts
    them by size), where two groups would go on as the same members one communicator is enough: a kept one wins,
    else the first shrunk one; the others are created anew (the printed plan matches each new communicator to the
    smallest old one it can come from, in the same way).

    The ``dp_shard`` × ``cp`` job of 4 ranks losing rank 0 goes on as ranks 2 and 3: the cp group ``(2, 3)`` is
    kept, so the ``dp_shard_cp`` group ``(0, 1, 2, 3)``, which would shrink to the same members, is not:

    >>> renewals([(2, 3), (0, 1, 2, 3)], (2, 3), shrinkable=(True, True), held_everywhere=(True, True))
    ('keep', 'create')
    """
    choices = [renewal(group, kept, shrinkable=can, held_everywhere=held)
               for group, can, held in zip(groups, shrinkable, held_everywhere, strict=True)]
    taken: dict[tuple[int, ...], int] = {}
    for index in sorted(range(len(groups)), key=lambda i: choices[i] != KEEP):  # kept ones first, then in order
        if choices[index] == CREATE:
            continue
        going_on = tuple(member for member in groups[index] if member in kept)
        if going_on in taken:
            choices[index] = CREATE
        else:
            taken[going_on] = index
    return tuple(choices)
