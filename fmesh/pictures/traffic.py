"""The job's traffic as pictures: its mesh once per axis that moves bytes, that axis's groups coloured."""

from __future__ import annotations

import html as _html
from collections.abc import Sequence

from fmesh.pictures.markup import CAPTION_STYLE
from fmesh.pictures.mesh import html
from fmesh.plan.costs import format_bytes
from fmesh.plan.parallel import DERIVED_MESHES, ParallelDims
from fmesh.plan.topology import Topology
from fmesh.plan.traffic import Transfer

__all__ = ["traffic_html"]

EXPERT_AXES = ("ep", "efsdp", "etp")
"""The axes of the job's expert mesh (the others are the world mesh's, or flatten some of them)."""


def traffic_html(dims: ParallelDims, moved: Sequence[Transfer], topology: Topology | None = None) -> str:
    """The job's mesh once per axis that moves bytes, that axis's groups coloured (:func:`html`), under a caption
    with the bytes one rank moves along it per step, by collective (:func:`fmesh.plan.traffic.traffic`).

    >>> from fmesh.plan.model import Options, preset
    >>> from fmesh.plan.traffic import traffic
    >>> dims = ParallelDims(16, dp_shard=2, tp=8)
    >>> out = traffic_html(dims, traffic(preset("llama3-8b"), Options(recompute="none"), dims), Topology(2, 8))
    >>> out.count("<table"), "tp: " in out
    (3, True)
    """
    by_axis: dict[str, list[Transfer]] = {}
    for transfer in moved:
        by_axis.setdefault(transfer.axis, []).append(transfer)
    out = ['<div class="fmesh-traffic">']
    for axis, transfers in by_axis.items():
        total = sum(t.nbytes for t in transfers)
        parts = ", ".join(f"{t.collective} {format_bytes(t.nbytes)} in {t.calls} calls ({t.purpose})"
                          for t in transfers)
        out.append(f'<p style="{CAPTION_STYLE}"><b>{_html.escape(axis)}: {_html.escape(format_bytes(total))} per '
                   f"step</b>: {_html.escape(parts)}</p>")
        mesh = dims.expert_mesh if axis in EXPERT_AXES else dims.world_mesh
        highlight = DERIVED_MESHES.get(axis, (axis,))
        if all(name in mesh.axis_names for name in highlight):
            out.append(html(mesh, highlight, topology=topology))
    out.append("</div>")
    return "".join(out)
