"""Topology: host spans against a brute-force count over a numpy rank grid, and placement warnings."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fmesh
from fmesh.plan.parallel import MESH_NAMES, ParallelDims
from fmesh.plan.topology import PlacementWarning, Topology, check_placement, warn_placement

WORLD = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DERIVED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}


def ref_host_counts(
    degrees: dict[str, int], axes: tuple[str, ...], host_of: list[int], rank_map: list[int] | None
) -> list[int]:
    world = math.prod(degrees[n] for n in WORLD)
    ranks = np.arange(world) if rank_map is None else np.asarray(rank_map)
    grid = ranks.reshape([degrees[n] for n in WORLD])
    idx = [WORLD.index(a) for a in axes]
    others = [i for i in range(grid.ndim) if i not in idx]
    rows = grid.transpose(others + idx).reshape(-1, math.prod(grid.shape[i] for i in idx))
    return [len({host_of[int(r)] for r in row}) for row in rows]


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, int], int, object, list[int] | None]:
    degrees = {n: draw(st.sampled_from([1, 1, 2, 3, 4, 8])) for n in WORLD}
    while math.prod(degrees.values()) > 128:
        degrees[max(degrees, key=lambda n: degrees[n])] = 1
    world = math.prod(degrees.values())
    per_host = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    order = draw(st.sampled_from(["block", "cyclic", "custom"]))
    rank_order: object = order if order != "custom" else draw(st.permutations(list(range(world))))
    rank_map = draw(st.none() | st.none() | st.permutations(list(range(world))))
    return degrees, per_host, rank_order, rank_map


def ref_host_of(world: int, per_host: int, rank_order: object) -> list[int]:
    hosts = world // per_host
    if rank_order == "block":
        return [r // per_host for r in range(world)]
    if rank_order == "cyclic":
        return [r % hosts for r in range(world)]
    host = [0] * world
    for position, rank in enumerate(rank_order):  # type: ignore[attr-defined]
        host[rank] = position // per_host
    return host


@settings(max_examples=80, deadline=None)
@given(cases())
def test_spans_match_brute_force(case: tuple[dict[str, int], int, object, list[int] | None]) -> None:
    degrees, per_host, rank_order, rank_map = case
    world = math.prod(degrees.values())
    topo = Topology(world // per_host, per_host, rank_order)  # type: ignore[arg-type]
    dims = ParallelDims(world, rank_map=rank_map, **degrees)
    host_of = ref_host_of(world, per_host, rank_order)
    assert [topo.host_of(r) for r in range(world)] == host_of
    for name in MESH_NAMES:
        if name in ("ep", "efsdp", "etp"):
            continue
        axes = DERIVED.get(name, (name,))
        counts = ref_host_counts(degrees, axes, host_of, rank_map)
        span = topo.span(dims.mesh(name))
        assert (span.hosts_min, span.hosts_max) == (min(counts), max(counts)), name
        assert span.num_groups == len(counts)
        assert span.size == math.prod(degrees[a] for a in axes)
        assert span.intra_host == (max(counts) == 1)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from(["block", "cyclic"]))
def test_fast_path_agrees_with_an_explicit_rank_order(tp: int, per_host: int, order: str) -> None:
    # Listing the same order explicitly forces the group-by-group count.
    world = 64
    dims = ParallelDims(world, dp_replicate=2, cp=2, tp=tp, ep=2)
    fast = Topology(world // per_host, per_host, order)
    explicit = Topology(world // per_host, per_host, [r for h in range(fast.hosts) for r in fast.ranks_on(h)])
    for name, mesh in dims.meshes().items():
        assert fast.span(mesh) == explicit.span(mesh), name


def test_tp_inside_a_host_and_across_hosts() -> None:
    topo = Topology(hosts=4, ranks_per_host=8)
    inside = ParallelDims(32, tp=8).mesh("tp")
    across = ParallelDims(32, tp=16).mesh("tp")
    assert topo.span(inside).placement == "intra-host" and topo.span(inside).hosts_per_group == 1
    assert topo.span(across).placement == "inter-host" and topo.span(across).hosts_per_group == 2
    # tp=8 whose groups straddle hosts because the rank map shifts them by 4.
    shifted = ParallelDims(32, tp=8, rank_map=[(r + 4) % 32 for r in range(32)]).mesh("tp")
    assert topo.span(shifted).hosts_per_group == 2


def test_mixed_placement_when_groups_differ() -> None:
    topo = Topology(hosts=2, ranks_per_host=4, rank_order=[0, 1, 2, 4, 3, 5, 6, 7])
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    span = topo.span(mesh, "tp")
    assert (span.hosts_min, span.hosts_max, span.placement) == (2, 2, "inter-host")
    pairs = topo.span(fmesh.make_mesh((4, 2), ("dp", "tp")), "tp")
    assert (pairs.hosts_min, pairs.hosts_max, pairs.placement) == (1, 2, "mixed")


def _spans(dims: ParallelDims, topo: Topology) -> dict[str, fmesh.plan.topology.AxisSpan]:
    return topo.spans(dims.meshes())


def test_warning_when_tp_crosses_and_dp_stays_inside() -> None:
    dims = ParallelDims(16, dp_shard=2, tp=8)
    cyclic = Topology(2, 8, "cyclic")  # tp groups 0..7 alternate hosts; dp_shard pairs (r, r+8) share one
    messages = check_placement(_spans(dims, cyclic))
    assert len(messages) == 1
    assert messages[0].startswith("tp groups (size 8) span 2 hosts each while dp_shard (size 2)")
    with pytest.warns(PlacementWarning, match="tp groups"):
        warn_placement(_spans(dims, cyclic))


def test_no_warning_for_the_natural_layout() -> None:
    dims = ParallelDims(16, dp_shard=2, tp=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_placement(_spans(dims, Topology(2, 8))) == ()


def test_no_warning_when_cheap_axes_cross_too() -> None:
    # tp=16 on 8-rank hosts must cross; every other axis crosses as well, so nothing is misplaced.
    dims = ParallelDims(64, dp_replicate=2, dp_shard=2, tp=16)
    spans = _spans(dims, Topology(8, 8))
    assert not spans["tp"].intra_host
    assert check_placement(spans) == ()


def test_no_warning_from_size_one_axes() -> None:
    # Only tp is parallel; the size-1 cheap axes are trivially intra-host and must not count.
    dims = ParallelDims(16, dp_shard=1, tp=16)
    assert check_placement(_spans(dims, Topology(2, 8))) == ()


def test_cp_and_ep_warnings_in_priority_order() -> None:
    # cp outermost by a rank map: cp crosses hosts while dp_shard stays inside.
    world = 16
    grid = np.arange(world).reshape(2, 8)  # (cp, dp_shard) in rank order
    rank_map = grid.T.reshape(-1).tolist()  # slot (dp_shard, cp) -> rank cp*8 + dp_shard
    dims = ParallelDims(world, dp_shard=8, cp=2, ep=16, rank_map=rank_map)
    messages = check_placement(_spans(dims, Topology(2, 8)))
    assert [m.split(" ")[0] for m in messages] == ["cp", "ep"]


def test_from_env() -> None:
    topo = Topology.from_env({"WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8", "RANK": "3"})
    assert (topo.hosts, topo.ranks_per_host, topo.rank_order) == (4, 8, "block")
    assert Topology.from_env({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, rank_order="cyclic").host_of(1) == 1
    with pytest.raises(KeyError, match="LOCAL_WORLD_SIZE is not set"):
        Topology.from_env({"WORLD_SIZE": "8"})
    with pytest.raises(ValueError, match="WORLD_SIZE must be a positive integer, got 'eight'"):
        Topology.from_env({"WORLD_SIZE": "eight", "LOCAL_WORLD_SIZE": "8"})
    with pytest.raises(ValueError, match="WORLD_SIZE=12 is not a multiple of LOCAL_WORLD_SIZE=8"):
        Topology.from_env({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"})


def test_from_hostnames() -> None:
    topo = Topology.from_hostnames(["n1", "n2", "n1", "n2", "n3", "n3"])
    assert (topo.hosts, topo.ranks_per_host) == (3, 2)
    assert [topo.host_of(r) for r in range(6)] == [0, 1, 0, 1, 2, 2]
    assert topo.ranks_on(1) == (1, 3)
    with pytest.raises(ValueError, match="same number of ranks"):
        Topology.from_hostnames(["a", "a", "b"])


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 8), ValueError, "hosts must be a positive int"),
        ((2, 8.0), TypeError, "ranks_per_host must be an int"),
        ((2, 2, "round-robin"), ValueError, "rank_order 'round-robin' is not known"),
        ((2, 2, [0, 1, 2]), ValueError, "lists 3 ranks, but 2 hosts x 2"),
        ((2, 2, [0, 1, 1, 2]), ValueError, "lists rank 1 twice"),
        ((2, 2, [0, 1, 2, 9]), ValueError, "outside range"),
    ],
)
def test_invalid_topologies(args: tuple[object, ...], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Topology(*args)  # type: ignore[arg-type]


def test_span_rejects_a_mesh_of_another_world() -> None:
    with pytest.raises(ValueError, match="world size 8, but this topology has 2 hosts x 8 = 16"):
        Topology(2, 8).span(fmesh.make_mesh((8,), ("dp",)))
    with pytest.raises(KeyError, match="unknown axis 'tp'"):
        Topology(1, 8).span(fmesh.make_mesh((8,), ("dp",)), "tp")


def test_million_ranks() -> None:  # how fast: bench/mesh_ops.py
    dims = ParallelDims(2**20, pp=8, dp_replicate=4, cp=2, tp=8, ep=64)
    spans = Topology(2**17, 8).spans(dims.meshes())
    assert spans["tp"].intra_host and spans["ep"].hosts_per_group == 8


@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from(["block", "cyclic", "explicit"]), st.randoms())
def test_topology_mesh_local_groups_are_the_hosts(hosts: int, per_host: int, order: str, rng: object) -> None:
    world = hosts * per_host
    rank_order: object = order
    if order == "explicit":
        shuffled = list(range(world))
        rng.shuffle(shuffled)  # type: ignore[attr-defined]
        rank_order = shuffled
    topo = Topology(hosts, per_host, rank_order=rank_order)  # type: ignore[arg-type]
    mesh = topo.mesh()
    assert mesh.shape == {"host": hosts, "local": per_host} and mesh.world_size == world
    # Post-conditions: "local" groups are the hosts, by local rank; "host" groups one local rank of each host.
    assert sorted(mesh.groups("local")) == sorted(topo.ranks_on(h) for h in range(hosts))
    for rank in range(world):
        host = topo.host_of(rank)
        local = topo.ranks_on(host)
        assert mesh.group(rank, "local") == local
        assert mesh.group(rank, "host") == tuple(topo.ranks_on(h)[local.index(rank)] for h in range(hosts))
        assert mesh.coordinate(rank) == (host, local.index(rank))
    assert topo.span(mesh, "local").intra_host


def test_topology_mesh_of_a_million_ranks_has_no_rank_map() -> None:
    for order in ("block", "cyclic"):
        topo = Topology(131072, 8, rank_order=order)
        mesh = topo.mesh()
        assert mesh.universe.is_identity
        assert mesh.group(1_000_001, "local") == topo.ranks_on(topo.host_of(1_000_001))
