"""The layout algebra: pure functions over tuples of ints; knows nothing of meshes."""

from fmesh.layout.int_tuple import IntTuple
from fmesh.layout.layout import Layout, concat

__all__ = ["IntTuple", "Layout", "concat"]
