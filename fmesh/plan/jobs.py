"""The job plan: the meshes of a training job, before launching it (what ``python -m fmesh plan`` reports).

:func:`build_plan` takes a world, the ranks per host and the parallelism degrees, and answers with
every mesh the job uses, its groups, rank 0's group and how many hosts each group touches, as a
:class:`JobPlan` (:meth:`JobPlan.to_json` for ``--json``); :func:`fmesh.plan.job_table.format_plan` makes a table
of it. Everything is layout arithmetic: a plan for a million ranks takes a fraction of a second, and no process
group is ever created.

>>> [mesh.name for mesh in build_plan(16, 8, tp=8).meshes][:3]
['pp', 'dp_replicate', 'dp_shard']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fmesh.layout.int_tuple import is_int
from fmesh.mesh import Mesh
from fmesh.plan.communicators import Request
from fmesh.plan.costs import Collective, Estimate, Links, as_links, estimate_span, format_bytes, format_seconds
from fmesh.plan.parallel import DEGREE_NAMES, ParallelDims
from fmesh.plan.topology import HUNGRY_AXES, AxisSpan, RankOrder, Topology, check_placement

__all__ = ["DEFAULT_COST_BYTES", "REPRESENTATIVE", "JobPlan", "PlannedMesh", "build_plan", "job", "job_degrees",
           "job_meshes", "job_requests"]

_HEAD = 6  # ranks shown before an ellipsis
_FULL = 12  # groups up to this size are shown whole


def _rank0_group(mesh: Mesh) -> tuple[tuple[int, ...], bool]:
    """Rank 0's group along all axes of ``mesh``: the first few ranks and the last, and whether that is all."""
    if mesh.size <= _FULL or mesh.frame or mesh.pinned.size > 1:
        group = mesh.group(0)
        if len(group) <= _FULL:
            return tuple(group), True
        return (*group[:_HEAD], group[-1]), False
    # Without enumerating: rank 0's group is base + layout(i), read through the universe's rank map.
    layout = mesh.axes_layout()
    _, base = layout.decompose(mesh.universe.slot_of(0))
    indices = [*range(_HEAD), mesh.size - 1]
    return tuple(mesh.universe.rank_of(base + layout(i)) for i in indices), False



REPRESENTATIVE: dict[str, Collective] = {
    "pp": "send",  # activations to the next stage
    "dp_replicate": "all_reduce",  # gradients (DDP, HSDP's replicas)
    "dp": "all_reduce",
    "dp_cp": "all_reduce",  # the loss
    "dp_shard": "reduce_scatter",  # FSDP gradients (its all_gather of parameters costs the same)
    "dp_shard_cp": "reduce_scatter",
    "efsdp": "reduce_scatter",
    "fsdp_mesh": "reduce_scatter",
    "expert_fsdp_mesh": "reduce_scatter",
    "cp": "all_gather",  # keys and values
    "tp": "all_reduce",  # activations
    "etp": "all_reduce",
    "ep": "all_to_all",  # tokens to their experts
}
"""The collective the plan's cost column times for each mesh (``all_reduce`` for any other name)."""

DEFAULT_COST_BYTES = 2**28
"""Bytes of the representative collective in the plan's cost column (256 MiB)."""


