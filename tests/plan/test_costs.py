"""The cost model's laws (fmesh.plan.costs), stated as properties over meshes, rank orders and link figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fmesh
from fmesh.plan.costs import COLLECTIVES, H100_IB, Links, as_links, cost, estimate, estimate_span
from fmesh.plan.topology import AxisSpan


@st.composite
def links(draw: st.DrawFn) -> Links:
    """Link figures where the network is no faster than the links inside a host (what the laws assume)."""
    intra_bw = draw(st.floats(1e8, 1e12))
    intra_lat = draw(st.floats(0, 1e-4))
    return Links(
        intra_bandwidth=intra_bw,
        inter_bandwidth=draw(st.floats(1e-7, 1.0)) * intra_bw,
        intra_latency=intra_lat,
        inter_latency=intra_lat + draw(st.floats(0, 1e-4)),
        base_latency=draw(st.floats(0, 1e-4)),
    )


@st.composite
def jobs(draw: st.DrawFn) -> tuple[fmesh.Mesh, str, fmesh.Topology]:
    """A 3-axis mesh over hosts x ranks per host, any rank order, and one of its axes."""
    per_host = draw(st.sampled_from([1, 2, 4, 8]))
    hosts = draw(st.sampled_from([1, 2, 3, 4]))
    world = per_host * hosts
    a = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    b = draw(st.sampled_from([d for d in range(1, world // a + 1) if (world // a) % d == 0]))
    mesh = fmesh.make_mesh((a, b, world // (a * b)), ("x", "y", "z"))
    order = draw(st.sampled_from(["block", "cyclic", "shuffled"]))
    if order == "shuffled":
        ranks = draw(st.permutations(list(range(world))))
        topology = fmesh.Topology(hosts, per_host, ranks)
    else:
        topology = fmesh.Topology(hosts, per_host, order)
    return mesh, draw(st.sampled_from(["x", "y", "z"])), topology


@given(jobs(), st.sampled_from(COLLECTIVES), st.integers(0, 2**34), st.integers(0, 2**34), links())
def test_more_bytes_never_cost_less(job: tuple[fmesh.Mesh, str, fmesh.Topology], collective: str, n1: int, n2: int,
                                    link: Links) -> None:
    mesh, axis, topology = job
    small, large = sorted((n1, n2))
    assert cost(mesh, axis, collective, small, topology, link) <= cost(mesh, axis, collective, large, topology, link)


@given(
    st.integers(2, 64), st.integers(2, 64), st.integers(1, 64), st.sampled_from(COLLECTIVES),
    st.integers(0, 2**34), links(),
)
def test_a_group_inside_one_host_never_costs_more_than_across_hosts(
    size: int, hosts: int, local: int, collective: str, nbytes: int, link: Links
) -> None:
    # Any way of spreading `size` ranks over `hosts` hosts (at least one rank on each, `local` at least on one).
    hosts = min(hosts, size)
    fewest = max(1, min(local, size // hosts))
    most = size - (hosts - 1) * fewest
    across = AxisSpan("g", size=size, num_groups=1, hosts_min=hosts, hosts_max=hosts, local_min=fewest,
                      local_max=most)
    inside = AxisSpan("g", size=size, num_groups=1, hosts_min=1, hosts_max=1)
    assert estimate_span(collective, nbytes, inside, link).seconds <= estimate_span(collective, nbytes, across,
                                                                                   link).seconds


@st.composite
def fitting_groups(draw: st.DrawFn) -> tuple[int, int, int]:
    """(group size, ranks per host, hosts) with a group that fits in one host."""
    per_host = draw(st.sampled_from([2, 4, 8]))
    return draw(st.sampled_from([s for s in (2, 4, 8) if s <= per_host])), per_host, draw(st.sampled_from([2, 3, 8]))


@given(fitting_groups(), st.sampled_from(COLLECTIVES), st.integers(0, 2**34), links())
def test_the_same_group_size_through_meshes_inside_and_across_hosts(
    group: tuple[int, int, int], collective: str, nbytes: int, link: Links
) -> None:
    size, per_host, hosts = group
    world = hosts * per_host
    topology = fmesh.Topology(hosts, per_host)
    inside = fmesh.make_mesh((world // size, size), ("rest", "g"))  # g: consecutive ranks, one host
    across = fmesh.make_mesh((size, world // size), ("g", "rest"))  # g: strided by world/size, over hosts
    assert topology.span(inside, "g").hosts_max == 1 < topology.span(across, "g").hosts_max
    assert cost(inside, "g", collective, nbytes, topology, link) <= cost(across, "g", collective, nbytes, topology,
                                                                         link)


@given(st.sampled_from([2, 4, 8]), st.integers(2, 64), st.sampled_from(COLLECTIVES), st.integers(0, 2**34))
def test_cyclic_rank_order_makes_tp_cost_more_than_block_order(tp: int, hosts: int, collective: str,
                                                                nbytes: int) -> None:
    per_host = 8
    dims = fmesh.ParallelDims(hosts * per_host, tp=tp)
    tp_mesh = dims.mesh("tp")
    block = fmesh.Topology(hosts, per_host, "block")
    cyclic = fmesh.Topology(hosts, per_host, "cyclic")
    assert cost(tp_mesh, "tp", collective, nbytes, block) < cost(tp_mesh, "tp", collective, nbytes, cyclic)


def test_cost_reads_the_real_rank_map_not_a_row_major_assumption() -> None:
    # The same (dp, tp) shape; in the second, tp's neighbours are 8 ranks apart: each tp group spans 2 hosts.
    plain = fmesh.make_mesh((2, 8), ("dp", "tp"))
    permuted = fmesh.make_mesh((2, 8), ("dp", "tp"), rank_map=[r // 2 + 8 * (r % 2) for r in range(16)])
    topology = fmesh.Topology(2, 8)
    assert topology.span(permuted, "tp").hosts_max == 2
    fast, slow = (estimate(m, "tp", "all_reduce", 2**30, topology) for m in (plain, permuted))
    assert (fast.hosts, slow.hosts) == (1, 2)
    assert slow.seconds > fast.seconds
    # 4 ranks of the group on each host, over their 4 NICs of 50 GB/s: 200 GB/s, below NVLink's 450 GB/s
    assert slow.bandwidth == 4 * H100_IB.inter_bandwidth == 200e9 and fast.bandwidth == H100_IB.intra_bandwidth


def test_ring_all_reduce_matches_the_formula() -> None:
    link = H100_IB
    span = AxisSpan("dp", size=16, num_groups=1, hosts_min=2, hosts_max=2)  # 8 + 8
    n = 2**30
    ring = link.base_latency + 2 * (14 * link.intra_latency + link.inter_latency) + 2 * 15 / 16 * n / 400e9
    tree = link.base_latency + 2 * (3 * link.intra_latency + 1 * link.inter_latency) + 2 * n / 400e9
    got = estimate_span("all_reduce", n, span)
    assert got.algorithm == "ring" and math.isclose(got.seconds, min(ring, tree))
    small = estimate_span("all_reduce", 0, span)  # latency only: the tree wins
    assert small.algorithm == "tree" and math.isclose(small.seconds, link.base_latency + 2 * (
        3 * link.intra_latency + link.inter_latency))


def test_a_group_of_one_costs_nothing() -> None:
    mesh = fmesh.make_mesh((8, 1), ("dp", "tp"))
    assert all(cost(mesh, "tp", c, 2**20, fmesh.Topology(1, 8)) == 0.0 for c in COLLECTIVES)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cost(fmesh.make_mesh((8,), ("tp",)), "tp", "allreduce", 1, fmesh.Topology(1, 8)),
         "expected a collective among ('all_reduce'"),
        (lambda: cost(fmesh.make_mesh((8,), ("tp",)), "tp", "all_reduce", -1, fmesh.Topology(1, 8)),
         "expected nbytes as a non-negative int, but got -1"),
        (lambda: cost(fmesh.make_mesh((8,), ("tp",)), "tp", "all_reduce", 1, fmesh.Topology(1, 8), {"bw": 1}),
         "expected links fields among"),
        (lambda: as_links({"inter_bandwidth": 0.0}), "expected inter_bandwidth as a positive number, but got 0.0"),
        (lambda: cost(fmesh.make_mesh((8,), ("tp",)), "tp", "all_reduce", 1, fmesh.Topology(2, 8)),
         "has world size 8, but this topology has 2 hosts x 8 = 16 ranks"),
        (lambda: cost(fmesh.make_mesh((8,), ("tp",)), "pp", "all_reduce", 1, fmesh.Topology(1, 8)),
         "unknown axis 'pp'"),
    ],
)
def test_bad_arguments_name_the_value_and_the_choices(call: object, message: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)) as error:
        call()  # type: ignore[operator]
    assert message in str(error.value)
