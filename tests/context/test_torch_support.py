"""The torch range is checked once, at ``import fmesh.context``; the values work with any torch. A torch older than
the tested range is refused; a newer one runs with one warning, each private part of torch the Context uses probed
at import, and a feature whose probe failed raises at its use while the rest run (``FMESH_REFUSE_UNTESTED_TORCH=1``
refuses a newer torch instead)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fmesh
from fmesh.context import _torch

PRETEND = """
import torch
torch.__version__ = {version!r}
import fmesh
print(fmesh.make_mesh((2, 2), ("dp", "tp")).group(0, "tp"))
try:
    fmesh.Context
except fmesh.UnsupportedTorchError as error:
    print(type(error).__name__, error)
"""

# A newer torch: the warning, then a 2-process gloo job; "{remove}" takes a private name away before the import.
NEWER = """
import warnings
import torch
import torch.distributed.distributed_c10d as c10d
torch.__version__ = {version!r}
{remove}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fmesh
    fmesh.Context
print(len(caught), caught[0].category.__name__, caught[0].message)

def job(ctx):
    mesh = fmesh.make_mesh((2,), ("dp",))
    total = ctx.all_reduce(torch.ones(1) * (ctx.rank + 1), mesh, "dp").item()
    try:
        exported = type(ctx.device_mesh(mesh)).__name__
    except fmesh.UnsupportedTorchError as error:
        exported = str(error)
    return total, exported, ctx.all_reduce(torch.ones(1), mesh, "dp").item()

print(fmesh.launch(job, 2, context_options=dict(timeout=60)))
"""


def run(script: str, **env: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


@pytest.mark.parametrize("version", ["2.9.1", "1.13.0"])
def test_a_torch_older_than_the_range_gets_one_clear_error(version: str) -> None:
    first, second = run(PRETEND.format(version=version))
    assert first == "(0, 1)"  # mesh values need no supported torch
    assert second.startswith("UnsupportedTorchError") and f"torch {version} is installed" in second
    assert "supports torch 2.10 to 2.15" in second


def test_a_newer_torch_is_refused_where_the_environment_says_so() -> None:
    first, second = run(PRETEND.format(version="2.16.0"), FMESH_REFUSE_UNTESTED_TORCH="1")
    assert first == "(0, 1)"
    assert second.startswith("UnsupportedTorchError") and "torch 2.16.0 is installed" in second
    assert "FMESH_REFUSE_UNTESTED_TORCH=1 refuses a newer one" in second


@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.16.0a0+git1234", "3.0.0"])
def test_a_newer_torch_runs_a_job_with_one_warning(version: str) -> None:
    lines = run(NEWER.format(version=version, remove=""))  # gloo on torch 2.10 prints its own lines between
    warned, results = lines[0], lines[-1]
    assert warned.startswith("1 UntestedTorchWarning") and f"torch {version} is installed" in warned, warned
    assert "every probe passed" in warned and "FMESH_REFUSE_UNTESTED_TORCH=1" in warned, warned
    assert results == "[(3.0, 'DeviceMesh', 2.0), (3.0, 'DeviceMesh', 2.0)]", results


@pytest.mark.slow
def test_a_failed_probe_turns_off_only_its_feature() -> None:
    remove = ("import torch.distributed.tensor, torch.distributed._mesh_layout as layouts\n"
              "del layouts._MeshLayout  # a newer torch that renamed it")
    lines = run(NEWER.format(version="2.17.0", remove=remove))
    warned, results = lines[0], lines[-1]
    assert "features off: DeviceMesh export (ctx.device_mesh, FSDP2, DTensor)" in warned, warned
    assert results.count("(3.0, ") == 2 and results.count(", 2.0)") == 2, results  # before and after: they run
    assert results.count("DeviceMesh export (ctx.device_mesh, FSDP2, DTensor) needs private parts of "
                         "torch.distributed that torch 2.17.0 lacks or changed") == 2, results


def test_versions_inside_the_range_pass() -> None:
    for version, release in [("2.10.0", (2, 10)), ("2.11.0+cu130", (2, 11)), ("2.15.0a0+gitabc", (2, 15))]:
        assert _torch.check_supported(version) == release
    with pytest.raises(fmesh.UnsupportedTorchError, match="cannot read the torch version 'nightly'"):
        _torch.check_supported("nightly")


def test_every_probe_passes_on_a_tested_torch() -> None:
    assert not _torch.MISSING
    assert set(_torch.PROBES) == {_torch.GROUPS, _torch.RECOVERY, _torch.EXPORT, _torch.COMPILED, _torch.SIMULATE}


@pytest.mark.parametrize("name", ["_set_pg_timeout", "_new_process_group_helper"])
def test_the_groups_probe_needs_every_c10d_name_the_groups_use(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # _set_pg_timeout gives every gloo group its collective timeout; unprobed, a torch without it ended the first
    # group's creation with a bare AttributeError instead of UnsupportedTorchError naming the feature
    assert _torch.PROBES[_torch.GROUPS]()
    monkeypatch.delattr(_torch.c10d, name)
    assert not _torch.PROBES[_torch.GROUPS]()


def test_the_export_probe_needs_the_mesh_attributes_the_export_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    class Renamed:  # a DeviceMesh that takes the same arguments but keeps its flattened meshes elsewhere
        def __init__(self, device_type: str, *, _layout: object = None, _rank_map: object = None,
                     _root_mesh: object = None, _init_backend: bool = True) -> None:
            self._dim_group_names: list[str] = []
            self._flattened: dict[str, object] = {}

    assert _torch.PROBES[_torch.EXPORT]()
    monkeypatch.setattr(_torch, "DeviceMesh", Renamed)
    assert not _torch.PROBES[_torch.EXPORT]()


NO_TIMEOUT_SETTER = """
import warnings
import torch
import torch.distributed.distributed_c10d as c10d
torch.__version__ = "2.17.0"
del c10d._set_pg_timeout  # a newer torch that renamed it
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fmesh
    fmesh.Context
print(caught[0].message)

def job(ctx):
    try:
        return ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("dp",)), "dp").item()
    except fmesh.UnsupportedTorchError as error:
        return str(error)

print(fmesh.launch(job, 2, context_options=dict(timeout=60)))
"""


@pytest.mark.slow
def test_a_torch_without_a_newly_probed_name_says_which_feature_at_its_use() -> None:
    warned, results = (lambda lines: (lines[0], lines[-1]))(run(NO_TIMEOUT_SETTER))
    assert "features off: lazy process groups" in warned, warned
    assert results.count("lazy process groups needs private parts of torch.distributed that torch 2.17.0 lacks") == 2, \
        results
