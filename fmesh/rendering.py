"""The pictures' former home, kept so that ``fmesh.rendering.html(mesh)`` and its neighbours keep working: every
name here is :mod:`fmesh.pictures`'s own.

>>> import fmesh
>>> fmesh.rendering.html is fmesh.pictures.html
True
"""

from __future__ import annotations

from fmesh.pictures import CAPTION_STYLE, GOLDEN_ANGLE, group_colour, html, render, show_in_notebooks, traffic_html

__all__ = ["CAPTION_STYLE", "GOLDEN_ANGLE", "group_colour", "html", "render", "show_in_notebooks", "traffic_html"]
