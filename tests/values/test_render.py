"""Rendering: the text grid and the HTML table, checked against the mesh's own queries.

Expectations come from ``mesh.coordinate``/``mesh.group`` or from a numpy grid of the
rank map, never from the renderer's output: the pictures are parsed back into cells
and legends and compared with those.
"""

from __future__ import annotations

import html as html_lib
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from html.parser import HTMLParser

import numpy as np
import pytest

import fmesh
from fmesh import Mesh
from fmesh.rendering import CAPTION_STYLE, GOLDEN_ANGLE, group_colour, html

ELLIPSIS = "…"

# --------------------------------------------------------------------------- text parsing


class Text:
    """A rendered text picture, parsed back: header lines, cells by labels, legend by tag."""

    def __init__(self, text: str) -> None:
        self.text = text
        lines = text.split("\n")
        blank = lines.index("") if "" in lines else len(lines)
        self.header = lines[:blank]
        # (block label or None, row label or None, column label) -> cell text
        self.cells: dict[tuple[str | None, str | None, str], str] = {}
        self.blocks: list[str] = []
        self.legend: dict[str, tuple[str, list[int | None]]] = {}
        self.legend_title: str | None = None
        self.legend_lines: list[str] = []
        self.host_rules = 0  # lines of '-' drawn between rows on different hosts
        self.block_hosts: dict[str, list[int]] = {}  # block label -> the hosts its label names
        self.host_bars: set[tuple[str | None, str | None, str]] = set()  # cells drawn with '|' before them
        block: str | None = None
        cols: list[str] | None = None
        in_legend = False
        for line in lines[blank:]:
            if not line:
                cols = None
                continue
            if line.startswith("legend"):
                in_legend = True
                self.legend_title = line
                continue
            if in_legend:
                self.legend_lines.append(line)
                match = re.fullmatch(r"  ([a-z]+) +(.+): ([0-9, …]+)", line)
                if match:
                    ranks = [None if t == ELLIPSIS else int(t) for t in match.group(3).split(", ")]
                    self.legend[match.group(1)] = (match.group(2), ranks)
                continue
            if set(line) == {"-"}:  # a host boundary between two rows
                self.host_rules += 1
                continue
            if line.startswith(ELLIPSIS) and cols is None:
                self.blocks.append(line)
                continue
            if line.endswith(":"):
                block, _, on_hosts = line[:-1].partition(" (host")  # "dp=1 (hosts 2, 3):" when hosts are drawn
                if on_hosts:
                    self.block_hosts[block] = [int(h) for h in on_hosts.removeprefix("s").strip(" )").split(", ")]
                self.blocks.append(block)
                continue
            if cols is None and "=" in line:
                cols = line.split()
                continue
            tokens = line.split()
            if cols is None:  # a mesh without axes: one cell
                self.cells[(None, None, "")] = tokens[0]
                continue
            if len(tokens) == len(cols) + 1:
                row: str | None = tokens[0]
                values = tokens[1:]
            else:
                row, values = None, tokens
            assert len(values) == len(cols), line
            for col, value in zip(cols, values, strict=True):
                if value.startswith("|"):
                    self.host_bars.add((block, row, col))
                self.cells[(block, row, col)] = value.removeprefix("|")


def _labels_to_coordinate(mesh: Mesh, key: tuple[str | None, str | None, str]) -> tuple[int, ...] | None:
    """The coordinate a cell's labels name, or None if any label is an ellipsis."""
    block, row, col = key
    labels: list[str] = []
    if block is not None:
        labels += block.split(", ")
    if row is not None:
        labels.append(row)
    if col:
        labels.append(col)
    if any(label == ELLIPSIS for label in labels):
        return None
    pairs = [label.split("=") for label in labels]
    assert [name for name, _ in pairs] == list(mesh.axis_names)
    return tuple(int(value) for _, value in pairs)