def job(world_size: int, gpus_per_node: int, *, rank_order: RankOrder = "block", **degrees: int
        ) -> tuple[ParallelDims, Topology]:
    """The degrees and hosts of a job, checked: what :func:`build_plan` and :func:`job_meshes` start from.

    >>> job(16, 8, tp=8)[1]
    Topology(hosts=2, ranks_per_host=8, block)
    """
    for key in degrees:
        if key not in DEGREE_NAMES:
            raise TypeError(f"unknown degree {key!r}: valid degrees are {DEGREE_NAMES}")
    if not is_int(gpus_per_node) or gpus_per_node < 1:
        raise ValueError(f"gpus per node must be a positive int, got {gpus_per_node!r}")
    dims = ParallelDims(
        world_size,
        pp=degrees.get("pp", 1),
        dp_replicate=degrees.get("dp_replicate", 1),
        dp_shard=degrees.get("dp_shard", -1),
        cp=degrees.get("cp", 1),
        tp=degrees.get("tp", 1),
        ep=degrees.get("ep", 1),
        etp=degrees.get("etp", 1),
    )
    if world_size % gpus_per_node != 0:
        raise ValueError(
            f"world size {world_size} is not a multiple of {gpus_per_node} gpus per node: hosts must be full"
        )
    return dims, Topology(world_size // gpus_per_node, gpus_per_node, rank_order)


def job_degrees(dims: ParallelDims) -> dict[str, int]:
    """Every degree of ``dims`` (:data:`~fmesh.plan.parallel.DEGREE_NAMES`, then ``efsdp``), as plans and manifests
    record them.

    >>> job_degrees(ParallelDims(8, tp=2))
    {'pp': 1, 'dp_replicate': 1, 'dp_shard': 4, 'cp': 1, 'tp': 2, 'ep': 1, 'etp': 1, 'efsdp': 8}
    """
    return {**{name: getattr(dims, name) for name in DEGREE_NAMES}, "efsdp": dims.efsdp}




def job_meshes(dims: ParallelDims) -> list[tuple[str, Mesh]]:
    """Every mesh a training job uses, by name, in the order the plan lists them: the 1-D meshes
    (the expert ones only with ``ep > 1``), then the meshes given to ``fully_shard``. Handing these to
    ``ctx.materialize(*meshes)`` creates the groups :mod:`fmesh.plan.manifest` lists, in its order.

    >>> [name for name, _ in job_meshes(ParallelDims(8, tp=2))][-3:]
    ['dp_shard_cp', 'dp_cp', 'fsdp_mesh']
    """
    rows = [(name, mesh) for name, mesh in dims.meshes().items()
            if dims.ep_enabled or name not in ("ep", "efsdp", "etp")]
    rows.append(("fsdp_mesh", dims.fsdp_mesh()))
    if dims.ep_enabled:
        rows.append(("expert_fsdp_mesh", dims.expert_fsdp_mesh()))
    return rows


def job_requests(dims: ParallelDims) -> list[Request]:
    """Every mesh of :func:`job_meshes`, axis by axis, as the requests a :class:`~fmesh.Context` plans in that
    order; each is labelled ``mesh`` (a 1-D mesh) or ``mesh.axis``, the names the manifest lists.

    >>> [r.label for r in job_requests(ParallelDims(8, dp_replicate=2, tp=2))][-3:]
    ['dp_cp', 'fsdp_mesh.dp_replicate', 'fsdp_mesh.dp_shard_cp']
    """
    return [Request(mesh, (axis,), name if mesh.ndim == 1 else f"{name}.{axis}")
            for name, mesh in job_meshes(dims) for axis in mesh.axis_names]


def _crossing_warnings(spans: dict[str, AxisSpan], gpus_per_node: int, nbytes: int, links: Links) -> list[str]:
    """One warning per bandwidth-hungry axis whose groups cross hosts, with what the crossing costs."""
    messages = []
    for name in HUNGRY_AXES:
        span = spans.get(name)
        if span is None or span.size == 1 or span.intra_host:
            continue
        collective = REPRESENTATIVE.get(name, "all_reduce")
        here = estimate_span(collective, nbytes, span, links)
        inside = estimate_span(collective, nbytes, attrs.evolve(span, hosts_min=1, hosts_max=1,
                                                                 local_min=span.size, local_max=span.size), links)
        ratio = here.seconds / inside.seconds if inside.seconds else float("inf")
        fixable = check_placement(spans, hungry=(name,))
        why = (fixable[0] if fixable else
               f"{name} groups (size {span.size}) span {span.hosts_max} hosts each"
               + (f": more ranks than the {gpus_per_node} gpus of one host" if span.size > gpus_per_node else ""))
        messages.append(
            f"{why}; {collective} of {format_bytes(nbytes)} along {name} takes {format_seconds(here.seconds)} "
            f"across hosts against {format_seconds(inside.seconds)} inside one ({ratio:.1f}x)"
        )
    return messages


@attrs.frozen
class PlannedMesh:
    """One mesh of a plan: its axes, groups, rank 0's group (the first few ranks and the last unless
    ``rank0_group_complete``), the hosts a group touches, and the cost of its representative collective."""

    name: str
    axes: tuple[tuple[str, int], ...]
    size: int
    num_groups: int
    rank0_group: tuple[int, ...]
    rank0_group_complete: bool
    hosts_per_group: int
    hosts_per_group_min: int
    placement: str
    cost: Estimate

    def to_json(self) -> dict[str, Any]:
        """The mesh as ``plan --json`` prints it."""
        return {
            "name": self.name,
            "axes": dict(self.axes),
            "size": self.size,
            "num_groups": self.num_groups,
            "rank0_group": list(self.rank0_group),
            "rank0_group_complete": self.rank0_group_complete,
            "hosts_per_group": self.hosts_per_group,
            "hosts_per_group_min": self.hosts_per_group_min,
            "placement": self.placement,
            "cost": {"collective": self.cost.collective, "bytes": self.cost.nbytes, "seconds": self.cost.seconds,
                     "algorithm": self.cost.algorithm},
        }


@attrs.frozen
class JobPlan:
    """What :func:`build_plan` answers: the job, its meshes in order, and warnings about their placement."""

    world_size: int
    gpus_per_node: int
    hosts: int
    rank_order: RankOrder
    degrees: tuple[tuple[str, int], ...]  # job_degrees, in its order
    data_parallel: str
    links: str
    meshes: tuple[PlannedMesh, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The plan as ``plan --json`` prints it.

        >>> sorted(build_plan(16, 8, tp=8).to_json())[:4]
        ['data_parallel', 'degrees', 'gpus_per_node', 'hosts']
        """
        return {
            "world_size": self.world_size,
            "gpus_per_node": self.gpus_per_node,
            "hosts": self.hosts,
            "rank_order": self.rank_order,
            "degrees": dict(self.degrees),
            "data_parallel": self.data_parallel,
            "links": self.links,
            "meshes": [mesh.to_json() for mesh in self.meshes],
            "warnings": list(self.warnings),
        }


def build_plan(
    world_size: int,
    gpus_per_node: int,
    *,
    rank_order: RankOrder = "block",
    cost_bytes: int = DEFAULT_COST_BYTES,
    links: Links | Mapping[str, Any] | None = None,
    **degrees: int,
) -> JobPlan:
    """The plan: degrees, each mesh with its groups, hosts and the cost of its representative collective
    (:data:`REPRESENTATIVE`, ``cost_bytes`` bytes, :func:`fmesh.cost` on ``links``), and warnings.
    :meth:`JobPlan.to_json` makes JSON-ready data of it.

    ``degrees`` are :class:`~fmesh.ParallelDims` keywords (``pp``, ``dp_replicate``,
    ``dp_shard``, ``cp``, ``tp``, ``ep``, ``etp``).

    >>> plan = build_plan(16, 8, dp_replicate=2, tp=8)
    >>> [(m.name, m.placement) for m in plan.meshes][:5]
    [('pp', 'intra-host'), ('dp_replicate', 'inter-host'), ('dp_shard', 'intra-host'), ('cp', 'intra-host'), \
('tp', 'intra-host')]
    >>> plan.meshes[4].cost.collective, plan.meshes[4].cost.nbytes
    ('all_reduce', 268435456)
    """
    if not is_int(cost_bytes) or cost_bytes < 0:
        raise ValueError(f"expected cost bytes as a non-negative int, but got {cost_bytes!r}")
    link = as_links(links)
    dims, topo = job(world_size, gpus_per_node, rank_order=rank_order, **degrees)
    rows = job_meshes(dims)
    spans = {name: topo.span(mesh, name=name) for name, mesh in rows}
    meshes = []
    for name, mesh in rows:
        span = spans[name]
        ranks, complete = _rank0_group(mesh)
        meshes.append(PlannedMesh(
            name=name, axes=tuple(mesh.shape.items()), size=mesh.size, num_groups=span.num_groups,
            rank0_group=ranks, rank0_group_complete=complete, hosts_per_group=span.hosts_max,
            hosts_per_group_min=span.hosts_min, placement=span.placement,
            cost=estimate_span(REPRESENTATIVE.get(name, "all_reduce"), cost_bytes, span, link),
        ))
    one_d = {name: span for name, span in spans.items() if not name.endswith("_mesh")}
    return JobPlan(
        world_size=world_size, gpus_per_node=gpus_per_node, hosts=topo.hosts, rank_order=rank_order,
        degrees=tuple(job_degrees(dims).items()), data_parallel=dims.data_parallel, links=link.name,
        meshes=tuple(meshes), warnings=tuple(_crossing_warnings(one_d, gpus_per_node, cost_bytes, link)),
    )
