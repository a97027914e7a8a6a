"""The universe id is a pure function of the inputs: the same in every process, kept by pickling."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from support import patience

import fmesh

BUILD = """fmesh.select(fmesh.flatten(
    fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"), rank_map={rank_map!r}, device_type="cuda"),
    ("tp", "dp"), "td"), pp=1)"""

SCRIPT = """
import pickle, sys
import fmesh
mesh = {build}
loaded = pickle.loads(bytes.fromhex(sys.argv[1]))
print(mesh.universe.id, loaded.universe.id, loaded == mesh, hash(loaded) == hash(mesh), loaded.groups("td"))
"""


def test_universe_id_and_pickles_agree_across_processes() -> None:
    import fmesh  # noqa: F401  (used by eval below)

    for rank_map in (None, [7, 6, 5, 4, 3, 2, 1, 0]):
        build = BUILD.format(rank_map=rank_map)
        mesh = eval(build)
        env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str hash than this process
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT.format(build=build), pickle.dumps(mesh).hex()],
            capture_output=True, text=True, check=True, env=env, timeout=patience(120),
        ).stdout.split(maxsplit=4)
        assert out[:4] == [mesh.universe.id, mesh.universe.id, "True", "True"]
        assert out[4].strip() == str(mesh.groups("td"))


def test_universe_id_depends_on_every_input() -> None:
    base = fmesh.Universe(8)
    assert fmesh.Universe(8).id == base.id
    assert fmesh.Universe(8, rank_map=list(range(8))).id == base.id  # the identity, spelled out
    swapped = [1, 0, *range(2, 8)]
    others = [fmesh.Universe(16), fmesh.Universe(8, device_type="cuda"), fmesh.Universe(8, rank_map=swapped)]
    assert len({u.id for u in [base, *others]}) == 4