def _instance_ranks(mesh: Mesh, rank: int) -> tuple[int, ...]:
    return mesh.group(rank, None)


def check_text(mesh: Mesh, highlight: str | Sequence[str] | None = None, rank: int | None = None) -> Text:
    """Render, parse, and compare every drawn cell and legend entry with the mesh's queries."""
    out = Text(fmesh.render(mesh, highlight=highlight, rank=rank))
    assert out.header[0] == repr(mesh)
    holder = rank if rank is not None else mesh.groups(None)[0][0]
    instance = set(_instance_ranks(mesh, holder))
    axes = mesh.resolve_axes(highlight) if highlight is not None else ()
    tag_of_group: dict[tuple[int, ...], str] = {}
    drawn = 0
    for key, value in out.cells.items():
        coordinate = _labels_to_coordinate(mesh, key)
        if coordinate is None:
            assert value == ELLIPSIS
            continue
        drawn += 1
        if axes:
            rank_text, tag = value.split("·")
        else:
            rank_text, tag = value, ""
            assert "·" not in value
        assert rank_text.endswith("*") == (rank_text.removesuffix("*") == str(rank)), (key, value)  # rank= marked
        cell_rank = int(rank_text.removesuffix("*"))
        assert cell_rank in instance, (key, value)
        assert mesh.coordinate(cell_rank) == coordinate, (key, value)
        if axes:
            group = mesh.group(cell_rank, axes)
            # one tag per group, different groups different tags
            assert tag_of_group.setdefault(group, tag) == tag
            if tag not in out.legend:  # the legend lists at most 32 of the drawn groups, and says so
                assert any("more drawn groups not listed" in line for line in out.legend_lines)
                continue
            label, ranks = out.legend[tag]
            others = [i for i, name in enumerate(mesh.axis_names) if name not in axes]
            expected_label = ", ".join(f"{mesh.axis_names[i]}={coordinate[i]}" for i in others)
            assert label == (expected_label or "(whole instance)")
            if None in ranks:
                cut = ranks.index(None)
                assert ranks[:cut] == list(group[:cut])
                tail = ranks[cut + 1 :]
                assert tail == list(group[len(group) - len(tail) :])
            else:
                assert ranks == list(group)
    assert len(set(tag_of_group.values())) == len(tag_of_group)
    if mesh.size <= 512 and (mesh.ndim == 0 or mesh.axis_sizes[-1] <= 32):
        assert drawn == mesh.size  # small meshes are drawn in full
        assert ELLIPSIS not in out.text
        if axes:
            groups = mesh.size // math.prod(mesh.shape[a] for a in axes)
            assert len(tag_of_group) == groups
            assert len(out.legend) == min(groups, 32)
    if not axes:
        assert out.legend_title is None
    return out


# --------------------------------------------------------------------------- text


def test_text_two_axes_exact() -> None:
    mesh = fmesh.make_mesh((2, 3), ("dp", "tp"))
    assert fmesh.render(mesh, highlight="tp") == (
        "Mesh(dp=2, tp=3; world=6)\n"
        "rows: dp (2), columns: tp (3)\n"
        "groups along tp: 2 groups of 3 ranks in this instance, tagged a..b\n"
        "\n"
        "      tp=0  tp=1  tp=2\n"
        "dp=0  0·a   1·a   2·a\n"
        "dp=1  3·b   4·b   5·b\n"
        "\n"
        "legend (groups along tp):\n"
        "  a  dp=0: 0, 1, 2\n"
        "  b  dp=1: 3, 4, 5"
    )


def test_text_one_axis() -> None:
    mesh = fmesh.make_mesh((5,), ("x",))
    out = check_text(mesh, "x")
    assert {key: value for key, value in out.cells.items()} == {(None, None, f"x={i}"): f"{i}·a" for i in range(5)}
    assert out.legend == {"a": ("(whole instance)", [0, 1, 2, 3, 4])}
    plain = check_text(mesh)
    assert [plain.cells[(None, None, f"x={i}")] for i in range(5)] == ["0", "1", "2", "3", "4"]


