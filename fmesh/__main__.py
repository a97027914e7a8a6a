"""``python -m fmesh [plan ...]``: see :mod:`fmesh.cli`."""

from fmesh.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
