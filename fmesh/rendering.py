"""Pictures of a mesh: a text grid (:func:`render`) and an HTML table (:func:`html`).

Pure: no torch, no ``torch.distributed``. Only the cells that are drawn are
computed (each by digit arithmetic on the mesh's layouts), so a mesh of a
million ranks is summarised in milliseconds.

What is drawn is one *instance* of the mesh (the one holding ``rank``; by
default the first one, whose base slot is ``mesh.offset`` — the instance of the
lowest covered rank when the rank map is the identity):

* 1 axis: one row; 2 axes: rows are the first axis, columns the second;
* 3 or more axes: one 2-D block (rows: the next-to-last axis, columns: the last)
  per coordinate of the leading axes, labelled with those coordinates. For more
  than 3 axes the header says so (the leading axes are enumerated row-major).

The groups along ``highlight`` (one axis or several, taken together like
``mesh.group(rank, highlight)``) are tagged with letters ``a``, ``b``, ...,
``z``, ``aa``, ... in the row-major order of the other axes' coordinates, and
the legend lists each group's ranks. In HTML each drawn group has its own colour
(:func:`group_colour`: hues a golden angle apart, in group order; no randomness, no repeats).

Large instances are summarised: the first and last few coordinates of each long
axis are drawn with ``…`` standing for the rest, and the header says what was
left out.
"""

from __future__ import annotations

import html as _html
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from fmesh.layout.int_tuple import product
from fmesh.layout.int_tuple import row_major_coordinate as _unravel  # one row-major helper: int_tuple's
from fmesh.layout.layout import Modes, complement_modes, decompose_modes
from fmesh.mesh.mesh import Mesh

__all__ = ["CAPTION_STYLE", "GOLDEN_ANGLE", "group_colour", "html", "render", "show_in_notebooks"]

HighlightArg = str | Sequence[str] | None

GOLDEN_ANGLE = 137.50776405003785
"""Degrees between the hues of consecutive groups: 360 / phi^2, so that no two hues ever coincide and
each new one falls in the widest gap left by the others."""


def group_colour(index: int) -> str:
    """The background of the ``index``-th drawn group: hues a golden angle apart, in light tones that keep
    black text readable (three lightness levels, so that near hues of far-apart groups still differ).

    >>> group_colour(0), group_colour(1)
    ('hsl(0.00,70%,82%)', 'hsl(137.51,70%,74%)')
    """
    hue = (index * GOLDEN_ANGLE) % 360
    return f"hsl({hue:.2f},70%,{(82, 74, 90)[index % 3]}%)"


ELLIPSIS = "…"

# Text: an instance is drawn in full up to this many cells (and this many columns);
# beyond, each long axis keeps this many coordinates at each end.
TEXT_MAX_CELLS = 512
TEXT_MAX_COLUMNS = 32
_TEXT_KEEP = {"block": 2, "row": 4, "col": 4}
# HTML: at most about 32 x 32 cells.
HTML_MAX_COLUMNS = 32
HTML_MAX_ROWS = 32
HTML_MAX_BLOCKS = 4
# Legend: at most this many groups, and this many ranks per group, are listed.
LEGEND_MAX_GROUPS = 32
LEGEND_MAX_RANKS = 16

Pick = list[int | None]  # coordinates to draw along one dimension; None stands for an ellipsis


def _tag(index: int) -> str:
    """Spreadsheet-style letters: 0 -> a, 25 -> z, 26 -> aa."""
    letters = ""
    index += 1
    while index:
        index, digit = divmod(index - 1, 26)
        letters = chr(ord("a") + digit) + letters
    return letters


def _pick(size: int, limit: int, keep: int) -> Pick:
    """All of ``range(size)`` when ``size <= limit``, else the first and last ``keep`` around ``None``."""
    if size <= limit or size <= 2 * keep + 1:
        return list(range(size))
    return [*range(keep), None, *range(size - keep, size)]


def _axis_offset(modes: Modes, coordinate: int) -> int:
    offset = 0
    for size, stride in reversed(modes):
        coordinate, digit = divmod(coordinate, size)
        offset += digit * stride
    return offset


