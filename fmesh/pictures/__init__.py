"""Pictures: meshes and their groups, a job's traffic, a tensor's sharding; text and notebook HTML.

Every picture is one :class:`~fmesh.pictures.grid.Grid` (cells with their text, colour, title and hosts, under
row and column headers, in blocks), drawn as text by :mod:`fmesh.pictures.text` and as HTML by
:mod:`fmesh.pictures.markup`:

* ``fmesh.pictures.mesh``: one instance of a mesh, its groups tagged (:func:`render`, :func:`html`);
* ``fmesh.pictures.traffic``: a job's mesh once per axis that moves bytes (:func:`traffic_html`);
* :mod:`fmesh.pictures.sharding`: which ranks hold which block of a tensor, each block as large as it is
  (from plain shapes and splits; :func:`fmesh.spmd.sharding_text` and :func:`fmesh.spmd.sharding_html` draw a
  sharding or a DTensor with it).

Pure: no torch. ``fmesh.rendering`` is this package's former name and still serves the same functions.
"""

from __future__ import annotations

from fmesh.pictures.grid import GOLDEN_ANGLE, group_colour
from fmesh.pictures.markup import CAPTION_STYLE
from fmesh.pictures.mesh import html, render, show_in_notebooks
from fmesh.pictures.traffic import traffic_html

__all__ = ["CAPTION_STYLE", "GOLDEN_ANGLE", "group_colour", "html", "render", "show_in_notebooks", "traffic_html"]
