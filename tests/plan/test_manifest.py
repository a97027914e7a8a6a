"""The communicator manifest (fmesh.plan.manifest): against brute force, against the Context on real processes,
its size at a million ranks, its loader's one-line errors, and the diff of two plans."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import launch, succeeded

import fmesh
from fmesh.plan.jobs import job_meshes
from fmesh.plan.manifest import (
    SCHEMA,
    NcclMemory,
    build_manifest,
    check_manifest,
    dump_manifest,
    load_manifest,
)
from fmesh.plan.manifest_diff import diff_manifests

# --------------------------------------------------------------------------------- brute force


def brute_force(world: int, per_host: int, order: str, **degrees: int) -> dict[str, Any]:
    """Every group of every mesh axis the job uses, enumerated; communicators = distinct partitions of size > 1,
    in first-seen order (what the Context does), with hosts counted from the rank order by hand."""
    hosts = world // per_host
    host_of = (lambda r: r // per_host) if order == "block" else (lambda r: r % hosts)
    dims = fmesh.ParallelDims(world, **{"dp_shard": -1, **degrees})
    partitions: dict[tuple[tuple[int, ...], ...], list[str]] = {}
    for name, mesh in job_meshes(dims):
        for axis in mesh.axis_names:
            groups = tuple(sorted(mesh.groups(axis)))
            if len(groups[0]) == 1:
                continue
            partitions.setdefault(groups, []).append(name if mesh.ndim == 1 else f"{name}.{axis}")
    joined = {rank: sum(1 for groups in partitions for g in groups if rank in g) for rank in range(world)}
    return {
        "partitions": list(partitions.items()),
        "hosts": [max(len({host_of(r) for r in g}) for g in groups) for groups in partitions],
        "joined": set(joined.values()),
    }


def groups_of(entry: dict[str, Any], world: int) -> tuple[tuple[int, ...], ...]:
    """Every group a manifest communicator describes, from its layout alone."""
    layout = fmesh.Layout(tuple(entry["layout"]["shape"]), tuple(entry["layout"]["stride"]))
    bases = sorted({layout.decompose(r)[1] for r in range(world)})
    return tuple(sorted(tuple(base + layout(i) for i in range(layout.size)) for base in bases))


@st.composite
def small_jobs(draw: st.DrawFn) -> tuple[int, int, str, dict[str, int]]:
    per_host = draw(st.sampled_from([1, 2, 4]))
    world = per_host * draw(st.sampled_from([1, 2, 4]))
    left = world
    degrees: dict[str, int] = {}
    for name in ("pp", "dp_replicate", "cp", "tp"):
        degrees[name] = draw(st.sampled_from([d for d in (1, 2, 4) if left % d == 0]))
        left //= degrees[name]
    region = left * degrees["cp"] * degrees["tp"]
    degrees["ep"] = draw(st.sampled_from([d for d in (1, 2, 4) if region % d == 0]))
    return world, per_host, draw(st.sampled_from(["block", "cyclic"])), degrees


@given(small_jobs())
def test_manifest_counts_match_brute_force(case: tuple[int, int, str, dict[str, int]]) -> None:
    world, per_host, order, degrees = case
    manifest = build_manifest(world, per_host, rank_order=order, **degrees)
    assert check_manifest(manifest) is manifest
    truth = brute_force(world, per_host, order, **degrees)
    communicators = manifest["communicators"]
    assert len(communicators) == len(truth["partitions"])
    for entry, (groups, names), hosts in zip(communicators, truth["partitions"], truth["hosts"], strict=True):
        assert groups_of(entry, world) == groups
        assert entry["names"] == names
        assert entry["size"] == len(groups[0]) and entry["num_groups"] == len(groups)
        assert entry["hosts_per_group"] == hosts
        assert entry["gpu_memory_bytes"] == NcclMemory().communicator_bytes(entry["size"])
    assert truth["joined"] == {manifest["per_rank"]["communicators"]} or not communicators
    assert manifest["per_rank"]["gpu_memory_bytes"] == sum(c["gpu_memory_bytes"] for c in communicators)


def test_memory_formula_and_gloo() -> None:
    buffers = 4 * 2**20 + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16  # NCCL's Simple, LL128 and LL defaults
    assert NcclMemory().communicator_bytes(2) == 16 * 2 * buffers
    assert NcclMemory().communicator_bytes(64) == 16 * 4 * buffers
    assert NcclMemory().communicator_bytes(1) == 0
    gloo = build_manifest(16, 8, tp=8, backend="gloo")
    assert gloo["per_rank"] == {"communicators": 2, "gpu_memory_bytes": 0}


def test_a_million_ranks_make_a_small_manifest(tmp_path: pathlib.Path) -> None:  # how fast: README
    manifest = build_manifest(2**20, 8, pp=8, cp=2, tp=8, ep=32)
    text = dump_manifest(manifest)
    assert len(text.encode()) < 2**20
    (tmp_path / "m.json").write_text(text)
    assert load_manifest(tmp_path / "m.json") == manifest
    dp = next(c for c in manifest["communicators"] if "dp_shard" in c["names"])
    assert dp["size"] == 8192 and dp["num_groups"] == 128 and dp["hosts_per_group"] == 8192


# ------------------------------------------------------------------------- against the Context

JOB = {"world": 8, "per_host": 4, "degrees": {"dp_replicate": 2, "tp": 2, "ep": 2}}


def context_groups(ctx: fmesh.Context) -> dict[str, Any]:
    dims = fmesh.ParallelDims(JOB["world"], **JOB["degrees"])  # type: ignore[arg-type]
    meshes = [mesh for _, mesh in job_meshes(dims)]
    plan = ctx.plan(*meshes)
    ctx.materialize(*meshes)
    stats = ctx.stats()
    return {
        "rank": ctx.rank,
        "planned": [(g.size, g.num_groups, g.hosts_per_group, g.ranks) for g in plan.groups if g.size > 1],
        "created": stats["groups_created"],
        "groups": [list(ranks) for ranks, _ in stats["groups"]],
    }


@pytest.mark.slow
def test_the_manifest_says_what_the_context_then_creates() -> None:
    manifest = build_manifest(JOB["world"], JOB["per_host"], backend="gloo", **JOB["degrees"])  # type: ignore[arg-type]
    results = succeeded(launch(context_groups, JOB["world"], timeout=240,  # type: ignore[arg-type]
                                gpus_per_node=JOB["per_host"]))  # launch: gloo
    communicators = manifest["communicators"]
    assert len(communicators) >= 4
    for result in results:
        rank = result["rank"]
        mine = [next(g for g in groups_of(c, JOB["world"]) if rank in g) for c in communicators]  # type: ignore
        assert result["created"] == manifest["per_rank"]["communicators"] == len(communicators)
        assert result["planned"] == [(c["size"], c["num_groups"], c["hosts_per_group"], g)
                                     for c, g in zip(communicators, mine, strict=True)]
        assert result["groups"] == [list(g) for g in mine]  # created in the manifest's order


# --------------------------------------------------------------------------------- the loader


def tampered(change: Any) -> dict[str, Any]:
    data = copy.deepcopy(build_manifest(64, 8, tp=8, cp=2))
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="fmesh.manifest/2"),
         "expected schema 'fmesh.manifest/1', but got 'fmesh.manifest/2'"),
        (lambda d: d.pop("communicators"), "manifest has no field 'communicators'"),
        (lambda d: d["communicators"][0].update(size=3), "communicators[0].size is 3, but its layout has"),
        (lambda d: d["communicators"][1].update(num_groups=5), "communicators[1] has 5 groups of"),
        (lambda d: d["communicators"][0]["layout"].update(stride=[3]), "communicators[0].layout does not tile"),
        (lambda d: d["communicators"][1].update(order=0), "expected communicators[1].order to be 1"),
        (lambda d: d["per_rank"].update(communicators=9), "per_rank.communicators is 9, but 4 communicators"),
        (lambda d: d["per_rank"].update(gpu_memory_bytes=1), "per_rank.gpu_memory_bytes is 1, but the"),
        (lambda d: d["universe"].update(world_size=32), "job has 8 hosts x 8 gpus, but the world has 32 ranks"),
        (lambda d: d["communicators"].append(dict(d["communicators"][0], order=4)),
         "communicators[4] repeats the layout of communicators[0]"),
        (lambda d: d.update(backend="mpi"), "expected backend among ('nccl', 'gloo'), but got 'mpi'"),
        (lambda d: d["communicators"][0].update(size="8"), "expected communicators[0].size as int, but got '8'"),
    ],
)
def test_a_mismatched_manifest_is_one_line_naming_the_field(change: Any, message: str, tmp_path: pathlib.Path
                                                            ) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(tampered(change)))
    with pytest.raises(fmesh.errors.ManifestError) as error:
        load_manifest(path)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{path}: ") and message in text


def test_unreadable_files_are_one_line(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path, message in [(bad, "not JSON: Expecting property name"), (tmp_path / "none.json", "cannot read it"),
                          (tmp_path, "cannot read it: Is a directory")]:
        with pytest.raises(fmesh.errors.ManifestError, match=message):
            load_manifest(path)
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(fmesh.errors.ManifestError, match=f"with schema '{SCHEMA}', but got list"):
        load_manifest(tmp_path / "list.json")


def test_written_and_read_back_unchanged(tmp_path: pathlib.Path) -> None:
    manifest = build_manifest(4096, 8, pp=4, cp=2, tp=8, ep=8)
    (tmp_path / "m.json").write_text(dump_manifest(manifest))
    assert load_manifest(tmp_path / "m.json") == manifest


# ---------------------------------------------------------------------------------- the diff


def test_diff_of_a_plan_with_itself_changes_nothing() -> None:
    a = build_manifest(64, 8, cp=2, tp=4)
    diff = diff_manifests(a, copy.deepcopy(a))
    assert diff["added"] == diff["removed"] == [] and len(diff["shared"]) == len(a["communicators"])
    assert diff["ranks_changing_group"] == 0 and {e["change"] for e in diff["axes"]} == {"same"}


@given(small_jobs(), small_jobs())
def test_diff_against_brute_force(first: tuple[int, int, str, dict[str, int]],
                                  second: tuple[int, int, str, dict[str, int]]) -> None:
    a = build_manifest(first[0], first[1], rank_order=first[2], **first[3])
    b = build_manifest(second[0], second[1], rank_order=second[2], **second[3])
    diff = diff_manifests(a, b)
    layouts_a = {json.dumps(c["layout"]) for c in a["communicators"]}
    layouts_b = {json.dumps(c["layout"]) for c in b["communicators"]}
    assert {json.dumps(c["layout"]) for c in diff["added"]} == layouts_b - layouts_a
    assert {json.dumps(c["layout"]) for c in diff["removed"]} == layouts_a - layouts_b
    assert len(diff["shared"]) == len(layouts_a & layouts_b)
    # which ranks change group along each axis, by enumerating every rank present in both worlds
    both = min(first[0], second[0])
    groups_a, groups_b = named_groups(a), named_groups(b)
    changing: set[int] = set()
    for entry in diff["axes"]:
        name = entry["name"]
        if name not in groups_a or name not in groups_b:
            assert entry["change"] == ("added" if name not in groups_a else "removed")
            continue
        moved = {r for r in range(both) if set(groups_a[name](r)) != set(groups_b[name](r))}
        reordered = {r for r in range(both) if groups_a[name](r) != groups_b[name](r)}
        assert (entry["change"] == "regrouped") == bool(moved)
        assert moved in (set(), set(range(both)))  # all or nothing, as the diff says
        assert (entry["change"] in ("regrouped", "reordered")) == bool(reordered)
        changing |= moved
    assert diff["ranks_changing_group"] == len(changing)


def named_groups(manifest: dict[str, Any]) -> dict[str, Any]:
    world = manifest["universe"]["world_size"]
    found: dict[str, Any] = {name: (lambda r: (r,)) for name in manifest["trivial"]}
    for entry in manifest["communicators"]:
        layout = fmesh.Layout(tuple(entry["layout"]["shape"]), tuple(entry["layout"]["stride"]))

        def group(rank: int, layout: fmesh.Layout = layout) -> tuple[int, ...]:
            base = layout.decompose(rank)[1]
            return tuple(base + layout(i) for i in range(layout.size))

        for name in entry["names"]:
            found[name] = group
    assert all(max(found[n](world - 1)) < world for n in found)
    return found
