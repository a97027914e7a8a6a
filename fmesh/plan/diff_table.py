"""The diff of two manifests as text: what ``python -m fmesh diff`` prints.

>>> from fmesh.plan.manifest import plan_manifest
>>> from fmesh.plan.manifest_diff import compare
>>> print(format_diff(compare(plan_manifest(64, 8, tp=8), plan_manifest(64, 8, tp=4))).splitlines()[2])
communicators: 0 shared, 2 added, 2 removed
"""

from __future__ import annotations

from fmesh.plan.manifest_diff import SHOWN, ManifestDiff

__all__ = ["format_diff"]

def _ranks(ranks: tuple[int, ...], size: int | None) -> str:
    if size is None or size <= SHOWN:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:-1])) + f", ..., {ranks[-1]}]"


def format_diff(diff: ManifestDiff) -> str:
    """A readable account of :func:`fmesh.plan.manifest_diff.compare`.

    >>> from fmesh.plan.manifest import plan_manifest
    >>> from fmesh.plan.manifest_diff import compare
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
