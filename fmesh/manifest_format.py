"""Manifests and their diffs as text: what ``python -m fmesh plan --manifest`` and ``python -m fmesh diff``
print.

>>> from fmesh.manifest import plan_manifest
>>> print(format_manifest(plan_manifest(16, 8, tp=8)).splitlines()[0])
world 16 = 2 hosts x 8 (block order), nccl; dp_shard=2 tp=8
"""

from __future__ import annotations

from fmesh.layout.layout import from_modes
from fmesh.manifest import Manifest
from fmesh.manifest_diff import SHOWN, ManifestDiff
from fmesh.planning import format_table

__all__ = ["format_diff", "format_manifest"]


def format_manifest(manifest: Manifest) -> str:
    """A short table of a manifest: one line per communicator, and what each rank holds.

    >>> from fmesh.manifest import plan_manifest
    >>> print("\\n".join(format_manifest(plan_manifest(16, 8, tp=8)).splitlines()[1:3]))
    order  size  groups  hosts  layout     memory/rank  names
        0     2       8      2  (2,):(8,)      294 MiB  dp_shard, dp, dp_shard_cp, dp_cp, fsdp_mesh
    """
    rows = [("order", "size", "groups", "hosts", "layout", "memory/rank", "names")]
    for entry in manifest.communicators:
        layout = from_modes(entry.modes)
        rows.append((str(entry.order), str(entry.size), str(entry.num_groups), str(entry.hosts_per_group),
                     f"{layout.shape}:{layout.stride}", f"{entry.gpu_memory_bytes / 2**20:.0f} MiB",
                     ", ".join(entry.names)))
    lines = [manifest.summary(), *format_table(rows, (True, True, True, True, False, True, False))]
    lines.append(f"each rank joins {manifest.per_rank_communicators} communicators, about "
                 f"{manifest.per_rank_gpu_memory_bytes / 2**30:.2f} GiB of GPU memory for their buffers")
    return "\n".join(lines)


def _ranks(ranks: tuple[int, ...], size: int | None) -> str:
    if size is None or size <= SHOWN:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:-1])) + f", ..., {ranks[-1]}]"


def format_diff(diff: ManifestDiff) -> str:
    """A readable account of :func:`fmesh.manifest_diff.compare`.

    >>> from fmesh.manifest import plan_manifest
    >>> from fmesh.manifest_diff import compare
    >>> text = format_diff(compare(plan_manifest(64, 8, tp=8), plan_manifest(64, 8, tp=4)))
    >>> text.splitlines()[2]
    'communicators: 0 shared, 2 added, 2 removed'
    """
    lines = [f"A: {diff.a}", f"B: {diff.b}",
             f"communicators: {len(diff.shared)} shared, {len(diff.added)} added, {len(diff.removed)} removed"]
    for shared in diff.shared:
        hosts = shared.hosts_per_group
        moved = "" if hosts[0] == hosts[1] else f", hosts per group {hosts[0]} -> {hosts[1]}"
        renamed = "" if shared.names == shared.names_before else f"; in A: {', '.join(shared.names_before)}"
        lines.append(f"  shared   {', '.join(shared.names)} (size {shared.size}{moved}{renamed})")
    for kind, entries in (("removed", diff.removed), ("added", diff.added)):
        for entry in entries:
            lines.append(f"  {kind:<8} {', '.join(entry.names)} (size {entry.size}, "
                         f"{entry.num_groups} groups, {entry.hosts_per_group} hosts per group)")
    changed = [e for e in diff.axes if e.change != "same"]
    if changed:
        lines.append("axes:")
    for axis in changed:
        before, after = axis.size
        sizes = f"{before if before is not None else '-'} -> {after if after is not None else '-'}"
        text = f"  {axis.name:<22} {axis.change:<10} size {sizes}"
        if axis.rank0_group is not None:
            old, new = axis.rank0_group
            text += f"; rank 0's group {_ranks(old, before)} -> {_ranks(new, after)}"
        lines.append(text)
    if diff.ranks_changing_group:
        lines.append(f"ranks changing group: all {diff.ranks_changing_group} ranks present in both, along "
                     f"{', '.join(diff.axes_regrouped)}")
    else:
        lines.append(f"ranks changing group: none of the {diff.ranks_in_both} ranks present in both")
    communicators, memory = diff.communicators, diff.gpu_memory_bytes
    lines.append(f"per rank: {communicators[0]} -> {communicators[1]} communicators, "
                 f"{memory[0] / 2**30:.2f} -> {memory[1] / 2**30:.2f} GiB of GPU memory")
    return "\n".join(lines)
