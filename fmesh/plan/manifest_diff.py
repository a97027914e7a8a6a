"""What changes from one manifest to another: communicators shared, added and removed, and along which axes
ranks change group.

Layout arithmetic only: a rank keeps its group along an axis exactly when both layouts reach the same offsets,
so the answer is "every rank of both worlds" or "none", per axis. :func:`compare` answers with a typed
:class:`ManifestDiff`; :func:`diff_manifests` takes and gives JSON documents (``diff --json``).

>>> from fmesh.plan.manifest import plan_manifest
>>> d = compare(plan_manifest(64, 8, tp=8), plan_manifest(64, 8, tp=4))
>>> [c.names[0] for c in d.removed], d.ranks_changing_group
(['dp_shard', 'tp'], 64)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import attrs

from fmesh.layout.flat import Modes
from fmesh.layout.layout import from_modes, sorted_by_stride
from fmesh.plan.manifest import Manifest, ManifestCommunicator

__all__ = ["CHANGES", "SHOWN", "AxisChange", "Change", "ManifestDiff", "SharedCommunicator", "compare",
           "diff_manifests"]

SHOWN = 6
"""Ranks of rank 0's group a diff shows (the first ones, then the last)."""

Change = Literal["same", "reordered", "regrouped", "added", "removed"]
"""How an axis changes between two manifests (:data:`CHANGES`)."""

CHANGES: tuple[Change, ...] = get_args(Change)
"""How an axis changes: same layout; other order, same groups; other groups; only in B; only in A."""


@attrs.frozen
class SharedCommunicator:
    """A layout both manifests create: its names in each, its size, and its hosts and groups in A and B."""

    names: tuple[str, ...]
    names_before: tuple[str, ...]
    size: int
    hosts_per_group: tuple[int, int]
    num_groups: tuple[int, int]

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "names_before": list(self.names_before), "size": self.size,
                "hosts_per_group": list(self.hosts_per_group), "num_groups": list(self.num_groups)}


@attrs.frozen
class AxisChange:
    """One mesh axis (``mesh`` or ``mesh.axis``): how its groups change (:data:`CHANGES`), its group size in A
    and B (None where absent), and rank 0's group in each where the groups are regrouped or reordered."""

    name: str
    change: Change
    size: tuple[int | None, int | None]
    rank0_group: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "change": self.change, "size": list(self.size)}
        if self.rank0_group is not None:
            found["rank0_group"] = [list(group) for group in self.rank0_group]
        return found


@attrs.frozen
class ManifestDiff:
    """What :func:`compare` answers (pairs are ``(A, B)``)."""

    a: str  # Manifest.summary() of each side
    b: str
    shared: tuple[SharedCommunicator, ...]
    added: tuple[ManifestCommunicator, ...]
    removed: tuple[ManifestCommunicator, ...]
    axes: tuple[AxisChange, ...]
    ranks_changing_group: int
    ranks_in_both: int
    communicators: tuple[int, int]  # per rank
    gpu_memory_bytes: tuple[int, int]  # per rank

    @property
    def axes_regrouped(self) -> tuple[str, ...]:
        """The axes along which ranks change group."""
        return tuple(e.name for e in self.axes if e.change == "regrouped")

    def to_json(self) -> dict[str, Any]:
        """The diff as ``diff --json`` prints it."""
        return {
            "a": self.a,
            "b": self.b,
            "shared": [c.to_json() for c in self.shared],
            "added": [c.to_json() for c in self.added],
            "removed": [c.to_json() for c in self.removed],
            "axes": [e.to_json() for e in self.axes],
            "axes_regrouped": list(self.axes_regrouped),
            "ranks_changing_group": self.ranks_changing_group,
            "ranks_in_both": self.ranks_in_both,
            "per_rank": {"communicators": list(self.communicators), "gpu_memory_bytes": list(self.gpu_memory_bytes)},
        }