def test_text_two_axes_against_numpy_grid() -> None:
    grid = np.arange(12).reshape(3, 4)
    mesh = fmesh.make_mesh((3, 4), ("dp", "tp"))
    out = check_text(mesh, "dp")
    for i in range(3):
        for j in range(4):
            rank_text, tag = out.cells[(None, f"dp={i}", f"tp={j}")].split("·")
            assert int(rank_text) == grid[i, j]
            assert tag == "abcd"[j]  # groups along dp are the columns, tagged by tp coordinate
    assert out.legend["c"] == ("tp=2", grid[:, 2].tolist())
    check_text(mesh, "tp")
    check_text(mesh)


def test_text_three_axes_blocks() -> None:
    grid = np.arange(16).reshape(2, 2, 4)
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    out = check_text(mesh, "tp")
    assert out.blocks == ["dp=0", "dp=1"]
    assert "rows: cp (2), columns: tp (4), one block per dp (2)" in out.header
    for d, c, t in np.ndindex(2, 2, 4):
        value = out.cells[(f"dp={d}", f"cp={c}", f"tp={t}")]
        assert value == f"{grid[d, c, t]}·{'abcd'[2 * d + c]}"
    assert out.legend == {
        "a": ("dp=0, cp=0", [0, 1, 2, 3]),
        "b": ("dp=0, cp=1", [4, 5, 6, 7]),
        "c": ("dp=1, cp=0", [8, 9, 10, 11]),
        "d": ("dp=1, cp=1", [12, 13, 14, 15]),
    }
    for axis in ("dp", "cp"):
        check_text(mesh, axis)


def test_text_permuted_rank_map() -> None:
    rng = np.random.default_rng(7)
    perm = rng.permutation(24)
    grid = perm.reshape(2, 3, 4)
    mesh = fmesh.make_mesh((2, 3, 4), ("dp", "cp", "tp"), rank_map=perm.tolist())
    out = check_text(mesh, "cp")
    for d, c, t in np.ndindex(2, 3, 4):
        assert out.cells[(f"dp={d}", f"cp={c}", f"tp={t}")].split("·")[0] == str(grid[d, c, t])
    for tag, (label, ranks) in out.legend.items():
        d, t = (int(part.split("=")[1]) for part in label.split(", "))
        assert ranks == grid[d, :, t].tolist(), tag
    check_text(mesh, "tp")
    check_text(mesh, ("tp", "dp"))


def test_text_highlight_several_axes_in_given_order() -> None:
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    out = check_text(mesh, ("tp", "dp"))
    assert out.legend_title == "legend (groups along tp, dp):"
    assert out.legend == {"a": ("cp=0", [0, 8, 1, 9, 2, 10, 3, 11]), "b": ("cp=1", [4, 12, 5, 13, 6, 14, 7, 15])}
    assert check_text(mesh, ("dp", "cp", "tp")).legend == {"a": ("(whole instance)", list(range(16)))}


def test_text_derived_meshes_and_instances() -> None:
    root = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"), rank_map=list(reversed(range(16))))
    check_text(fmesh.slice(root, "tp", "dp"), "dp")  # transposed, 2 instances
    check_text(fmesh.flatten(root, ("dp", "tp"), "dptp"), "cp")
    check_text(fmesh.unflatten(fmesh.flatten(root, ("dp", "cp"), "dc"), "dc", {"a": 2, "b": 2}), ("b",))
    tp = root["tp"]
    for rank in (0, 5, 13):
        out = check_text(tp, "tp", rank=rank)
        number = tp.groups("tp").index(tp.group(rank, "tp"))  # numbered from 0, like a coordinate
        assert f"instance {number} of 4, numbered from 0 (holding rank {rank})" in out.header
        assert sorted(int(v.split("·")[0].rstrip("*")) for v in out.cells.values()) == sorted(tp.group(rank, "tp"))
        assert [v for v in out.cells.values() if "*" in v] == [f"{rank}*·a"]
    first = check_text(tp, "tp")
    assert "instance 0 of 4, numbered from 0 (the first; pass rank= to choose another)" in first.header
    stage = fmesh.select(fmesh.make_mesh((2, 4), ("pp", "tp")), pp=1)
    out = check_text(stage, "tp")
    assert [out.cells[(None, None, f"tp={i}")] for i in range(4)] == ["4·a", "5·a", "6·a", "7·a"]


