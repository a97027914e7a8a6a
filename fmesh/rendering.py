"""The pictures' former home, kept so that ``fmesh.rendering.html(mesh)`` and its neighbours keep working: every
name here is :mod:`fmesh.pictures`'s own (documented there; this module publishes nothing of its own).

>>> import fmesh
>>> fmesh.rendering.html is fmesh.pictures.html
True
"""

from __future__ import annotations

from fmesh.pictures import CAPTION_STYLE as CAPTION_STYLE
from fmesh.pictures import GOLDEN_ANGLE as GOLDEN_ANGLE
from fmesh.pictures import group_colour as group_colour
from fmesh.pictures import html as html
from fmesh.pictures import render as render
from fmesh.pictures import show_in_notebooks as show_in_notebooks
from fmesh.pictures import traffic_html as traffic_html

__all__: list[str] = []
