"""Sphinx configuration: ``python -m sphinx -n -W --keep-going docs docs/_build/html`` builds the site.

The API reference is generated from the docstrings (autodoc + autosummary); the notebooks are rendered with the
outputs they were committed with (myst-nb, no execution: the test suite runs them); reference tables that live in
code (the error catalogue) are rendered from the code by ``_ext/fmesh_docs.py``.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "_ext"))

import fmesh

project = "fmesh"
author = "the fmesh authors"
copyright = "the fmesh authors"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",  # a [source] link beside every documented object
    "myst_nb",
    "sphinx_copybutton",
    "fmesh_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "api/generated/*.md", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

# The notebooks are committed with their outputs (notebooks/build.py writes them, the tests run them).
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
add_module_names = True
python_use_unqualified_type_names = False

html_theme = "furo"
html_title = f"fmesh {release}"
html_static_path = ["_static"]
html_css_files = ["fmesh.css"]
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# -n: every reference must resolve. Only types of other projects, for which no inventory is available offline,
# are ignored, by pattern; fmesh's own names are never ignored (tests/system/test_docs.py checks this list).
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"torch(\..*)?"),
    ("py:.*", r"attrs?(\..*)?"),
    ("py:.*", r"numpy(\..*)?|np\..*"),
    ("py:.*", r"(collections\.abc|typing|typing_extensions|datetime|types|enum|pathlib|concurrent\.futures)\..*"),
    ("py:class", r"fractions\.Fraction"),
    ("py:class", r"timedelta"),  # datetime.timedelta, as annotated
    ("py:.*", r"(IPython|nbformat)(\..*)?"),
]
suppress_warnings: list[str] = []

assert fmesh.__all__  # the reference lists every name of it (tests/system/test_docs.py)
