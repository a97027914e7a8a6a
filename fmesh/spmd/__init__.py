"""Sharded computation the JAX way: specs and shardings, the manual region (``shard_map``) and per-axis types.

The specs, shardings and type rules are pure values (:mod:`fmesh.spmd.spec`, :mod:`fmesh.spmd.types`); the
placements and the region need torch (:mod:`fmesh.spmd.placements`, :mod:`fmesh.spmd.region`) and are
imported on first use, so a notebook without ``torch.distributed`` can still draw a sharding.
"""

from __future__ import annotations

from typing import Any

from fmesh.spmd.picture import sharding_html, sharding_text
from fmesh.spmd.spec import P, PartitionSpec, Sharding, check_spec, dim_axes

__all__ = ["Axes", "P", "PartitionSpec", "Region", "Sharding", "check_spec", "dim_axes", "from_placements", "place",
           "shard_map", "sharding_html", "sharding_text", "to_placements"]

_LAZY = {"Axes": "fmesh.spmd.region", "Region": "fmesh.spmd.region", "shard_map": "fmesh.spmd.region",
         "to_placements": "fmesh.spmd.placements", "from_placements": "fmesh.spmd.placements",
         "place": "fmesh.spmd.placements"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fmesh.spmd' has no attribute {name!r}")
