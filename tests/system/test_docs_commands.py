"""What the docs show a command printing is what it prints: every ```text block of the docs and the README that
starts with ``$ python -m fmesh ...`` is that command's output, byte for byte (run in this process, as the CLI's
golden tests run it)."""

from __future__ import annotations

import io
import re
import shlex

import pytest
from paths import ROOT

from fmesh.cli import main

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHOWN = [(page.relative_to(ROOT), block) for page in PAGES
         for block in re.findall(r"```text\n(\$ python -m fmesh [^\n]*\n.*?)```", page.read_text(), flags=re.S)]


def test_the_docs_show_commands_to_check() -> None:
    assert len(SHOWN) >= 1


@pytest.mark.parametrize(("page", "block"), SHOWN, ids=[f"{page}:{block.split(chr(10))[0][2:60]}"
                                                        for page, block in SHOWN])
def test_a_shown_command_prints_what_the_docs_show(page: object, block: str) -> None:
    command, _, shown = block.partition("\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(shlex.split(command)[4:], stdout=out, stderr=err) == 0, err.getvalue()
    assert out.getvalue() == shown, f"{page}: `{command[2:]}` prints something else now"
