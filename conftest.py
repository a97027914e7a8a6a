"""The test session's set-up, for the doctests in ``fmesh/`` and the tests in ``tests/`` alike.

* Doctest collection for objects that report their public module. ``import fmesh`` sets ``__module__ = "fmesh"``
  on every public class and function (so docs and tracebacks say ``fmesh.Mesh``). doctest decides which module's
  doctests an object belongs to by its ``__module__``, which would move a class's docstring to
  ``fmesh/__init__.py`` and lose its methods' doctests (those belong to the module whose globals they use). Here
  an object published as ``fmesh.NAME`` belongs to the module whose source defines it.
* A name-server timeout of one second (see ``RES_OPTIONS`` below), and no name-server query at all for this
  machine's own addresses in the processes the session starts (``tests/numeric_loopback.c``).
* Inductor compiling in the process that compiles, not in a pool of its own (``TORCHINDUCTOR_COMPILE_THREADS``).
* Three pytest workers per core (at most 6) for ``-n auto``.
* The modules with slow tests first, so that the workers of ``pytest -n`` (``pyproject.toml``) start the long
  ones early and finish together.
"""

from __future__ import annotations

import doctest
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types
from typing import Any

import pytest

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

# torch's TCPStore writes each peer's address into its log lines through a reverse DNS lookup (getnameinfo, on
# the server for every accepted connection and on the client before connecting). A loopback peer reached over
# IPv6 (``::ffff:127.0.0.1``) is not in /etc/hosts, so every store connection asks the name server; the machines
# fmesh is tested on drop about one query in 25, and glibc's resolver waits 5 s before it asks again, while the server
# thread, and every rank with it, waits. One second instead (every process of the session inherits this; it is
# read at the first lookup): the same answers, and a 200-Context test takes 18 s instead of 61 s.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:3")
# Inductor compiles in a pool of processes, one per core, each importing torch: on the suite's workers (3 per core),
# where every rank of a compile test starts its own pool, that costs more CPU than it saves (a 4-rank compile test: 26
# CPU-seconds with the pools, 18 without). One thread compiles the same code.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _numeric_loopback() -> str | None:
    """``tests/numeric_loopback.c`` built once (into the temporary directory, named by its source's digest): a library
    that has ``getnameinfo`` format loopback addresses as numbers, where torch's store asks the name server for the
    name of ``::ffff:127.0.0.1`` at each connection (both sides) and a dropped query costs the resolver's timeout.
    Preloaded into every process the session starts (the workers of ``pytest -n``, the ranks, torchrun's), it took
    the suite from 13 min 51 s to 10 min 30 s (the 200-Context check from 83 s to under 8). ``None`` off Linux or
    without a C compiler: the suite then runs as before, slower."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not sys.platform.startswith("linux") or compiler is None:
        return None
    source = pathlib.Path(__file__).parent / "tests" / "numeric_loopback.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    built = pathlib.Path(tempfile.gettempdir()) / f"fmesh-numeric-loopback-{digest}.so"
    if not built.exists():
        partial = built.with_name(f"{built.name}.{os.getpid()}")  # sessions side by side: each renames its own
        made = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
                              capture_output=True, check=False)
        if made.returncode != 0:
            return None
        partial.replace(built)
    return str(built)


def _preload(library: str | None) -> None:
    """Preload ``library`` into every process started from now on, after what is preloaded already."""
    if library is not None:
        os.environ["LD_PRELOAD"] = f"{os.environ.get('LD_PRELOAD', '')} {library}".strip()


if "fmesh-numeric-loopback" not in os.environ.get("LD_PRELOAD", ""):  # the session's first process: a worker has it
    _preload(_numeric_loopback())


# The modules that take longest (each 80 to 200 s of one worker's time, quiet, four workers on 2 cores, 2026-11-28),
# longest first: handed out first, none is the last to start while the other workers are done. A stale list only
# orders the work less well.
LONGEST_FIRST = ("context/test_faults_found.py", "system/test_docs.py", "system/test_train.py", "system/test_readme.py",
                 "context/test_reliability.py", "context/test_fault_campaign.py",
                 "system/test_bench_collectives_smoke.py", "system/test_elastic_jobs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (:data:`LONGEST_FIRST`), then every other module that has a test marked ``slow``,
    then the rest, each module keeping its order (a stable sort): with whole modules handed to the workers in this
    order (``--dist loadfile``), the longest start first."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> tuple[int, bool]:
        named = [i for i, tail in enumerate(LONGEST_FIRST) if item.path.as_posix().endswith("tests/" + tail)]
        return (named[0] if named else len(LONGEST_FIRST)), item.path not in slow

    items.sort(key=rank)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Three workers per core, at most 6: most of the slow tests' time is processes waiting for each other (a
    heartbeat's silence, a connect timeout), and the waiting modules hold a worker each. On 2 cores, with the
    name-server fix above: 10 min 30 s with one worker per core, 7 min 36 s with two; once a rank's start cost only
    torch's import (2026-11-28), 6 min 30 s with two per core and 6 min 3 s with three."""
    return min(3 * (os.cpu_count() or 1), 6)