def test_text_many_groups_get_two_letter_tags() -> None:
    mesh = fmesh.make_mesh((30, 2), ("dp", "tp"))
    out = check_text(mesh, "tp")
    assert out.cells[(None, "dp=25", "tp=1")] == "51·z"
    assert out.cells[(None, "dp=26", "tp=0")] == "52·aa"
    assert out.legend["ad"] == ("dp=29", [58, 59])


def test_text_more_than_three_axes() -> None:
    mesh = fmesh.make_mesh((2, 3, 2, 2), ("pp", "dp", "cp", "tp"))
    out = check_text(mesh, ("dp", "tp"))
    assert out.header[1].startswith("4 axes, more than 3: one block per (pp, dp) coordinate (6 blocks, row-major)")
    assert out.blocks == [f"pp={p}, dp={d}" for p in range(2) for d in range(3)]
    check_text(mesh, "pp")
    check_text(fmesh.make_mesh((2, 2, 2, 2, 2), tuple("abcde"), rank_map=list(range(31, -1, -1))), ("a", "e"))


def test_text_mesh_without_axes() -> None:
    mesh = fmesh.make_mesh((), ())
    assert check_text(mesh).cells == {(None, None, ""): "0"}


def test_text_large_mesh_is_summarised() -> None:
    mesh = fmesh.make_mesh((4, 25, 1000), ("dp", "cp", "tp"))
    text = fmesh.render(mesh, highlight="cp")  # how fast: bench/mesh_ops.py
    out = check_text(mesh, "cp")
    assert out.text == text
    assert len(text.splitlines()) < 100
    assert any(
        line.startswith("summary: 100000 ranks per instance") and "8 of 25 rows, 8 of 1000 columns" in line
        for line in out.header
    )
    assert "rows: cp (25), columns: tp (1000), one block per dp (4)" in out.header
    # the corners are drawn, with ellipses between
    assert out.cells[("dp=0", "cp=0", "tp=0")] == "0·a"
    assert out.cells[("dp=3", "cp=24", "tp=999")].startswith("99999·")
    assert out.cells[("dp=0", "cp=0", ELLIPSIS)] == ELLIPSIS
    assert out.cells[("dp=0", ELLIPSIS, "tp=0")] == ELLIPSIS
    assert any("4000 groups in all" in line for line in out.legend_lines)
    assert len(out.legend) <= 32


