"""The public names as a user meets them: ``dir(fmesh)`` lists the lazy ones, and every public object reports
``fmesh`` as its module (so docs, reprs and tracebacks show ``fmesh.Context``, not where it is defined)."""

from __future__ import annotations

import subprocess
import sys
import types

import fmesh


def test_dir_lists_every_public_name_lazy_ones_included() -> None:
    # A fresh interpreter: nothing has touched fmesh.Context yet, so the lazy names are not in the module's dict.
    code = ("import fmesh, sys; print(sorted(set(fmesh.__all__) - set(dir(fmesh))));"
            " print('fmesh.context' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "False"]


def test_every_public_object_reports_the_public_module() -> None:
    wrong = {
        name: getattr(fmesh, name).__module__
        for name in fmesh.__all__
        if not isinstance(getattr(fmesh, name), types.ModuleType) and getattr(fmesh, name).__module__ != "fmesh"
    }
    assert wrong == {}
    assert repr(fmesh.Context) == "<class 'fmesh.Context'>"
    assert fmesh.MeshMismatchError.__module__ == "fmesh"


def test_public_modules_keep_their_own_names() -> None:
    modules = [name for name in fmesh.__all__ if isinstance(getattr(fmesh, name), types.ModuleType)]
    assert modules and all(getattr(fmesh, name).__name__ == f"fmesh.{name}" for name in modules)
