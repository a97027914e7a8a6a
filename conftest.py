"""Doctest collection for objects that report their public module.

``import fmesh`` sets ``__module__ = "fmesh"`` on every public class and function (so docs and tracebacks say
``fmesh.Mesh``). doctest decides which module's doctests an object belongs to by its ``__module__``, which would
move a class's docstring to ``fmesh/__init__.py`` and lose its methods' doctests (those belong to the module whose
globals they use). Here an object published as ``fmesh.NAME`` belongs to the module whose source defines it.
"""

from __future__ import annotations

import doctest
import functools
import pathlib
import re
import types
from typing import Any

_original_from_module = doctest.DocTestFinder._from_module  # type: ignore[attr-defined]


@functools.cache
def _source(path: str) -> str:
    return pathlib.Path(path).read_text()


def _defines(module: types.ModuleType, value: Any) -> bool:
    path = getattr(module, "__file__", None)
    return bool(path) and re.search(rf"^(class|def) {re.escape(value.__name__)}\b", _source(path), re.M) is not None


def _from_module(self: doctest.DocTestFinder, module: types.ModuleType | None, value: Any) -> bool:
    published = getattr(value, "__module__", None) == "fmesh" and "." not in getattr(value, "__qualname__", ".")
    if module is not None and published:
        return vars(module).get(value.__name__) is value and _defines(module, value)
    return bool(_original_from_module(self, module, value))


doctest.DocTestFinder._from_module = _from_module  # type: ignore[attr-defined]
