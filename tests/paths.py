"""Where things are, for the tests in every folder of ``tests/``: the repository's root, this folder, the data."""

from __future__ import annotations

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
