"""The test session's own set-up (``conftest.py``) holds in the processes that run the tests."""

from __future__ import annotations

import os
import shutil
import socket
import sys

import pytest

NO_COMPILER = shutil.which("cc") is None and shutil.which("gcc") is None


@pytest.mark.skipif(not sys.platform.startswith("linux") or NO_COMPILER,
                    reason="the numeric-loopback library is built with a C compiler on Linux")
@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ,
                    reason="preloaded into the processes the session starts (pytest -n), not its first one (-n 0)")
def test_the_processes_of_the_session_ask_no_name_server_for_loopback_addresses() -> None:
    # ::ffff:127.0.0.1 is in no /etc/hosts: without the library, glibc asks the name server (a dropped query waits
    # the resolver's timeout) and returns its answer, or the numbers where it has none.
    assert "fmesh-numeric-loopback" in os.environ.get("LD_PRELOAD", ""), os.environ.get("LD_PRELOAD")
    assert socket.getnameinfo(("127.0.0.1", 80), 0)[0] == "127.0.0.1"  # "localhost" from /etc/hosts without it
    assert socket.getnameinfo(("::ffff:127.0.0.1", 80, 0, 0), 0)[0] == "::ffff:127.0.0.1"
    assert socket.getnameinfo(("::1", 80, 0, 0), 0)[0] == "::1"
