"""``python -m fmesh [plan ...]``: see :mod:`fmesh.cli`."""

import os
import sys

from fmesh.cli import main


def _run() -> int:
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows up here when the text sat in the buffer
    except BrokenPipeError:
        # ``python -m fmesh plan ... | head``: the reader left, which is not an error worth a traceback.
        # Point stdout at /dev/null so that the interpreter's own flush at exit stays quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    raise SystemExit(_run())
