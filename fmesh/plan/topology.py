"""Hosts × local ranks, and which mesh axes cross a host boundary. Pure values, no process group.

A :class:`Topology` says on which host each global rank runs: ``hosts`` machines with
``ranks_per_host`` ranks each, in ``"block"`` order (torchrun's: ranks ``0..G-1`` on
host 0), ``"cyclic"`` order (rank ``r`` on host ``r % hosts``, as with SLURM's cyclic
distribution), or any explicit order. :meth:`Topology.span` tells, for the groups
along some axes of a mesh, how many hosts each group touches; :func:`check_placement`
warns when a bandwidth-hungry axis crosses hosts while a cheap one stays inside.

>>> import fmesh
>>> topo = Topology(hosts=2, ranks_per_host=8)
>>> mesh = fmesh.make_mesh((4, 4), ("dp", "tp"))
>>> topo.span(mesh, "tp").placement, topo.span(mesh, "dp").hosts_per_group
('intra-host', 2)
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast, get_args

import attrs

from fmesh.errors import PlacementWarning
from fmesh.layout import Layout
from fmesh.layout.int_tuple import is_int
from fmesh.mesh import Mesh, Universe, make_mesh

__all__ = [
    "CHEAP_AXES",
    "HUNGRY_AXES",
    "ORDERS",
    "AxisSpan",
    "PlacementWarning",
    "RankOrder",
    "Topology",
    "check_placement",
    "warn_placement",
]

HUNGRY_AXES: tuple[str, ...] = ("tp", "etp", "cp", "ep")
"""Axes that need the most bandwidth, most demanding first: they belong inside a host."""

CHEAP_AXES: tuple[str, ...] = ("dp_replicate", "dp_shard", "dp", "pp")
"""Axes that tolerate the slower links between hosts."""

RankOrder = Literal["block", "cyclic"]
"""How ranks are numbered on hosts: host by host (``block``), or round-robin over hosts (``cyclic``)."""

ORDERS: tuple[RankOrder, ...] = get_args(RankOrder)


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value):
        raise TypeError(f"{attribute.name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{attribute.name} must be a positive int, got {value}")


def _to_order(value: Any) -> RankOrder | tuple[int, ...]:
    if isinstance(value, str):
        return cast(RankOrder, value)  # checked after conversion, with the other fields
    if hasattr(value, "tolist"):
        value = value.reshape(-1).tolist() if hasattr(value, "reshape") else value.tolist()
    if isinstance(value, Sequence):
        return tuple(value)
    raise TypeError(
        f"rank_order must be 'block', 'cyclic' or a sequence of global ranks listed host by host, got {value!r}"
    )


@attrs.frozen(repr=False)
class AxisSpan:
    """How the groups along some mesh axes sit on hosts.

    ``hosts_min``/``hosts_max``: the fewest and most hosts one group touches (equal
    for the usual regular layouts). ``local_min``/``local_max``: the fewest and most
    ranks of one group on one host it touches (``size // hosts`` for regular layouts, the
    default); the cost model reads them (:mod:`fmesh.plan.costs`).

    >>> AxisSpan("tp", size=8, num_groups=4, hosts_min=1, hosts_max=1).placement
    'intra-host'
    >>> AxisSpan("dp", size=16, num_groups=1, hosts_min=2, hosts_max=2).local_min
    8
    """

    name: str
    size: int = attrs.field(kw_only=True)
    num_groups: int = attrs.field(kw_only=True)
    hosts_min: int = attrs.field(kw_only=True)
    hosts_max: int = attrs.field(kw_only=True)
    local_min: int = attrs.field(
        kw_only=True, default=attrs.Factory(lambda self: max(1, self.size // self.hosts_max), takes_self=True)
    )
    local_max: int = attrs.field(
        kw_only=True, default=attrs.Factory(lambda self: max(1, -(-self.size // self.hosts_min)), takes_self=True)
    )

    @property
    def intra_host(self) -> bool:
        """Every group stays inside one host.

        >>> AxisSpan("dp", size=4, num_groups=2, hosts_min=2, hosts_max=2).intra_host
        False
        """
        return self.hosts_max == 1

    @property
    def hosts_per_group(self) -> int:
        """The most hosts one group touches.

        >>> AxisSpan("dp", size=4, num_groups=2, hosts_min=1, hosts_max=2).hosts_per_group
        2
        """
        return self.hosts_max

    @property
    def placement(self) -> str:
        """``"intra-host"``, ``"inter-host"`` (every group crosses) or ``"mixed"``.

        >>> AxisSpan("dp", size=4, num_groups=2, hosts_min=1, hosts_max=2).placement
        'mixed'
        """
        if self.hosts_max == 1:
            return "intra-host"
        return "inter-host" if self.hosts_min > 1 else "mixed"

    def __repr__(self) -> str:
        hosts = str(self.hosts_max) if self.hosts_min == self.hosts_max else f"{self.hosts_min}..{self.hosts_max}"
        return f"AxisSpan({self.name}: size={self.size}, groups={self.num_groups}, hosts/group={hosts})"


@attrs.frozen(repr=False)
class Topology:
    """``hosts`` machines with ``ranks_per_host`` ranks each, and which rank runs where.

    ``rank_order`` is ``"block"`` (ranks ``h*G .. h*G+G-1`` on host ``h``; torchrun),
    ``"cyclic"`` (rank ``r`` on host ``r % hosts``) or the global ranks listed host by
    host (``rank_order[h*G + i]`` is local rank ``i`` of host ``h``).

    >>> topo = Topology(hosts=2, ranks_per_host=2, rank_order="cyclic")
    >>> [topo.host_of(r) for r in range(4)], topo.ranks_on(1)
    ([0, 1, 0, 1], (1, 3))
    """

    hosts: int = attrs.field(validator=_positive)
    ranks_per_host: int = attrs.field(validator=_positive)
    rank_order: RankOrder | tuple[int, ...] = attrs.field(default="block", converter=_to_order)
    _host: tuple[int, ...] | None = attrs.field(init=False, eq=False, repr=False, default=None)

    def __attrs_post_init__(self) -> None:
        order = self.rank_order
        if isinstance(order, str):
            if order not in ORDERS:
                raise ValueError(
                    f"rank_order {order!r} is not known: use 'block', 'cyclic', or a sequence of global ranks"
                )
            return
        world = self.world_size
        if len(order) != world:
            raise ValueError(
                f"rank_order lists {len(order)} ranks, but {self.hosts} hosts x {self.ranks_per_host} "
                f"ranks per host make {world}"
            )
        host = [-1] * world
        for position, rank in enumerate(order):
            if not is_int(rank):
                raise TypeError(f"rank_order entries must be ints, got {rank!r}")
            if not 0 <= rank < world:
                raise ValueError(f"rank_order entry {rank} is outside range(0, {world})")
            if host[rank] != -1:
                raise ValueError(f"rank_order lists rank {rank} twice; it must be a permutation of range(0, {world})")
            host[rank] = position // self.ranks_per_host
        object.__setattr__(self, "_host", tuple(host))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, rank_order: RankOrder | Sequence[int] = "block"
    ) -> Topology:
        """From the launcher's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (``os.environ`` by default).

        >>> Topology.from_env({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
        Topology(hosts=2, ranks_per_host=8, block)
        """
        env = os.environ if environ is None else environ
        values = {}
        for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            if key not in env:
                raise KeyError(f"{key} is not set; launch with torchrun, or use Topology(hosts, ranks_per_host)")
            try:
                values[key] = int(env[key])
            except ValueError:
                raise ValueError(f"{key} must be a positive integer, got {env[key]!r}") from None
            if values[key] < 1:
                raise ValueError(f"{key} must be a positive integer, got {env[key]!r}")
        world, local = values["WORLD_SIZE"], values["LOCAL_WORLD_SIZE"]
        if world % local != 0:
            raise ValueError(
                f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}: "
                "hosts must run equal numbers of ranks"
            )
        return cls(world // local, local, rank_order)

    @classmethod
    def from_hostnames(cls, hostnames: Sequence[str]) -> Topology:
        """From the host name of each global rank (say, gathered with ``all_gather_object``).

        Hosts are numbered in order of first appearance; each must run the same number of ranks.

        >>> Topology.from_hostnames(["a", "b", "a", "b"]).host_of(2)
        0
        """
        if isinstance(hostnames, str) or not isinstance(hostnames, Sequence) or not hostnames:
            raise TypeError(f"hostnames must be a non-empty sequence with one host name per rank, got {hostnames!r}")
        by_host: dict[str, list[int]] = {}
        for rank, name in enumerate(hostnames):
            by_host.setdefault(name, []).append(rank)
        counts = {name: len(ranks) for name, ranks in by_host.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"hosts must run the same number of ranks, got {counts}")
        order = tuple(rank for ranks in by_host.values() for rank in ranks)
        return cls(len(by_host), len(hostnames) // len(by_host), order)

    @property
    def world_size(self) -> int:
        """``hosts * ranks_per_host``.

        >>> Topology(4, 8).world_size
        32
        """
        return self.hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        """The host that runs global ``rank``.

        >>> Topology(2, 4).host_of(5)
        1
        """
        if not is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in range(0, {self.world_size}), got {rank!r}")
        if self._host is not None:
            return self._host[rank]
        if self.rank_order == "cyclic":
            return rank % self.hosts
        return rank // self.ranks_per_host

    def ranks_on(self, host: int) -> tuple[int, ...]:
        """The global ranks on ``host``, by local rank.

        >>> Topology(2, 4).ranks_on(1)
        (4, 5, 6, 7)
        """
        if not is_int(host) or not 0 <= host < self.hosts:
            raise ValueError(f"host must be an int in range(0, {self.hosts}), got {host!r}")
        g = self.ranks_per_host
        if isinstance(self.rank_order, tuple):
            return self.rank_order[host * g : (host + 1) * g]
        if self.rank_order == "cyclic":
            return tuple(host + i * self.hosts for i in range(g))
        return tuple(range(host * g, (host + 1) * g))

    def mesh(self) -> Mesh:
        """``Mesh(host=hosts, local=ranks_per_host)`` over the world in this topology's rank order: the
        group along ``"local"`` is the ranks of one host (by local rank), along ``"host"`` one local rank
        of every host. ``ctx.all_reduce(t, topology.mesh(), "local")`` is a host-local collective.

        Block and cyclic orders need no rank map (the cyclic one is a transposed layout), so the mesh
        costs the same at any world size and shares its universe with the training meshes.

        >>> topo = Topology(hosts=2, ranks_per_host=4, rank_order="cyclic")
        >>> topo.mesh(), topo.mesh().group(5, "local"), topo.mesh().group(5, "host")
        (Mesh(host=2, local=4; world=8), (1, 3, 5, 7), (4, 5))
        """
        names = ("host", "local")
        if self.rank_order == "block":
            return make_mesh((self.hosts, self.ranks_per_host), names)
        if self.rank_order == "cyclic":  # local rank i of host h is global rank h + i * hosts
            layouts = (Layout(self.hosts, 1), Layout(self.ranks_per_host, self.hosts))
            return Mesh(Universe(self.world_size), names, layouts)
        return make_mesh((self.hosts, self.ranks_per_host), names, rank_map=self.rank_order)

    def span(self, mesh: Mesh, axes: str | Sequence[str] | None = None, *, name: str | None = None) -> AxisSpan:
        """How the groups of ``mesh`` along ``axes`` (default: all) sit on hosts.

        Instant for block/cyclic orders on meshes of an unpermuted universe whose
        axes split evenly at the host boundary; otherwise every group is visited.

        >>> import fmesh
        >>> mesh = fmesh.make_mesh((2, 16), ("dp", "tp"))
        >>> Topology(4, 8).span(mesh, "tp")
        AxisSpan(tp: size=16, groups=2, hosts/group=2)
        """
        if not isinstance(mesh, Mesh):
            raise TypeError(f"span takes a Mesh, got {mesh!r}")
        if mesh.world_size != self.world_size:
            raise ValueError(
                f"{mesh!r} has world size {mesh.world_size}, but this topology has "
                f"{self.hosts} hosts x {self.ranks_per_host} = {self.world_size} ranks"
            )
        names = mesh.resolve_axes(axes)
        label = name if name is not None else "*".join(names)
        size = 1
        for axis in names:
            size *= mesh.shape[axis]
        num_groups = mesh.num_covered // size
        hosts = self._fast_hosts(mesh, names)
        if hosts is not None:
            return AxisSpan(label, size=size, num_groups=num_groups, hosts_min=hosts, hosts_max=hosts)
        counts = [Counter(self.host_of(rank) for rank in group) for group in mesh.groups(names)]
        touched = [len(count) for count in counts]
        local = [n for count in counts for n in count.values()]
        return AxisSpan(label, size=size, num_groups=num_groups, hosts_min=min(touched), hosts_max=max(touched),
                        local_min=min(local), local_max=max(local))

    def _fast_hosts(self, mesh: Mesh, names: tuple[str, ...]) -> int | None:
        if isinstance(self.rank_order, tuple) or not mesh.universe.is_identity or mesh.frame or mesh.pinned.size > 1:
            return None
        layout = mesh.axes_layout(names)
        group_modes = [(s, d) for s, d in layout.modes if s > 1]
        all_modes = group_modes + [(s, d) for s, d in layout.complement(self.world_size).modes if s > 1]
        # Slot digits below the boundary say the local rank (block) or the host (cyclic).
        boundary = self.ranks_per_host if self.rank_order == "block" else self.hosts
        splits = [split for split in (_split(mode, boundary) for mode in all_modes) if split is not None]
        if len(splits) != len(all_modes):
            return None
        hosts = 1
        for low, high in splits[: len(group_modes)]:
            hosts *= high if self.rank_order == "block" else low
        return hosts

    def spans(self, meshes: Mapping[str, Mesh]) -> dict[str, AxisSpan]:
        """:meth:`span` of each named mesh over all its axes.

        >>> import fmesh; m = fmesh.make_mesh((4, 4), ("dp", "tp"))
        >>> Topology(2, 8).spans({"tp": m["tp"], "dp": m["dp"]})["dp"].placement
        'inter-host'
        """
        return {name: self.span(mesh, name=name) for name, mesh in meshes.items()}

    def __repr__(self) -> str:
        order = self.rank_order if isinstance(self.rank_order, str) else "custom order"
        return f"Topology(hosts={self.hosts}, ranks_per_host={self.ranks_per_host}, {order})"


def _split(mode: tuple[int, int], boundary: int) -> tuple[int, int] | None:
    """Split a mode ``(size, stride)`` into the parts below and above ``boundary``: ``(low, high)`` sizes.

    ``None`` when the mode straddles the boundary unevenly.
    """
    size, stride = mode
    if stride * size <= boundary:
        return (size, 1) if boundary % (stride * size) == 0 else None
    if stride >= boundary:
        return (1, size) if stride % boundary == 0 else None
    if boundary % stride != 0:
        return None
    low = boundary // stride
    return (low, size // low) if size % low == 0 else None


def check_placement(
    spans: Mapping[str, AxisSpan],
    *,
    hungry: Sequence[str] = HUNGRY_AXES,
    cheap: Sequence[str] = CHEAP_AXES,
) -> tuple[str, ...]:
    """Warnings (strings) for each ``hungry`` axis whose groups cross hosts while some
    ``cheap`` axis keeps its groups inside one host. Size-1 axes are ignored.

    >>> import fmesh
    >>> mesh = fmesh.make_mesh((4, 4), ("tp", "dp"))          # tp outermost: a bad layout
    >>> spans = Topology(2, 8).spans({"tp": mesh["tp"], "dp": mesh["dp"]})
    >>> check_placement(spans)[0].split(":")[0]
    'tp groups (size 4) span 2 hosts each while dp (size 4) stays inside one host'
    """
    messages = []
    for name in hungry:
        span = spans.get(name)
        if span is None or span.size == 1 or span.intra_host:
            continue
        inside = [spans[c] for c in cheap if c in spans and spans[c].size > 1 and spans[c].intra_host]
        if not inside:
            continue
        hosts = f"{span.hosts_max} hosts each" if span.hosts_min == span.hosts_max else f"up to {span.hosts_max} hosts"
        cheap_text = ", ".join(f"{c.name} (size {c.size})" for c in inside)
        verb = "stays" if len(inside) == 1 else "stay"
        messages.append(
            f"{name} groups (size {span.size}) span {hosts} while {cheap_text} {verb} inside one host: "
            f"{name} needs the faster links; order the ranks so that {name} is inside a host "
            f"and {inside[0].name} crosses hosts"
        )
    return tuple(messages)


def warn_placement(spans: Mapping[str, AxisSpan], **kwargs: Sequence[str]) -> tuple[str, ...]:
    """:func:`check_placement`, also emitted as :class:`PlacementWarning`; returns the messages.

    >>> warn_placement({})
    ()
    """
    messages = check_placement(spans, **kwargs)
    for message in messages:
        warnings.warn(message, PlacementWarning, stacklevel=2)
    return messages
