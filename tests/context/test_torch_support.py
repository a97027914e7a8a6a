"""The supported torch range is checked once, at ``import fmesh.context``; the values work with any torch."""

from __future__ import annotations

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


@pytest.mark.parametrize("version", ["2.9.1", "2.16.0", "3.0.0"])
def test_a_torch_outside_the_range_gets_one_clear_error(version: str) -> None:
    result = subprocess.run([sys.executable, "-c", PRETEND.format(version=version)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "(0, 1)"  # mesh values need no supported torch
    assert second.startswith("UnsupportedTorchError") and f"torch {version} is installed" in second
    assert "supports torch 2.10 to 2.15" in second


def test_versions_inside_the_range_pass() -> None:
    for version, release in [("2.10.0", (2, 10)), ("2.11.0+cu130", (2, 11)), ("2.15.0a0+gitabc", (2, 15))]:
        assert _torch.check_supported(version) == release
    with pytest.raises(fmesh.UnsupportedTorchError, match="cannot read the torch version 'nightly'"):
        _torch.check_supported("nightly")
