"""Shared test set-up: ``tests/`` on the path, so that the test files in every folder (``values/``, ``plan/``,
``context/``, ``system/``) import the support modules kept here (``paths``, ``strategies``, ``reference``,
``laws``, ``support``, ``fake_torch``, ``architecture``), the leak check the failure guide's scenario modules ask
for (``support.nothing_left_behind``), and the one hypothesis profile every property test runs under."""

import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

import strict_nccl
from support import launched_once, nothing_left_behind  # noqa: F401  (fixtures: the scenario modules use them)

strict_nccl.install()  # NCCL's rules on CPU, unless FMESH_STRICT_NCCL=0 (strict_nccl.py)

# deadline=None: examples run multi-process groups or big meshes on a shared 2-core machine.
settings.register_profile("fmesh", max_examples=150, deadline=None)
settings.load_profile("fmesh")
