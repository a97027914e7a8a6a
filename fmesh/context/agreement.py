"""Check, through the store, that every member of a group means the same group before creating it.

torch's ``DeviceMesh`` hangs when ranks disagree about a mesh: each side waits
for a rendezvous the other never joins. Here each member publishes a short
description of what it is about to create under a key all members can compute
without agreeing first (the context, the axis names and how many groups this
rank already made for them), then reads everyone else's. A different
description is reported at once on every member that sees it; a member that
never publishes is reported after the timeout, by rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from fmesh.errors import GroupTimeoutError, MeshMismatchError


def agree(
    store: dist.Store,
    key: str,
    rank: int,
    members: Sequence[int],
    description: str,
    timeout: timedelta,
    what: str,
) -> None:
    """Publish ``description`` under ``key`` and check every member published the same one."""
    store.set(f"{key}/{rank}", description)
    others = [m for m in members if m != rank]
    keys = [f"{key}/{m}" for m in others]
    try:
        store.wait(keys, timeout)
    except dist.DistStoreError as error:  # what a store's wait raises when it times out
        missing = [m for m, k in zip(others, keys, strict=True) if not store.check([k])]
        raise GroupTimeoutError(
            f"{what}: rank {rank} waited {timeout.total_seconds():g}s for ranks {missing} of group "
            f"{list(members)}, which never arrived (they did not create this group, or crashed)"
        ) from error
    seen = [value.decode() for value in store.multi_get(keys)]
    differing = [(m, v) for m, v in zip(others, seen, strict=True) if v != description]
    if differing:
        views = "; ".join(f"rank {m} sees {v}" for m, v in differing)
        raise MeshMismatchError(
            f"{what}: ranks disagree about the mesh. Rank {rank} sees {description}; {views}. "
            "Build the mesh from the same sizes, names and rank_map on every rank"
        )
