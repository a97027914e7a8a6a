"""The documentation builds without a warning, names every public object once at its public path, renders the
notebooks as committed, and pulls its reference texts from the code (no second copy in README.md or docs/)."""

from __future__ import annotations

import html
import json
import pathlib
import re
import subprocess
import sys
import types

import chromium
import pytest
from paths import ROOT
from support import patience

import fmesh

DOCS = ROOT / "docs"

pytest.importorskip("sphinx", reason="the docs packages come with the test extra: pip install -e '.[test]'")
pytest.importorskip("myst_nb")
from sphinx.util.inventory import InventoryFile  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=patience(600),
    )
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-5000:]
    return out


def _inventory(site: pathlib.Path) -> dict[str, str]:
    """``dotted name -> role`` of every Python object the site documents."""
    with open(site / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", lambda base, uri: uri)
    items = inventory.data.items() if hasattr(inventory, "data") else inventory.items()
    return {name: role for role, entries in items if role.startswith("py:") for name in entries}


def _page(site: pathlib.Path, path: str) -> str:
    """A built page's text, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", (site / path).read_text())).split())


@pytest.mark.slow
def test_every_public_name_has_a_page_at_its_public_path(site: pathlib.Path) -> None:
    documented = _inventory(site)
    missing = [name for name in fmesh.__all__ if f"fmesh.{name}" not in documented]
    assert missing == []
    for name in fmesh.__all__:
        if not isinstance(getattr(fmesh, name), types.ModuleType):
            assert (site / "api" / "generated" / f"fmesh.{name}.html").exists(), name


@pytest.mark.slow
def test_every_public_object_is_documented_once(site: pathlib.Path) -> None:
    published = {id(getattr(fmesh, n)): f"fmesh.{n}" for n in fmesh.__all__
                 if not isinstance(getattr(fmesh, n), types.ModuleType)}
    elsewhere = []
    for name, role in _inventory(site).items():
        parent, _, attribute = name.rpartition(".")
        module = sys.modules.get(parent)
        value = getattr(module, attribute, None) if module is not None else None
        if role != "py:module" and id(value) in published and published[id(value)] != name:
            elsewhere.append((name, published[id(value)]))
    assert elsewhere == []


def test_the_module_to_tests_table_names_files_that_exist() -> None:
    table = (DOCS / "development.md").read_text().split("## Where the tests are")[1].split("\n## ")[0]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 20
    tests = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}
    for modules, files in rows:
        folder = ""
        for name in re.findall(r"`([^`]+)`", modules):  # `fmesh/mesh/elastic.py`, `lineage.py`: one folder
            if "/" in name:
                folder = name if name.endswith("/") else name.rsplit("/", 1)[0] + "/"
            assert (ROOT / (name if "/" in name else folder + name)).exists() or not name.endswith((".py", "/")), name
        for name in re.findall(r"`([^`]+)`", files):
            found = list(ROOT.glob(name)) if "/" in name else [tests[name]] if name in tests else []
            assert found, name


def test_nitpick_ignores_only_other_projects() -> None:
    conf = (DOCS / "conf.py").read_text()
    patterns = re.findall(r'\("py:[^"]*", r"([^"]+)"\)', conf)
    assert patterns, "conf.py lists its ignore patterns as (role, r'pattern') pairs"
    own = ["fmesh", "fmesh.Mesh", "fmesh.layout.IntTuple", "IntTuple", "Mesh", "Context", "fmesh.context._torch.x",
           "AxesArg", "Layout", "fmesh.mesh.mesh.Mesh"]
    assert [(p, name) for p in patterns for name in own if re.fullmatch(p, name)] == []


@pytest.mark.slow
def test_reference_texts_come_from_the_code(site: pathlib.Path) -> None:
    sources = [p.read_text() for p in [*DOCS.rglob("*.md"), *DOCS.rglob("*.rst")] if "generated" not in p.parts]
    readme = (ROOT / "README.md").read_text()
    texts = {  # a phrase of each reference text, where the site shows it
        "api/generated/fmesh.plan.costs.html": "2(ceil(log2 K)·a_intra + ceil(log2 h)·a_inter)",  # cost formulas
        "api/generated/fmesh.plan.manifest.html": "hosts_per_group_min",  # the manifest schema
        "compatibility.html": "a do-nothing store from 2.14",  # the torch table
    }
    for path, phrase in texts.items():
        assert phrase in _page(site, path), path
        assert all(phrase not in text for text in [readme, *sources]), f"a second copy of {phrase!r}"
    catalogue = _page(site, "api/index.html")
    for name in fmesh.errors.__all__:
        first = " ".join(getattr(fmesh.errors, name).__doc__.split("\n\n")[0].split())
        # the longest run of the docstring's words without markup
        plain = max(re.split(r"\S*[`:]\S*", first), key=len).strip()
        path = f"fmesh.{name}" if name in fmesh.__all__ else f"fmesh.errors.{name}"
        assert len(plain) >= 12 and path in catalogue and plain in catalogue, (name, plain)


@pytest.mark.slow
def test_notebooks_are_rendered_with_their_committed_outputs(site: pathlib.Path) -> None:
    conf = (DOCS / "conf.py").read_text()
    assert re.search(r'^nb_execution_mode = "off"$', conf, flags=re.M)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = (site / "tutorials" / f"{notebook.stem}.html").read_text()
        cells = json.loads(notebook.read_text())["cells"]
        outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert outputs, notebook
        streams = ["".join(o["text"]).strip().splitlines()[0] for o in outputs
                   if o.get("output_type") == "stream" and "".join(o["text"]).strip()]
        shown = html.unescape(page)
        assert all(line in shown for line in streams[:5]), notebook
        assert "fmesh-mesh" in page or not any("text/html" in o.get("data", {}) for o in outputs), notebook


@pytest.mark.slow
def test_pictures_are_drawn_when_the_docs_are_built(site: pathlib.Path) -> None:
    page = (site / "getting-started.html").read_text()
    assert page.count('class="fmesh-mesh"') == 2
    assert "rank 5 is outlined" in page and "hosts: 2 hosts of 8 ranks" in page


WINDOW = (1280, 900)  # a laptop's browser window, in CSS pixels


@pytest.mark.slow
def test_no_page_is_wider_than_its_window_and_every_error_line_is_seen_whole(site: pathlib.Path,
                                                                             tmp_path: pathlib.Path) -> None:
    # Measured as a browser lays the pages out (headless Chromium over its DevTools pipe: tests/chromium.py):
    # a wide table, code line or picture scrolls inside its own box, never the page; an error message wraps.
    if chromium.browser() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it): the pages' "
                    "widths are not measured")
    # Every page but the highlighted sources (_modules/) and the raw texts (_sources/), which are code listings.
    pages = sorted(path for path in site.rglob("*.html")
                   if not {"_modules", "_sources"} & set(path.relative_to(site).parts))
    assert len(pages) >= 100
    control = tmp_path / "wide.html"  # the check sees a page that is too wide, as the elastic guide was (5,006 px)
    control.write_text('<pre style="white-space:pre">' + "x" * 2000 + "</pre>")
    widths = chromium.page_widths([control, *pages], *WINDOW)
    assert widths.pop(control).scroll > WINDOW[0]
    too_wide = {str(page.relative_to(site)): (width.scroll, width.sticking_out[:3])
                for page, width in widths.items() if width.scroll > width.window}
    assert too_wide == {}
    assert {str(page.relative_to(site)): width.errors_cut for page, width in widths.items() if width.errors_cut} == {}
    assert all(width.window == WINDOW[0] for width in widths.values())