def _image(modes: Modes) -> Modes:
    """The set of offsets a layout reaches, in one canonical form: two layouts put the same ranks together
    exactly when these are equal (sorted by stride, then coalesced)."""
    if not modes:
        return ()
    return sorted_by_stride(from_modes(modes)).coalesce().modes


def _axes_layouts(manifest: Manifest) -> dict[str, Modes]:
    found: dict[str, Modes] = {name: () for name in manifest.trivial}
    for entry in manifest.communicators:
        for name in entry.names:
            found[name] = entry.modes
    return found


def _group_of_zero(modes: Modes) -> tuple[int, ...]:
    ranks = from_modes(modes or ((1, 0),))  # a trivial axis: the group of rank 0 alone
    size = ranks.size
    shown = list(range(min(size, SHOWN))) + ([size - 1] if size > SHOWN else [])
    return tuple(ranks(i) for i in shown)


def _size(modes: Modes | None) -> int | None:
    return None if modes is None else from_modes(modes).size


def _axis_change(name: str, before: Modes | None, after: Modes | None) -> AxisChange:
    change: Change
    if before is None or after is None:
        change = "added" if before is None else "removed"
    elif before == after:
        change = "same"
    elif _image(before) == _image(after):
        change = "reordered"
    else:
        change = "regrouped"
    group = ((_group_of_zero(before or ()), _group_of_zero(after or ()))
             if change in ("regrouped", "reordered") else None)
    return AxisChange(name, change, (_size(before), _size(after)), group)


def compare(a: Manifest, b: Manifest) -> ManifestDiff:
    """What changes from manifest ``a`` to ``b`` (module docstring).

    >>> from fmesh.plan.manifest import plan_manifest
    >>> d = compare(plan_manifest(64, 8, tp=8), plan_manifest(64, 8, tp=4))
    >>> d.axes_regrouped[:3], len(d.shared)
    (('dp_shard', 'dp', 'dp_shard_cp'), 0)
    """
    layouts_a = {c.modes: c for c in a.communicators}
    layouts_b = {c.modes: c for c in b.communicators}
    shared = tuple(
        SharedCommunicator(names=layouts_b[m].names, names_before=layouts_a[m].names, size=layouts_a[m].size,
                           hosts_per_group=(layouts_a[m].hosts_per_group, layouts_b[m].hosts_per_group),
                           num_groups=(layouts_a[m].num_groups, layouts_b[m].num_groups))
        for m in layouts_a if m in layouts_b
    )
    axes_a, axes_b = _axes_layouts(a), _axes_layouts(b)
    axes = tuple(_axis_change(name, axes_a.get(name), axes_b.get(name))
                 for name in [*axes_a, *(n for n in axes_b if n not in axes_a)])
    both = min(a.world_size, b.world_size)
    return ManifestDiff(
        a=a.summary(), b=b.summary(), shared=shared,
        added=tuple(layouts_b[m] for m in layouts_b if m not in layouts_a),
        removed=tuple(layouts_a[m] for m in layouts_a if m not in layouts_b),
        axes=axes, ranks_changing_group=both if any(e.change == "regrouped" for e in axes) else 0,
        ranks_in_both=both, communicators=(a.per_rank_communicators, b.per_rank_communicators),
        gpu_memory_bytes=(a.per_rank_gpu_memory_bytes, b.per_rank_gpu_memory_bytes),
    )


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`compare` of two manifest documents (each checked first), as JSON data.

    >>> from fmesh.plan.manifest import build_manifest
    >>> d = diff_manifests(build_manifest(64, 8, tp=8), build_manifest(64, 8, tp=4))
    >>> [c["names"][0] for c in d["removed"]], [c["names"][0] for c in d["added"]]
    (['dp_shard', 'tp'], ['dp_shard', 'tp'])
    >>> d["ranks_changing_group"], sorted(d["axes_regrouped"])[:3]
    (64, ['dp', 'dp_cp', 'dp_shard'])
    """
    return compare(Manifest.from_json(a, "A"), Manifest.from_json(b, "B")).to_json()
