"""fmesh: a JAX-style, functional device-mesh API for PyTorch.

Mesh values are pure and cheap at any world size; a Context (the only part
with side effects) turns them into process groups when a collective needs one.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
>>> fmesh.flatten(mesh, ("dp", "cp"), "dp_cp").group(0, "dp_cp")
(0, 4, 8, 12)
"""

from fmesh import parallel, topology
from fmesh.layout import Layout
from fmesh.mesh import Mesh, Universe, concat, flatten, make_mesh, rename, select, slice, unflatten
from fmesh.parallel import ParallelDims
from fmesh.topology import Topology

__all__ = [
    "Layout",
    "Mesh",
    "ParallelDims",
    "Topology",
    "Universe",
    "concat",
    "flatten",
    "make_mesh",
    "parallel",
    "rename",
    "select",
    "slice",
    "topology",
    "unflatten",
]
