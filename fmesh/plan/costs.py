"""What one collective along some mesh axes costs, from the links its groups cross: :func:`cost`.

Pure arithmetic, no process group. The group along ``axes`` of a mesh is placed on hosts by a
:class:`~fmesh.Topology` (the real layout, the real rank map and the real rank order, via
:meth:`Topology.span`); the slowest group sets the time. The model is NCCL's own (``src/graph/tuning.cc``,
``ncclTopoTuneModel``): an alpha-beta model where each step of a ring costs the latency of the link it
crosses, and the bytes move at the bandwidth of the slowest link in the ring.

For a group of ``p`` ranks on ``h`` hosts, at least ``k`` (at most ``K``) of them on one host, with
``n`` bytes (the nccl-tests convention: the whole buffer of ``all_reduce`` and ``broadcast``, the
*output* of ``all_gather``, the *input* of ``reduce_scatter``, the send buffer of ``all_to_all``):

* bandwidth each rank sees: ``B = intra_bandwidth`` inside one host, else
  ``B = min(intra_bandwidth, k * inter_bandwidth)`` (one NIC per GPU, and NCCL spreads its channels over the
  NICs of the ``k`` local ranks, as on rail-optimised clusters);
* ``all_reduce``: the faster of a ring, ``base + 2(p-h)·a_intra + 2(h-1)·a_inter + 2(p-1)/p · n/B``, and a
  tree, ``base + 2(ceil(log2 K)·a_intra + ceil(log2 h)·a_inter) + 2n/B``;
* ``all_gather``, ``reduce_scatter`` (rings): ``base + (p-h)·a_intra + (h-1)·a_inter + (p-1)/p · n/B``;
* ``broadcast`` (a pipelined chain): ``base + (p-h)·a_intra + (h-1)·a_inter + n/B``;
* ``all_to_all`` (every pair at once, the on-host and off-host parts one after the other, an upper bound):
  ``base + a_intra + a_inter + (k-1)/p · n/intra_bandwidth + (p-k)/p · n/inter_bandwidth``
  (each latency only where that kind of link is crossed);
* ``send`` (to the next member along the axis, over the slowest link of the group): ``base + a + n/b``.

The defaults (:data:`H100_IB`) describe an NVIDIA DGX/HGX H100 host: NVLink 4 gives each GPU 900 GB/s
both directions together, 450 GB/s each way (NVIDIA H100 datasheet), and one 400 Gb/s InfiniBand NDR
(ConnectX-7) NIC per GPU gives 50 GB/s each way (DGX H100 user guide: 8 x 400 Gb/s compute NICs). The
latencies are NCCL's for its Simple protocol (``tuning.cc``: ``baseLat`` ring 8.4 µs; ``hwLat`` ring
3.4 µs per NVLink step and 9.6 µs per network step). These are peak figures: measured NCCL bus bandwidth is
typically 70-90 % of them, and small messages (NCCL's LL protocols) see lower latencies than these.
Override any of them with ``links`` (a :class:`Links` or a mapping of its fields).

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 8), ("dp", "tp"))
>>> block, cyclic = fmesh.Topology(2, 8), fmesh.Topology(2, 8, rank_order="cyclic")
>>> cost(mesh, "tp", "all_reduce", 2**26, block) < cost(mesh, "tp", "all_reduce", 2**26, cyclic)
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypeGuard, get_args

import attrs

from fmesh.layout.int_tuple import is_int
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg
from fmesh.plan.topology import AxisSpan, Topology

__all__ = [
    "COLLECTIVES",
    "H100_IB",
    "LOOPBACK",
    "Collective",
    "Estimate",
    "Links",
    "as_links",
    "cost",
    "estimate",
    "estimate_span",
    "format_bytes",
    "format_seconds",
]

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send"]
"""A collective the model knows (a ``send`` is one point-to-point message)."""

COLLECTIVES: tuple[Collective, ...] = get_args(Collective)
"""The collectives the model knows."""


def _is_number(value: object) -> TypeGuard[int | float]:
    return is_int(value) or isinstance(value, float)


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_number(value) or not value > 0 or math.isinf(value):
        raise ValueError(f"expected {attribute.name} as a positive number, but got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_number(value) or not value >= 0 or math.isinf(value):
        raise ValueError(f"expected {attribute.name} as a non-negative number of seconds, but got {value!r}")


@attrs.frozen
class Links:
    """Per-link bandwidth (bytes per second, each way, per GPU) and latency (seconds per step).

    ``intra_*``: between two ranks of one host; ``inter_*``: between hosts, per NIC (one per GPU);
    ``base_latency``: once per collective (the launch). ``name`` says what hardware the figures describe.

    >>> Links().inter_bandwidth, attrs.evolve(Links(), inter_bandwidth=25e9).inter_bandwidth
    (50000000000.0, 25000000000.0)
    """

    intra_bandwidth: float = attrs.field(default=450e9, validator=_positive)
    inter_bandwidth: float = attrs.field(default=50e9, validator=_positive)
    intra_latency: float = attrs.field(default=3.4e-6, validator=_non_negative)
    inter_latency: float = attrs.field(default=9.6e-6, validator=_non_negative)
    base_latency: float = attrs.field(default=8.4e-6, validator=_non_negative)
    name: str = attrs.field(default="H100 SXM: NVLink 4 (450 GB/s each way) + one 400 Gb/s IB NDR NIC per GPU",
                            kw_only=True)


H100_IB = Links()
"""The defaults: H100 SXM hosts, NVLink 4 inside, one 400 Gb/s InfiniBand NDR NIC per GPU between them."""

LOOPBACK = Links(
    intra_bandwidth=1.19e9, inter_bandwidth=1.19e9, intra_latency=187e-6, inter_latency=187e-6, base_latency=0.0,
    name="gloo over loopback TCP on a 2-core VM (fitted to 2- and 4-process broadcasts, bench/costs.py)",
)
"""Gloo on one 2-core machine's loopback, fitted to broadcasts by ``bench/costs.py`` (see the README's comparison
of the model with the other collectives measured there)."""


def as_links(links: Links | Mapping[str, Any] | None) -> Links:
    """The one normal form of a ``links`` argument: ``None`` is :data:`H100_IB`, a mapping overrides its fields.

    >>> as_links({"inter_bandwidth": 25e9}).inter_bandwidth
    25000000000.0
    """
    if links is None:
        return H100_IB
    if isinstance(links, Links):
        return links
    if isinstance(links, Mapping):
        known = [field.name for field in attrs.fields(Links)]
        unknown = sorted(set(links) - set(known))
        if unknown:
            raise ValueError(f"expected links fields among {known}, but got {unknown}")
        return attrs.evolve(H100_IB, **links)
    raise TypeError(f"expected links as fmesh.plan.costs.Links, a mapping of its fields or None, but got {links!r}")


@attrs.frozen
class Estimate:
    """One collective's estimated time, and what it was computed from.

    >>> estimate_span("all_gather", 1024, AxisSpan("tp", size=1, num_groups=8, hosts_min=1, hosts_max=1))
    Estimate(collective='all_gather', nbytes=1024, seconds=0.0, algorithm='none', size=1, hosts=1, bandwidth=0.0)
    """

    collective: Collective
    nbytes: int
    seconds: float
    algorithm: str
    size: int
    hosts: int
    bandwidth: float  # bytes per second each rank moves at (the slowest link of the group)


def _check_collective(collective: object) -> Collective:
    if collective not in COLLECTIVES:
        raise ValueError(f"expected a collective among {COLLECTIVES}, but got {collective!r}")
    return collective


def _check_bytes(nbytes: object) -> int:
    if not is_int(nbytes) or nbytes < 0:
        raise ValueError(f"expected nbytes as a non-negative int, but got {nbytes!r}")
    return nbytes


def _log2(n: int) -> int:
    return max(0, (n - 1).bit_length())  # ceil(log2 n)


def estimate_span(collective: Collective, nbytes: int, span: AxisSpan, links: Links | Mapping[str, Any] | None = None
                  ) -> Estimate:
    """The model (module docstring) for groups placed as ``span`` says: size, hosts, ranks per host.

    >>> span = AxisSpan("tp", size=8, num_groups=1, hosts_min=1, hosts_max=1)
    >>> e = estimate_span("all_reduce", 2**30, span)
    >>> e.algorithm, round(e.seconds * 1e3, 2)
    ('ring', 4.23)
    """
    collective, nbytes, link = _check_collective(collective), _check_bytes(nbytes), as_links(links)
    p, h = span.size, span.hosts_max
    if p <= 1:
        return Estimate(collective, nbytes, 0.0, "none", p, h, 0.0)
    k, most = span.local_min, span.local_max
    a_in, a_out = link.intra_latency, link.inter_latency
    bandwidth = link.intra_bandwidth if h == 1 else min(link.intra_bandwidth, k * link.inter_bandwidth)
    # Each sum is written as the cost inside one host plus what crossing hosts adds (never negative when the
    # network is no faster than the host's links), so that the two compare exactly in floating point too.
    extra = a_out - a_in
    chain = (p - 1) * a_in + (h - 1) * extra  # one pass around the ring: (p-h) steps inside hosts, (h-1) between
    n = float(nbytes)
    times: dict[str, float] = {}
    if collective == "all_reduce":
        times["ring"] = 2 * chain + 2 * (p - 1) / p * n / bandwidth
        depth = _log2(most) + _log2(h)
        times["tree"] = 2 * (depth * a_in + _log2(h) * extra) + 2 * n / bandwidth
    elif collective in ("all_gather", "reduce_scatter"):
        times["ring"] = chain + (p - 1) / p * n / bandwidth
    elif collective == "broadcast":
        times["ring"] = chain + n / bandwidth
    elif collective == "all_to_all":
        local = k if h > 1 else p
        latency = (a_in if local > 1 else 0.0) + (a_out if h > 1 else 0.0)
        slower = 1 / link.inter_bandwidth - 1 / link.intra_bandwidth
        times["pairwise"] = latency + (p - 1) / p * n / link.intra_bandwidth + (p - local) / p * n * slower
    else:  # send
        step, rate = (a_in, link.intra_bandwidth) if h == 1 else (a_out, link.inter_bandwidth)
        times["p2p"] = step + n / rate
    algorithm = min(times, key=lambda name: times[name])
    return Estimate(collective, nbytes, link.base_latency + times[algorithm], algorithm, p, h, bandwidth)


def estimate(
    mesh: Mesh,
    axes: AxesArg,
    collective: Collective,
    nbytes: int,
    topology: Topology,
    links: Links | Mapping[str, Any] | None = None,
) -> Estimate:
    """:func:`cost`, with what it was computed from (algorithm, group size, hosts, bandwidth).

    >>> import fmesh
    >>> e = estimate(fmesh.make_mesh((2, 16), ("dp", "tp")), "tp", "all_gather", 2**20, fmesh.Topology(4, 8))
    >>> e.algorithm, e.size, e.hosts
    ('ring', 16, 2)
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"expected topology as an fmesh.Topology, but got {topology!r}")
    return estimate_span(collective, nbytes, topology.span(mesh, axes), links)


