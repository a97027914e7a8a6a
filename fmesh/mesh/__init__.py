"""Mesh values: pure, hashable, no process groups and no ``torch.distributed``."""

from fmesh.mesh.mesh import Mesh, make_mesh
from fmesh.mesh.transforms import concat, flatten, rename, select, slice, unflatten
from fmesh.mesh.universe import Universe

__all__ = ["Mesh", "Universe", "concat", "flatten", "make_mesh", "rename", "select", "slice", "unflatten"]