def test_text_million_ranks_five_axes_summarised() -> None:
    mesh = fmesh.make_mesh((8, 16, 256, 2, 16), ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    out = check_text(mesh, "tp")
    assert "… (32764 blocks not drawn)" in out.blocks
    assert out.blocks[0] == "pp=0, dp_replicate=0, dp_shard=0"
    assert out.blocks[-1] == "pp=7, dp_replicate=15, dp_shard=255"
    assert len(out.text) < 10_000


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"highlight": "xx"}, KeyError, r"unknown axis 'xx'.*\('dp', 'tp'\)"),
        ({"highlight": 3}, TypeError, r"highlight must be.*\('dp', 'tp'\).*3"),
        ({"highlight": ()}, ValueError, r"at least one axis"),
        ({"highlight": ("tp", "tp")}, ValueError, r"more than once"),
        ({"rank": 99}, ValueError, r"rank 99 is outside"),
        ({"rank": "0"}, TypeError, r"rank must be an int"),
    ],
)
def test_errors(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(error, match=match):
        fmesh.render(mesh, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        html(mesh, **kwargs)  # type: ignore[arg-type]


def test_errors_not_a_mesh_and_uncovered_rank() -> None:
    with pytest.raises(TypeError, match=r"expected an fmesh\.Mesh"):
        fmesh.render("dp=2")  # type: ignore[arg-type]
    stage = fmesh.select(fmesh.make_mesh((2, 4), ("pp", "tp")), pp=1)
    with pytest.raises(ValueError, match="rank 0 is not covered"):
        fmesh.render(stage, rank=0)


# --------------------------------------------------------------------------- HTML


def _tree(text: str) -> ET.Element:
    return ET.fromstring(f"<root>{text}</root>")


class _Strict(HTMLParser):
    """Checks that every tag closes in order (html.parser is lenient on its own)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack.pop() == tag, tag


def _cells(root: ET.Element) -> list[tuple[int, str, str]]:
    """(rank, title, background) of every drawn cell; each cell's text (rank, ``*`` if marked, ``·`` and the
    group's tag) says the same as its title, so the picture reads without colour."""
    out = []
    for td in root.iter("td"):
        title = td.get("title")
        if title is None:
            assert td.text == ELLIPSIS
            continue
        style = dict(part.split(":", 1) for part in (td.get("style") or "").split(";") if part)
        rank_text, _, tag = (td.text or "").partition("·")
        cell_rank = int(rank_text.removesuffix("*"))
        group = re.search(r"; group ([a-z]+) along", title)
        assert tag == (group.group(1) if group else ""), (td.text, title)
        assert rank_text.endswith("*") == ("outline" in style), (td.text, style)
        out.append((cell_rank, title, style["background"]))
    return out


def check_html(mesh: Mesh, highlight: str | Sequence[str] | None = None, rank: int | None = None) -> ET.Element:
    text = html(mesh, highlight=highlight, rank=rank)
    root = _tree(text)
    parser = _Strict()
    parser.feed(text)
    parser.close()
    assert parser.stack == []
    caption = root.find(".//div[@class='fmesh-caption']")
    assert caption is not None and (caption.text or "").startswith(repr(mesh))
    assert root.find(".//caption") is None and root.find(".//table//div[@class='fmesh-caption']") is None
    axes = mesh.resolve_axes(highlight) if highlight is not None else mesh.axis_names[-1:]
    colour_of_group: dict[tuple[int, ...], str] = {}
    holder = rank if rank is not None else mesh.groups(None)[0][0]
    instance = set(mesh.group(holder, None))
    cells = _cells(root)
    for cell_rank, title, background in cells:
        assert cell_rank in instance
        coordinate = mesh.coordinate(cell_rank)
        assert coordinate is not None
        coords = ", ".join(f"{n}={c}" for n, c in zip(mesh.axis_names, coordinate, strict=True))
        assert title.startswith(f"rank {cell_rank}: {coords}")
        if axes:
            group = mesh.group(cell_rank, axes)
            assert colour_of_group.setdefault(group, background) == background
    if axes:  # different groups, different colours, however many are drawn
        assert len(set(colour_of_group.values())) == len(colour_of_group)
    small_blocks = mesh.ndim < 3 or math.prod(mesh.axis_sizes[:-2]) <= 4
    small_grid = mesh.ndim == 0 or (mesh.axis_sizes[-1] <= 32 and (mesh.ndim < 2 or mesh.axis_sizes[-2] <= 32))
    if mesh.size <= 32 * 32 and small_blocks and small_grid:
        assert len(cells) == mesh.size  # drawn in full
    return root


def test_html_small_meshes_well_formed_and_coloured() -> None:
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    root = check_html(mesh)  # default highlight: the last axis
    cells = _cells(root)
    assert len(cells) == 16
    by_rank = {r: (title, bg) for r, title, bg in cells}
    assert by_rank[5][0] == "rank 5: dp=0, cp=1, tp=1; group b along tp"
    assert by_rank[4][1] == by_rank[7][1] != by_rank[8][1]
    legend = [" ".join("".join(li.itertext()).split()) for li in root.iter("li")]
    assert legend[1].endswith("b dp=0, cp=1: 4, 5, 6, 7")
    for highlight in ("dp", "cp", ("tp", "dp")):
        check_html(mesh, highlight)
    check_html(fmesh.make_mesh((6,), ("x",)))
    check_html(fmesh.make_mesh((), ()))
    check_html(fmesh.make_mesh((2, 3, 2, 2), ("pp", "dp", "cp", "tp")), "dp")


def test_html_permuted_and_instances() -> None:
    perm = np.random.default_rng(3).permutation(24).tolist()
    mesh = fmesh.make_mesh((2, 3, 4), ("dp", "cp", "tp"), rank_map=perm)
    check_html(mesh, "cp")
    check_html(mesh["tp", "dp"], "dp", rank=perm[5])
    check_html(fmesh.select(mesh, cp=2), "tp")


def _hue(colour: str) -> float:
    match = re.fullmatch(r"hsl\(([0-9.]+),70%,([0-9]+)%\)", colour)
    assert match is not None, colour
    assert int(match.group(2)) >= 70  # light enough for the black text on it
    return float(match.group(1))


def test_html_every_drawn_group_has_its_own_colour() -> None:
    mesh = fmesh.make_mesh((20, 2), ("dp", "tp"))  # 20 groups: more than the old 12-colour palette
    colours = {r: bg for r, _, bg in _cells(check_html(mesh))}
    for row in range(20):
        assert colours[2 * row] == colours[2 * row + 1] == group_colour(row)
    assert len({colours[2 * row] for row in range(20)}) == 20
    assert html(mesh) == html(mesh)
    check_html(fmesh.make_mesh((32, 32), ("dp", "tp")), "dp")  # 32 groups drawn
    check_html(fmesh.make_mesh((4, 8, 32), ("pp", "dp", "tp")), "pp")  # 256 groups drawn


@pytest.mark.parametrize("count", [2, 16, 64, 1100])
def test_group_colours_are_distinct_and_spread(count: int) -> None:
    colours = [group_colour(i) for i in range(count)]
    assert len(set(colours)) == count
    hues = sorted(_hue(c) for c in colours)
    gaps = [b - a for a, b in zip(hues, [*hues[1:], hues[0] + 360], strict=True)]
    # golden-angle hues: the gaps take at most three lengths, the largest the sum of the other two, whose
    # ratio tends to phi (the three-gap theorem): the widest is about phi^2 = 2.618 times the narrowest
    assert abs(360 / GOLDEN_ANGLE - (1 + 5**0.5) ** 2 / 4) < 1e-9
    assert max(gaps) <= min(gaps) * 2.75 + 0.02  # + 0.02: hues are written to 0.01 degree
    if count <= 16:
        assert min(gaps) >= 360 / count / 2.7


def test_html_caption_is_not_squeezed_to_the_table() -> None:
    text = html(fmesh.make_mesh((2,), ("tp",)))
    root = _tree(text)
    caption = root.find(".//div[@class='fmesh-caption']")
    assert caption is not None and caption.get("style") == CAPTION_STYLE
    assert "width" not in CAPTION_STYLE.replace("font-weight", "") and "<caption" not in text
    table = root.find(".//table")
    assert table is not None and caption not in list(table.iter())
    # the caption comes before the table, as a block as wide as its container
    children = list(root.find("div") or [])
    assert children.index(caption) < children.index(table)


def test_html_escapes_odd_axis_names() -> None:
    mesh = fmesh.make_mesh((2, 2), ("<tp&>", "\"x'y"))
    text = html(mesh, highlight="<tp&>")
    assert "<tp&>" not in text and "&lt;tp&amp;&gt;" in text
    root = check_html(mesh, "<tp&>")
    titles = sorted(title for _, title, _ in _cells(root))
    assert titles[0] == "rank 0: <tp&>=0, \"x'y=0; group a along <tp&>"
    assert html_lib.unescape(text).count("<tp&>") >= 5
    assert "<tp&>" in fmesh.render(mesh, highlight="<tp&>")


def test_html_large_mesh_is_summarised_and_bounded() -> None:  # how fast: bench/mesh_ops.py
    for sizes in ((100_000,), (316, 316), (10, 100, 100), (4, 25, 1000), (8, 16, 256, 2, 16)):
        mesh = fmesh.make_mesh(sizes, tuple("abcde"[: len(sizes)]))
        text = html(mesh)
        assert len(text.encode()) < 200_000, sizes
        root = check_html(mesh)
        cells = root.findall(".//td")
        assert len(cells) <= 36 * 33 + 64, sizes  # about 32 x 32, plus ellipsis rows/columns
        notes = " ".join("".join(div.itertext()) for div in root.iter("div"))
        assert f"summary: {mesh.size} ranks per instance" in notes, sizes
        assert ELLIPSIS in text


def test_import_stays_torch_free() -> None:
    code = (
        "import sys, fmesh\n"
        "m = fmesh.make_mesh((2, 2, 4), ('dp', 'cp', 'tp'))\n"
        "fmesh.render(m, highlight='tp'); fmesh.rendering.html(m)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_notebooks_draw_a_mesh_as_its_html_table() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert fmesh.rendering.show_in_notebooks()
        mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
        formatted, _ = shell.display_formatter.format(mesh)
        assert formatted["text/html"] == html(mesh)  # what a cell ending in `mesh` shows
        assert formatted["text/plain"] == repr(mesh)
    finally:
        InteractiveShell.clear_instance()


# --------------------------------------------------------------------------- what a planner asks of a picture


def test_the_rank_passed_is_marked_in_text_and_html() -> None:
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    out = check_text(mesh, "tp", rank=6)
    assert "* marks rank 6" in out.header
    assert {key: value for key, value in out.cells.items() if "*" in value} == {(None, "dp=1", "tp=2"): "6*·b"}
    root = check_html(mesh, "tp", rank=6)
    marked = [td for td in root.iter("td") if "outline" in (td.get("style") or "")]
    assert [td.text for td in marked] == ["6*·b"]
    assert all("*" not in (td.text or "") for td in check_html(mesh, "tp").iter("td"))


def _host_edges(mesh: Mesh, topology: fmesh.Topology) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """Expected host boundaries of a 2-axis mesh, from Topology.host_of: (row, col) of cells whose left
    neighbour, and of rows whose upper neighbour in some column, is on another host."""
    rows, cols = mesh.axis_sizes
    host = {(r, c): topology.host_of(mesh.group(mesh.groups(None)[0][0], None)[r * cols + c])
            for r in range(rows) for c in range(cols)}
    left = {(r, c) for r in range(rows) for c in range(1, cols) if host[r, c] != host[r, c - 1]}
    above = {(r, c) for r in range(1, rows) for c in range(cols) if host[r, c] != host[r - 1, c]}
    return left, above


@pytest.mark.parametrize(
    ("shape", "rank_map", "topology"),
    [
        ((2, 4), None, fmesh.Topology(4, 2)),
        ((4, 2), None, fmesh.Topology(2, 4)),
        ((2, 4), None, fmesh.Topology(2, 4, rank_order="cyclic")),
        ((4, 4), list(range(15, -1, -1)),
         fmesh.Topology(2, 8, rank_order=tuple(np.random.default_rng(1).permutation(16).tolist()))),
    ],
)
def test_host_boundaries_in_text_and_html(shape: tuple[int, int], rank_map: list[int] | None,
                                          topology: fmesh.Topology) -> None:
    mesh = fmesh.make_mesh(shape, ("dp", "tp"), rank_map=rank_map)
    left, above = _host_edges(mesh, topology)
    out = Text(fmesh.render(mesh, "tp", topology=topology))
    assert out.host_bars == {(None, f"dp={r}", f"tp={c}") for r, c in left}
    assert out.host_rules == len({r for r, _ in above})
    root = _tree(html(mesh, "tp", topology=topology))
    drawn_left, drawn_above = set(), set()
    for td in root.iter("td"):
        title = td.get("title") or ""
        coordinate = tuple(int(x) for x in re.findall(r"=(\d+)", title.split(";")[0]))
        cell_rank = int(title.split(":")[0].split()[1])
        assert title.endswith(f"; host {topology.host_of(cell_rank)}")
        if "border-left" in (td.get("style") or ""):
            drawn_left.add(coordinate)
        if "border-top" in (td.get("style") or ""):
            drawn_above.add(coordinate)
    assert (drawn_left, drawn_above) == (left, above)


def test_gpus_per_node_is_block_order_and_checked() -> None:
    mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    assert fmesh.render(mesh, "tp", gpus_per_node=2) == fmesh.render(mesh, "tp", topology=fmesh.Topology(4, 2))
    assert html(mesh, gpus_per_node=2) == html(mesh, topology=fmesh.Topology(4, 2))
    assert "hosts: 4 hosts of 2 ranks (block order)" in fmesh.render(mesh, gpus_per_node=2)
    with pytest.raises(ValueError, match="gpus_per_node=3 does not divide the mesh's world size 8"):
        fmesh.render(mesh, gpus_per_node=3)
    with pytest.raises(ValueError, match="expected gpus_per_node as a positive int, but got 0"):
        html(mesh, gpus_per_node=0)
    with pytest.raises(ValueError, match="not both"):
        fmesh.render(mesh, gpus_per_node=2, topology=fmesh.Topology(4, 2))
    with pytest.raises(ValueError, match="has 16 ranks, but the mesh's world has 8"):
        fmesh.render(mesh, topology=fmesh.Topology(2, 8))
    with pytest.raises(TypeError, match=r"expected topology as an fmesh\.Topology"):
        html(mesh, topology=8)  # type: ignore[arg-type]


def test_one_group_is_one_group() -> None:
    mesh = fmesh.make_mesh((4,), ("tp",))
    assert "groups along tp: 1 group of 4 ranks in this instance, tagged a" in fmesh.render(mesh, "tp")
    text = "".join(_tree(html(mesh, "tp")).itertext())
    assert "1 group of 4 ranks" in text and "1 groups" not in text
    assert "2 groups of 2 ranks" in "".join(_tree(html(fmesh.make_mesh((2, 2), ("dp", "tp")))).itertext())
    assert "1 group of 1 rank in this instance" in fmesh.render(fmesh.make_mesh((1,), ("tp",)), "tp")


def test_blocks_say_their_hosts() -> None:
    mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
    for topology in (fmesh.Topology(2, 8), fmesh.Topology(4, 4, rank_order="cyclic")):
        out = Text(fmesh.render(mesh, "tp", topology=topology))
        expected = {f"dp={d}": sorted({topology.host_of(r) for r in range(16) if mesh.coordinate(r)[0] == d})
                    for d in range(2)}
        assert out.block_hosts == expected
        headers = ["".join(th.itertext()) for th in _tree(html(mesh, topology=topology)).iter("th")
                   if th.get("colspan")]
        assert headers == [f"{d} (host{'s' if len(h) > 1 else ''} {', '.join(map(str, h))})"
                           for d, h in expected.items()]
    assert Text(fmesh.render(mesh, "tp")).block_hosts == {}