def cost(
    mesh: Mesh,
    axes: AxesArg,
    collective: Collective,
    nbytes: int,
    topology: Topology,
    links: Links | Mapping[str, Any] | None = None,
) -> float:
    """Estimated seconds of one ``collective`` of ``nbytes`` along ``axes`` of ``mesh`` on ``topology``.

    ``collective`` is one of :data:`COLLECTIVES`; ``links`` overrides the default link figures
    (:data:`H100_IB`). The slowest group along ``axes`` sets the time; see the module docstring for the model.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((64, 8), ("dp", "tp"))
    >>> round(cost(mesh, "tp", "all_reduce", 2**30, fmesh.Topology(64, 8)) * 1e3, 2)
    4.23
    >>> round(cost(mesh, "dp", "all_reduce", 2**30, fmesh.Topology(64, 8)) * 1e3, 2)
    43.07
    """
    return estimate(mesh, axes, collective, nbytes, topology, links).seconds


def format_seconds(seconds: float) -> str:
    """Seconds in the unit a person reads best.

    >>> format_seconds(0.0), format_seconds(3.2e-5), format_seconds(0.0123), format_seconds(2.5)
    ('0', '32 µs', '12.3 ms', '2.50 s')
    """
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.2f} s"


def format_bytes(nbytes: int) -> str:
    """Bytes in binary units, three significant figures (four from 1,000 to 1,023 of a unit), never in
    exponent notation.

    >>> format_bytes(512), format_bytes(2**28), format_bytes(3 * 2**30 // 2), format_bytes(2070 * 2**30)
    ('512 B', '256 MiB', '1.5 GiB', '2.02 TiB')
    >>> format_bytes(1023 * 2**20), format_bytes(5 * 2**60)
    ('1023 MiB', '5120 PiB')
    """
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value >= 999.5 else f"{value:.3g} {unit}"
    return f"{nbytes} B"
