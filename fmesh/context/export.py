"""torch ``DeviceMesh`` objects built on the Context's own process groups, for FSDP2 and DTensor.

Exports are on the context's device (a CUDA ``DeviceMesh`` under NCCL, a CPU one under gloo), whatever
device type the mesh value names: the mesh says which ranks, the context where they compute, so the
same meshes run on a laptop and on GPUs without naming a device.

An :class:`Exporter` keeps, per universe, one torch root mesh that every exported mesh of that
universe shares (``DeviceMesh._concatenate``, which FSDP2 calls, needs one rank map; sharing the
root also shares its ``_flatten_mapping``), and one exported object per mesh value (DTensor's
caches treat equal meshes as interchangeable, so a value must always give the same object).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from fmesh.context import _torch
from fmesh.layout import Layout
from fmesh.mesh import Mesh


class Exporter:
    """Torch roots and exported ``DeviceMesh`` objects, by universe.

    >>> import fmesh
    >>> from datetime import timedelta
    >>> from fmesh.context.world import World
    >>> world = World.start(backend="fake", rank=0, world_size=4)
    >>> exporter, mesh = Exporter("cuda"), fmesh.make_mesh((4,), ("dp",))
    >>> groups = [_torch.create_group((0, 1, 2, 3), "doc:dp", rank=0, backend="fake", timeout=timedelta(seconds=60))]
    >>> exported = exporter.device_mesh(mesh, groups)
    >>> exported is exporter.device_mesh(mesh, groups), exported.size(), exported.device_type
    (True, 4, 'cuda')
    >>> world.close()  # it started the default group, so it ended it
    True
    """

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type
        self._roots: dict[str, Any] = {}
        self._exported: dict[tuple[Any, ...], Any] = {}
        # Per universe: the layout each exported axis name stands for (None once two exports disagree).
        self._name_layouts: dict[str, dict[str, Layout | None]] = {}

    @staticmethod
    def check(mesh: Mesh, rank: int) -> None:
        """``ValueError`` if torch cannot represent ``mesh`` or ``rank`` is not in it."""
        if mesh.frame:
            raise ValueError(
                f"{mesh!r} splits a strided axis unevenly; torch's DeviceMesh cannot represent it "
                "(one layout per dim). Export the mesh before that unflatten, or choose sizes that split evenly"
            )
        if mesh.coordinate(rank) is None:
            raise ValueError(f"rank {rank} is not covered by {mesh!r}; only covered ranks can export it")

    def export(self, mesh: Mesh, rank: int, groups: Callable[[], Sequence[dist.ProcessGroup]]) -> Any:
        """The ``DeviceMesh`` of ``mesh`` (cached; ``groups()``: one per axis, this rank's, asked for the first
        time only), once :meth:`check` passes."""
        exported = self.cached(mesh)
        if exported is None:
            self.check(mesh, rank)
            exported = self.device_mesh(mesh, groups())
        return exported

    def cached(self, mesh: Mesh) -> Any:
        """The export of ``mesh`` if there is one, else ``None``."""
        return self._exported.get((mesh.universe.id, mesh.axis_names, mesh.layouts))

    def device_mesh(self, mesh: Mesh, groups: Sequence[dist.ProcessGroup]) -> Any:
        """The ``DeviceMesh`` of ``mesh`` whose dims use ``groups`` (one per axis, this rank's)."""
        key = (mesh.universe.id, mesh.axis_names, mesh.layouts)
        exported = self._exported.get(key)
        if exported is None:
            root = self._roots.get(mesh.universe.id)
            if root is None:
                root = self._roots[mesh.universe.id] = _torch.export_root(mesh.universe, self._device_type)
            exported = _torch.export_device_mesh(mesh, root, groups)
            self._publish_names(mesh, root, exported)
            _torch.register_for_abort(root, exported)
            self._exported[key] = exported
        return exported

    def _publish_names(self, mesh: Mesh, root: Any, exported: Any) -> None:
        """Publish a 1-D export in the shared root's ``_flatten_mapping`` under its axis name.

        That lets ``sub_mesh._flatten(name)`` (FSDP2's ``dp_mesh_dims``) find our group instead of
        creating new ones, and lets DTensor merge collectives over several dims. But torch's
        ``get_group(name)`` consults the root's ``_flatten_mapping`` *before* the mesh's own dims, and
        every export of a universe shares one root: so a name may be published only while every
        export of the universe that uses it means the same layout. Once two exports disagree, the
        name is withdrawn for good, and each mesh resolves it through its own dims.
        """
        known = self._name_layouts.setdefault(mesh.universe.id, {})
        for name, layout in zip(mesh.axis_names, mesh.layouts, strict=True):
            if name not in known:
                known[name] = layout
            elif known[name] is not None and known[name] != layout:
                known[name] = None
                _torch.unregister_flattened(root, name)
        if mesh.ndim == 1 and known[mesh.axis_names[0]] is not None:
            _torch.register_flattened(root, mesh.axis_names[0], exported)

    def __len__(self) -> int:
        return len(self._exported)

    def clear(self) -> None:
        """Forget every root and export, and make the roots let go of our groups: the user may keep an
        exported mesh (in a DTensor, say) past ``close()``; the groups must not live on in it."""
        for root in self._roots.values():
            _torch.release_groups(root)
        self._roots.clear()
        self._exported.clear()
        self._name_layouts.clear()
