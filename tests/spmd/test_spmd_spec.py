"""Specs and shardings (pure), and their DTensor placements on the mesh's exported ``DeviceMesh`` (a fake world)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import sharding_meshes
from support import patience
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import fmesh
from fmesh.spmd import P, PartitionSpec, Sharding, check_spec
from fmesh.spmd.placements import from_placements, to_placements

MESH = fmesh.make_mesh((2, 3), ("dp", "tp"))


def test_a_spec_names_each_dimension() -> None:
    spec = P("dp", None, ("tp",), partial="cp")
    assert spec.entries == ("dp", None, "tp") and spec.partial == ("cp",) and spec.axes == ("dp", "tp")
    assert P is PartitionSpec and P() == PartitionSpec() and len(P(None, None)) == 2
    with pytest.raises(TypeError, match="an axis name, a tuple of axis names or None, but got 3"):
        P(3)


@pytest.mark.parametrize(("spec", "ndim", "message"), [
    (P("x"), None, r"expected one of the mesh's axes \('dp', 'tp'\), but got 'x'"),
    (P("dp", ("tp", "dp")), None, "expected each axis at most once, but got 'dp' twice"),
    (P("dp", partial="dp"), None, "expected each axis at most once, but got 'dp' twice"),
    (P("dp", None, "tp"), 2, "expected at most 2 entries .one per tensor dimension., but got 3"),
])
def test_a_wrong_spec_is_refused_at_the_door(spec: P, ndim: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_spec(MESH, spec, ndim)
    if ndim is None:
        with pytest.raises(ValueError, match=message):
            Sharding(MESH, spec)


def test_blocks_cover_the_tensor_once_per_replica() -> None:
    sharding = Sharding(MESH, P(None, ("dp", "tp")))
    assert sharding.local_shape((4, 12)) == (4, 2)
    assert [sharding.block(r, (4, 12))[1] for r in range(6)] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    replicated = Sharding(MESH, P("tp"))
    assert replicated.holders((6,)) == {((0, 2),): (0, 3), ((2, 4),): (1, 4), ((4, 6),): (2, 5)}
    assert replicated.global_shape((2,)) == (6,)
    with pytest.raises(ValueError, match=r"expected dimension 0 \(size 5\) to divide by 3"):
        replicated.local_shape((5,))


def test_placements_both_ways() -> None:
    assert to_placements(Sharding(MESH, P("tp", None, "dp"))) == (Shard(2), Shard(0))
    assert to_placements(Sharding(MESH, P(partial="tp"))) == (Replicate(), Partial())
    assert to_placements(Sharding(MESH, P(("dp", "tp")))) == (Shard(0), Shard(0))
    assert from_placements(MESH, (Shard(1), Partial())).spec == P(None, "dp", partial=("tp",))
    with pytest.raises(ValueError, match=r"expected \('dp', 'tp'\) at dimension 0, but got \('tp', 'dp'\)"):
        to_placements(Sharding(MESH, P(("tp", "dp"))))
    with pytest.raises(ValueError, match="expected 2 placements"):
        from_placements(MESH, (Shard(0),))
    for op in ("max", "avg", "min"):  # a pending mean read back as a pending sum would be size x too large
        with pytest.raises(ValueError, match=f"axis 'dp': expected a Partial sum .*, but got Partial.{op}.*fix: "):
            from_placements(MESH, (Partial(op), Replicate()))


def random_spec(mesh: fmesh.Mesh, rng: random.Random, ndim: int) -> P:
    dims: dict[int, list[str]] = {}
    partial = []
    for axis in mesh.axis_names:
        where = rng.randrange(-1, ndim + 1)
        if where == ndim:
            partial.append(axis)
        elif where >= 0:
            dims.setdefault(where, []).append(axis)
    last = max(dims, default=-1)
    return P(*(tuple(dims.get(d, ())) for d in range(last + 1)), partial=partial)


@settings(max_examples=30, deadline=None)
@given(sharding_meshes(), st.integers(0, 2**32 - 1), st.sampled_from(("sum", "avg", "max")))
def test_spec_to_placements_to_spec_round_trips_and_dtensor_places_every_block_where_fmesh_does(
        mesh: fmesh.Mesh, seed: int, reduce_op: str) -> None:
    rng = random.Random(seed)
    spec = random_spec(mesh, rng, 3)
    sharding = Sharding(mesh, spec)
    placements = to_placements(sharding)
    assert from_placements(mesh, placements) == sharding
    if spec.partial and reduce_op != "sum":  # a pending mean or max is not a spec's partial: refused, not misread
        other = tuple(Partial(reduce_op) if isinstance(p, Partial) else p for p in placements)
        with pytest.raises(ValueError, match=f"expected a Partial sum .*, but got Partial.{reduce_op}"):
            from_placements(mesh, other)
    shape = tuple(sharding.split(e) * 2 for e in spec.entries) + (1,) * (3 - len(spec))
    whole = torch.arange(float(math.prod(shape))).reshape(shape)
    holders = sharding.holders(shape)
    # the values of a pending sum are DTensor's to split, not to place: its blocks are those of the replicated value
    placed = [Replicate() if isinstance(p, Partial) else p for p in placements]
    members = sorted(mesh.group(mesh.rank_at(0), mesh.axis_names))  # a sub-mesh: one of several copies
    with fmesh.Context.fake(mesh.world_size, rank=mesh.rank_at(0)) as ctx:
        try:
            ctx.device_mesh(mesh)
        except ValueError as error:  # fmesh's refusal, named: DTensor has no mesh to compare on
            assert "torch's DeviceMesh cannot represent it" in str(error), error
            assume(False)
    assert sorted(r for ranks in holders.values() for r in ranks) == members  # every member holds one block
    for rank in (r for r in range(mesh.world_size) if mesh.coordinate(r) is not None):  # in any copy
        with fmesh.Context.fake(mesh.world_size, rank=rank) as ctx:
            device_mesh = ctx.device_mesh(mesh)
            block = sharding.block(rank, shape)
            mine = whole[tuple(slice(a, b) for a, b in block)]
            # DTensor cuts this rank's block itself (src_data_rank=None: no collective, each rank its own chunk)
            cut = distribute_tensor(whole, device_mesh, placed, src_data_rank=None).to_local()
            assert torch.equal(cut, mine), (mesh, spec, rank, block)
            assert rank not in members or rank in holders[block]
            tensor = DTensor.from_local(mine.clone(), device_mesh, placements, run_check=False)
            assert tuple(tensor.shape) == shape  # DTensor reads the same global shape back
            assert from_placements(mesh, tuple(tensor.placements)) == sharding


def test_the_pure_parts_import_no_torch_distributed() -> None:
    import subprocess
    import sys

    code = ("import sys, fmesh.spmd as s; s.sharding_text(s.Sharding(__import__('fmesh').make_mesh((2,), ('tp',)),"
            " s.P('tp')), (4,)); print('torch.distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(120),
                         check=True)
    assert out.stdout.strip() == "False"
