"""Mesh values: pure, hashable, no process groups and no torch.

* ``universe``: :class:`Universe`, the ranks a mesh lives on and their order (its id is the same in
  every process);
* ``mesh``: :class:`Mesh` (one layout per named axis) and its queries, and :func:`make_mesh`;
* ``transforms``: the pure functions from meshes to meshes (``slice``, ``flatten``, ``unflatten``,
  ``concat``, ``rename``, ``select``);
* ``elastic``: meshes after ranks are lost or join (``without``, ``resize``), in a new universe,
  and the conversion of ranks between the two numberings (``old_rank``, ``new_rank``);
* ``lineage``: :class:`Lineage`, which old slot each slot of such a universe was;
* ``frame``: the re-indexing of a universe that an uneven split of a strided axis needs.
"""

from fmesh.mesh.elastic import new_rank, old_rank, resize, without
from fmesh.mesh.lineage import Lineage
from fmesh.mesh.mesh import Mesh, make_mesh
from fmesh.mesh.transforms import concat, flatten, rename, select, slice, unflatten
from fmesh.mesh.universe import Universe

__all__ = [
    "Lineage",
    "Mesh",
    "Universe",
    "concat",
    "flatten",
    "make_mesh",
    "new_rank",
    "old_rank",
    "rename",
    "resize",
    "select",
    "slice",
    "unflatten",
    "without",
]
