"""The public names as a user meets them: ``dir(fmesh)`` lists the lazy ones, and every public object reports
``fmesh`` as its module (so docs, reprs and tracebacks show ``fmesh.Context``, not where it is defined)."""

from __future__ import annotations

import subprocess
import sys
import types

from support import patience

import fmesh


def test_dir_lists_every_public_name_lazy_ones_included() -> None:
    # A fresh interpreter: nothing has touched fmesh.Context yet, so the lazy names are not in the module's dict.
    code = ("import fmesh, sys; print(sorted(set(fmesh.__all__) - set(dir(fmesh))));"
            " print('fmesh.context' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(120),
                         check=True)
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


FRONT_DOOR = {
    "values": {"Layout", "Mesh", "Universe", "make_mesh"},
    "transforms": {"concat", "flatten", "rename", "select", "slice", "unflatten"},
    "elastic meshes": {"new_rank", "old_rank", "resize", "without"},
    "the Context": {"Context", "from_device_mesh", "launch", "simulate"},
    "recipes and the picture": {"ParallelDims", "Topology", "cost", "render"},
    "errors a program catches": {"ContextClosedError", "GroupTimeoutError", "LaunchError", "MeshMismatchError",
                                 "NoGradientError", "RankLostError", "RecoveryError", "SpmdTypeError",
                                 "TensorMismatchError",
                                 "UnsupportedTorchError"},
}


def test_the_front_door_holds_about_thirty_names_and_no_module() -> None:
    assert set(fmesh.__all__) == set().union(*FRONT_DOOR.values())
    assert len(fmesh.__all__) == len(set(fmesh.__all__)) <= 32
    assert not [name for name in fmesh.__all__ if isinstance(getattr(fmesh, name), types.ModuleType)]


def test_the_rest_is_one_package_away() -> None:
    import fmesh.context

    # Every public name of the packages behind the front door is reached through them, as itself.
    for package in (fmesh.context, fmesh.errors, fmesh.mesh):
        for name in package.__all__:
            value = getattr(package, name)
            assert name not in fmesh.__all__ or getattr(fmesh, name) is value, (package.__name__, name)
    for module_name in fmesh.plan.__all__:
        module = getattr(fmesh.plan, module_name)
        assert module.__name__ == f"fmesh.plan.{module_name}" and module.__all__, module_name
        for name in module.__all__:
            assert hasattr(module, name), (module_name, name)
    # A name left out of the front door is not there at all (no second spelling), and keeps its module.
    assert not hasattr(fmesh, "AxisOptions") and not hasattr(fmesh, "ManifestError")
    assert fmesh.errors.ManifestError.__module__ == "fmesh.errors"
