"""The manifest as text: what ``python -m fmesh plan --manifest`` prints.

>>> from fmesh.plan.manifest import plan_manifest
>>> print(format_manifest(plan_manifest(16, 8, tp=8)).splitlines()[0])
world 16 = 2 hosts x 8 (block order), nccl; dp_shard=2 tp=8
"""

from __future__ import annotations

from fmesh.layout.layout import from_modes
from fmesh.plan.manifest import Manifest
from fmesh.plan.table import format_table

__all__ = ["format_manifest"]


def format_manifest(manifest: Manifest) -> str:
    """A short table of a manifest: one line per communicator, and what each rank holds.

    >>> from fmesh.plan.manifest import plan_manifest
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
