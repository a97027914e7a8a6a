"""The layout algebra: pure functions over tuples of ints; knows nothing of meshes.

* ``int_tuple``: nested tuples of ints (flatten, product, row-major strides and coordinates);
* ``flat``: the operations on flat ``(size, stride)`` modes (coalesce, complement, decompose, values), the form
  the mesh's hot paths use without making a :class:`Layout` at each step; each has the same name as the
  :class:`Layout` method it implements;
* ``layout``: :class:`Layout` (``shape:stride``) and its algebra, CuTe's re-derived for row-major
  order: coalesce, composition, complement, inverse, concatenation.
"""

from fmesh.layout.int_tuple import IntTuple
from fmesh.layout.layout import Layout, concat

__all__ = ["IntTuple", "Layout", "concat"]