def _ravel(coordinate: Sequence[int], sizes: Sequence[int]) -> int:
    index = 0
    for digit, size in zip(coordinate, sizes, strict=True):
        index = index * size + digit
    return index


@dataclass(frozen=True)
class _Instance:
    """One instance of a mesh, and its groups along the highlighted axes."""

    mesh: Mesh
    base: int  # the instance's base index (in the mesh's index space, before frame and rank map)
    number: int  # which instance, in the order of mesh.groups()
    highlight: tuple[int, ...]  # positions of the highlighted axes, in the order given
    others: tuple[int, ...]  # positions of the other axes, in mesh order

    @property
    def names(self) -> tuple[str, ...]:
        return self.mesh.axis_names

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.mesh.axis_sizes

    def rank(self, coordinate: Sequence[int]) -> int:
        index = self.base
        for layout, digit in zip(self.mesh.layouts, coordinate, strict=True):
            index += _axis_offset(layout.modes, digit)
        return self.mesh.rank_at(index)

    @property
    def num_groups(self) -> int:
        return product(tuple(self.sizes[i] for i in self.others))

    @property
    def group_size(self) -> int:
        return product(tuple(self.sizes[i] for i in self.highlight))

    def group_of(self, coordinate: Sequence[int]) -> int:
        return _ravel([coordinate[i] for i in self.others], [self.sizes[i] for i in self.others])

    def group_label(self, group: int) -> str:
        digits = _unravel(group, [self.sizes[i] for i in self.others])
        return ", ".join(f"{self.names[i]}={d}" for i, d in zip(self.others, digits, strict=True)) or "(whole instance)"

    def group_ranks(self, group: int, limit: int) -> list[int | None]:
        """The group's ranks, row-major along the highlighted axes (as ``mesh.group``), elided past ``limit``."""
        fixed = _unravel(group, [self.sizes[i] for i in self.others])
        hsizes = [self.sizes[i] for i in self.highlight]
        picks = _pick(product(tuple(hsizes)), limit, limit // 2 - 2)
        ranks: list[int | None] = []
        coordinate = [0] * len(self.sizes)
        for i, digit in zip(self.others, fixed, strict=True):
            coordinate[i] = digit
        for flat in picks:
            if flat is None:
                ranks.append(None)
                continue
            for i, digit in zip(self.highlight, _unravel(flat, hsizes), strict=True):
                coordinate[i] = digit
            ranks.append(self.rank(coordinate))
        return ranks


def _instance(mesh: Mesh, highlight: HighlightArg, rank: int | None) -> _Instance:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected an fmesh.Mesh, got {type(mesh).__name__}: {mesh!r}")
    if highlight is None:
        chosen: tuple[str, ...] = ()
    elif isinstance(highlight, str) or (
        isinstance(highlight, Sequence) and all(isinstance(name, str) for name in highlight)
    ):
        chosen = mesh.resolve_axes(highlight)
        if not chosen:
            raise ValueError(f"highlight needs at least one axis of {mesh.axis_names}, got {highlight!r}")
    else:
        raise TypeError(
            f"highlight must be an axis name or a tuple of axis names from {mesh.axis_names}, got {highlight!r}"
        )
    layout = mesh.axes_layout()
    if rank is None:
        base = mesh.offset
    else:
        _, base = layout.decompose(mesh.index_of(rank))
    instances = complement_modes(layout.modes + mesh.pinned.modes, mesh.world_size)
    number = decompose_modes(instances, base)[0]
    positions = tuple(mesh.axis_index(name) for name in chosen)
    others = tuple(i for i in range(mesh.ndim) if i not in positions)
    return _Instance(mesh, base, number, positions, others)


@dataclass(frozen=True)
class _Frame:
    """Which coordinates are drawn: blocks (leading axes), rows, columns."""

    block_sizes: tuple[int, ...]
    blocks: Pick
    rows: Pick
    cols: Pick
    summarised: bool

    @staticmethod
    def build(sizes: tuple[int, ...], limits: dict[str, int], keep: dict[str, int], summarise: bool) -> _Frame:
        ndim = len(sizes)
        block_sizes = sizes[:-2] if ndim >= 3 else ()
        row_size = sizes[-2] if ndim >= 2 else 1
        col_size = sizes[-1] if ndim >= 1 else 1
        big = 1 << 62
        blocks = _pick(product(block_sizes), limits["block"] if summarise else big, keep["block"])
        rows = _pick(row_size, limits["row"] if summarise else big, keep["row"])
        cols = _pick(col_size, limits["col"] if summarise else big, keep["col"])
        return _Frame(block_sizes, blocks, rows, cols, summarise)

    def coordinate(self, block: int, row: int, col: int, ndim: int) -> tuple[int, ...]:
        inner = (row, col) if ndim >= 2 else (col,) if ndim == 1 else ()
        return _unravel(block, self.block_sizes) + inner

    def elided(self, sizes: tuple[int, ...]) -> list[str]:
        """Human-readable list of what the ellipses stand for."""
        shown = [
            ("blocks", product(self.block_sizes), self.blocks),
            ("rows", sizes[-2] if len(sizes) >= 2 else 1, self.rows),
            ("columns", sizes[-1] if sizes else 1, self.cols),
        ]
        return [
            f"{sum(1 for p in pick if p is not None)} of {total} {what}"
            for what, total, pick in shown
            if None in pick
        ]


def _layout_line(mesh: Mesh) -> str:
    names, sizes = mesh.axis_names, mesh.axis_sizes
    if mesh.ndim == 0:
        return "no axes: a single rank per instance"
    parts = [f"columns: {names[-1]} ({sizes[-1]})"]
    if mesh.ndim >= 2:
        parts.insert(0, f"rows: {names[-2]} ({sizes[-2]})")
    if mesh.ndim == 3:
        parts.append(f"one block per {names[0]} ({sizes[0]})")
    elif mesh.ndim > 3:
        lead = ", ".join(names[:-2])
        count = product(sizes[:-2])
        return (
            f"{mesh.ndim} axes, more than 3: one block per ({lead}) coordinate ({count} blocks, row-major), "
            + ", ".join(parts)
        )
    return ", ".join(parts)


def _instance_line(mesh: Mesh, inst: _Instance, rank: int | None) -> str | None:
    if mesh.num_instances == 1:
        return None
    holding = f"holding rank {rank}" if rank is not None else "the first; pass rank= to choose another"
    return f"instance {inst.number + 1} of {mesh.num_instances} ({holding})"


def _highlight_line(inst: _Instance) -> str | None:
    if not inst.highlight:
        return None
    axes = ", ".join(inst.names[i] for i in inst.highlight)
    count = inst.num_groups
    tags = "a" if count == 1 else f"{_tag(0)}..{_tag(count - 1)}"
    noun = "group" if count == 1 else "groups"
    return f"groups along {axes}: {count} {noun} of {inst.group_size} ranks in this instance, tagged {tags}"


def _legend_groups(inst: _Instance, shown: list[int]) -> tuple[list[int], int]:
    """The groups to list (those drawn, capped) and how many drawn ones were left out."""
    groups = sorted(set(shown))
    if len(groups) <= LEGEND_MAX_GROUPS:
        return groups, 0
    head = LEGEND_MAX_GROUPS - 4
    return [*groups[:head], *groups[-4:]], len(groups) - LEGEND_MAX_GROUPS


def _ranks_text(ranks: list[int | None]) -> str:
    return ", ".join(ELLIPSIS if r is None else str(r) for r in ranks)


def render(mesh: Mesh, highlight: HighlightArg = None, rank: int | None = None) -> str:
    """A text picture of one instance of ``mesh``, with the groups along ``highlight`` tagged.

    Each cell shows a rank, and with ``highlight`` its group's tag (``5·b``);
    the legend lists each group's fixed coordinates and ranks (ordered like
    ``mesh.group(rank, highlight)``). 3 or more axes are drawn as one block
    per coordinate of the leading axes; instances of more than 512 ranks are
    summarised with ``…``.

    >>> import fmesh
    >>> print(fmesh.render(fmesh.make_mesh((2, 3), ("dp", "tp")), highlight="tp"))
    Mesh(dp=2, tp=3; world=6)
    rows: dp (2), columns: tp (3)
    groups along tp: 2 groups of 3 ranks in this instance, tagged a..b
    <BLANKLINE>
          tp=0  tp=1  tp=2
    dp=0  0·a   1·a   2·a
    dp=1  3·b   4·b   5·b
    <BLANKLINE>
    legend (groups along tp):
      a  dp=0: 0, 1, 2
      b  dp=1: 3, 4, 5
    """
    inst = _instance(mesh, highlight, rank)
    sizes = mesh.axis_sizes
    ndim = mesh.ndim
    summarise = mesh.size > TEXT_MAX_CELLS or (ndim >= 1 and sizes[-1] > TEXT_MAX_COLUMNS)
    limits = {"block": 2 * _TEXT_KEEP["block"], "row": 2 * _TEXT_KEEP["row"], "col": 2 * _TEXT_KEEP["col"]}
    frame = _Frame.build(sizes, limits, _TEXT_KEEP, summarise)

    header = [repr(mesh)]
    for note in (_instance_line(mesh, inst, rank), _layout_line(mesh), _highlight_line(inst)):
        if note is not None:
            header.append(note)
    if frame.summarised:
        header.append(
            f"summary: {mesh.size} ranks per instance (more than {TEXT_MAX_CELLS} cells or {TEXT_MAX_COLUMNS} "
            f"columns); showing {', '.join(frame.elided(sizes))}; {ELLIPSIS} marks the rest"
        )

    col_labels = [ELLIPSIS if c is None else f"{mesh.axis_names[-1]}={c}" for c in frame.cols] if ndim else [""]
    # Cells of each drawn block: rows of strings; remember the groups drawn for the legend.
    shown_groups: list[int] = []
    blocks: list[tuple[str, list[tuple[str, list[str]]]]] = []
    for block in frame.blocks:
        if block is None:
            blocks.append((ELLIPSIS, []))
            continue
        label = ", ".join(f"{n}={d}" for n, d in zip(mesh.axis_names, _unravel(block, frame.block_sizes), strict=False))
        rows: list[tuple[str, list[str]]] = []
        for row in frame.rows:
            row_label = "" if ndim < 2 else ELLIPSIS if row is None else f"{mesh.axis_names[-2]}={row}"
            cells: list[str] = []
            for col in frame.cols:
                if row is None or col is None:
                    cells.append(ELLIPSIS)
                    continue
                coordinate = frame.coordinate(block, row, col, ndim)
                text = str(inst.rank(coordinate))
                if inst.highlight:
                    group = inst.group_of(coordinate)
                    shown_groups.append(group)
                    text += "·" + _tag(group)
                cells.append(text)
            rows.append((row_label, cells))
        blocks.append((label, rows))

    width = max([len(s) for s in col_labels] + [len(c) for _, rows in blocks for _, cells in rows for c in cells])
    label_width = max([len(r) for _, rows in blocks for r, _ in rows] + [0])
    lead = " " * label_width + "  " if label_width else ""

    def text_row(label: str, cells: list[str]) -> str:
        prefix = label.ljust(label_width) + "  " if label_width else ""
        return (prefix + "  ".join(c.ljust(width) for c in cells)).rstrip()

    body: list[str] = []
    for label, rows in blocks:
        body.append("")
        if ndim >= 3:
            if not rows:
                hidden = product(frame.block_sizes) - sum(1 for b in frame.blocks if b is not None)
                body.append(f"{ELLIPSIS} ({hidden} blocks not drawn)")
                continue
            body.append(f"{label}:")
        if ndim:
            body.append((lead + "  ".join(c.ljust(width) for c in col_labels)).rstrip())
        body.extend(text_row(label, cells) for label, cells in rows)

    legend: list[str] = []
    if inst.highlight:
        listed, left_out = _legend_groups(inst, shown_groups)
        axes = ", ".join(inst.names[i] for i in inst.highlight)
        legend = ["", f"legend (groups along {axes}):"]
        tag_width = max(len(_tag(group)) for group in listed)
        for index, group in enumerate(listed):
            if left_out and index == len(listed) - 4:
                legend.append(f"  {ELLIPSIS} {left_out} more drawn groups not listed")
            ranks = _ranks_text(inst.group_ranks(group, LEGEND_MAX_RANKS))
            legend.append(f"  {_tag(group).ljust(tag_width)}  {inst.group_label(group)}: {ranks}")
        if frame.summarised and inst.num_groups > len(set(shown_groups)):
            legend.append(f"  ({inst.num_groups} groups in all; only those drawn are listed)")
    return "\n".join(header + body + legend)


def _esc(text: object) -> str:
    return _html.escape(str(text), quote=True)


def _colours(inst: _Instance, frame: _Frame) -> dict[int, str]:
    """One distinct colour per drawn group, in group order (:func:`group_colour`)."""
    if not inst.highlight:
        return {}
    ndim = inst.mesh.ndim
    drawn = {
        inst.group_of(frame.coordinate(block, row, col, ndim))
        for block in frame.blocks
        if block is not None
        for row in frame.rows
        if row is not None
        for col in frame.cols
        if col is not None
    }
    return {group: group_colour(i) for i, group in enumerate(sorted(drawn))}


# Cells carry only their colours (inline, so that notebook viewers that drop <style> keep them);
# borders and padding come from the table's own attributes, which cost nothing per cell.
_CELL = "color:#000;background:"
CAPTION_STYLE = "text-align:left;padding-bottom:4px;font-weight:bold"
"""Style of the line above the table that names the mesh (a block as wide as the notebook cell)."""
_GAP = "color:#666;text-align:center"


def html(mesh: Mesh, highlight: HighlightArg = None, rank: int | None = None) -> str:
    """An HTML table of one instance of ``mesh``, one colour per group along ``highlight``.

    ``highlight`` defaults to the last axis. Each cell's ``title`` (shown on
    hover) names its rank, coordinates and group; a legend follows, and the
    caption above the table (as wide as the page, not the table) is the mesh's repr.
    At most about 32 x 32 cells are drawn; larger instances are summarised with
    ``…`` rows and columns and a note of what was left out. Everything is escaped, and the result is well-formed XML.

    >>> import fmesh
    >>> out = fmesh.rendering.html(fmesh.make_mesh((2, 2), ("dp", "tp")))
    >>> out.startswith("<div"), 'title="rank 3: dp=1, tp=1; group b along tp"' in out
    (True, True)
    """
    if highlight is None and isinstance(mesh, Mesh) and mesh.ndim:
        highlight = mesh.axis_names[-1]
    inst = _instance(mesh, highlight, rank)
    sizes = mesh.axis_sizes
    ndim = mesh.ndim
    shown_blocks = min(product(sizes[:-2]) if ndim >= 3 else 1, HTML_MAX_BLOCKS + 1)
    row_limit = max(4, HTML_MAX_ROWS // shown_blocks)
    limits = {"block": HTML_MAX_BLOCKS, "row": row_limit, "col": HTML_MAX_COLUMNS}
    keep = {"block": HTML_MAX_BLOCKS // 2, "row": row_limit // 2, "col": HTML_MAX_COLUMNS // 2}
    frame = _Frame.build(sizes, limits, keep, summarise=True)
    names = mesh.axis_names
    hl_axes = ", ".join(names[i] for i in inst.highlight)

    out: list[str] = ['<div class="fmesh-mesh" style="font-family:monospace;font-size:12px">']
    caption = [repr(mesh)]
    line = _instance_line(mesh, inst, rank)
    if line:
        caption.append(line)
    caption.append(_layout_line(mesh))
    # A block of its own above the table, not a <caption>: a caption is laid out at the table's width, so
    # a narrow table (one axis of 2) squeezed the mesh's description into a column of words.
    out.append(f'<div class="fmesh-caption" style="{CAPTION_STYLE}">{_esc(" — ".join(caption))}</div>')
    out.append('<table border="1" cellpadding="3" cellspacing="0" style="border-collapse:collapse;margin-bottom:6px">')

    corner = f"{names[-2]} \\ {names[-1]}" if ndim >= 2 else names[-1] if ndim == 1 else ""
    out.append(f'<thead><tr><th>{_esc(corner)}</th>')
    for col in frame.cols:
        label = ELLIPSIS if col is None else f"{names[-1]}={col}" if ndim else ""
        out.append(f'<th>{_esc(label)}</th>')
    out.append("</tr></thead><tbody>")

    span = len(frame.cols) + 1
    shown_groups: list[int] = []
    colours = _colours(inst, frame)
    for block in frame.blocks:
        if ndim >= 3:
            label = (
                f"{ELLIPSIS} blocks elided"
                if block is None
                else ", ".join(f"{n}={d}" for n, d in zip(names, _unravel(block, frame.block_sizes), strict=False))
            )
            out.append(f'<tr><th colspan="{span}" style="text-align:left">{_esc(label)}</th></tr>')
        if block is None:
            continue
        for row in frame.rows:
            row_label = "" if ndim < 2 else ELLIPSIS if row is None else f"{names[-2]}={row}"
            out.append(f'<tr><th>{_esc(row_label)}</th>')
            for col in frame.cols:
                if row is None or col is None:
                    out.append(f'<td style="{_GAP}">{ELLIPSIS}</td>')
                    continue
                coordinate = frame.coordinate(block, row, col, ndim)
                cell_rank = inst.rank(coordinate)
                title = f"rank {cell_rank}: " + (
                    ", ".join(f"{n}={d}" for n, d in zip(names, coordinate, strict=True)) or "no axes"
                )
                background = "#fff"
                if inst.highlight:
                    group = inst.group_of(coordinate)
                    shown_groups.append(group)
                    background = colours[group]
                    title += f"; group {_tag(group)} along {hl_axes}"
                out.append(f'<td style="{_CELL}{background}" title="{_esc(title)}">{cell_rank}</td>')
            out.append("</tr>")
    out.append("</tbody></table>")

    elided = frame.elided(sizes)
    if elided:
        note = f"summary: {mesh.size} ranks per instance; showing {', '.join(elided)}; {ELLIPSIS} marks the rest"
        out.append(f"<div>{_esc(note)}</div>")
    if inst.highlight:
        listed, left_out = _legend_groups(inst, shown_groups)
        out.append(f"<div>{_esc(f'groups along {hl_axes}: {inst.num_groups} groups of {inst.group_size} ranks')}</div>")
        out.append('<ul style="list-style:none;padding-left:0;margin:2px 0">')
        for index, group in enumerate(listed):
            if left_out and index == len(listed) - 4:
                out.append(f"<li>{_esc(f'{ELLIPSIS} {left_out} more drawn groups not listed')}</li>")
            colour = colours[group]
            text = f"{_tag(group)}  {inst.group_label(group)}: {_ranks_text(inst.group_ranks(group, LEGEND_MAX_RANKS))}"
            out.append(
                f'<li><span style="background:{colour};border:1px solid #888;padding:0 6px">&#160;</span> '
                f"{_esc(text)}</li>"
            )
        out.append("</ul>")
        if inst.num_groups > len(set(shown_groups)):
            out.append(f"<div>{_esc(f'({inst.num_groups} groups in all; only those drawn are listed)')}</div>")
    out.append("</div>")
    return "".join(out)


def show_in_notebooks() -> bool:
    """Make IPython (Jupyter) draw every :class:`~fmesh.Mesh` with :func:`html`; ``True`` if a shell runs.

    ``import fmesh`` calls it, so a notebook cell that ends with a mesh shows the coloured table.
    It registers :func:`html` in the running shell's own table of HTML formatters (IPython's
    ``for_type``), so the mesh values themselves know nothing of pictures. Outside IPython it does
    nothing.

    >>> show_in_notebooks()  # a plain interpreter: no shell to tell
    False
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    shell.display_formatter.formatters["text/html"].for_type(Mesh, html)
    return True
