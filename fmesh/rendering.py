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

``rank=`` also marks that rank's cell (``5*``, and a bold outline in HTML). With ``gpus_per_node=`` (block order)
or a ``topology=`` the pictures show where the host changes: ``|`` between columns and a ``-`` line between rows in
text, thick lines in HTML, and the host in each HTML cell's title.

Large instances are summarised: the first and last few coordinates of each long
axis are drawn with ``…`` standing for the rest, and the header says what was
left out.
"""

from __future__ import annotations

import html as _html
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from fmesh.layout import flat
from fmesh.layout.flat import Modes
from fmesh.layout.int_tuple import product
from fmesh.layout.int_tuple import row_major_coordinate as _unravel  # one row-major helper: int_tuple's
from fmesh.mesh.mesh import Mesh
from fmesh.plan.costs import format_bytes
from fmesh.plan.parallel import WORLD_AXES, ParallelDims
from fmesh.plan.topology import Topology
from fmesh.plan.traffic import Transfer

__all__ = ["CAPTION_STYLE", "GOLDEN_ANGLE", "group_colour", "html", "render", "show_in_notebooks", "traffic_html"]

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
        for pick in picks:
            if pick is None:
                ranks.append(None)
                continue
            for i, digit in zip(self.highlight, _unravel(pick, hsizes), strict=True):
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
    instances = flat.complement(layout.modes + mesh.pinned.modes, mesh.world_size)
    number = flat.decompose(instances, base)[0]
    positions = tuple(mesh.axis_index(name) for name in chosen)
    others = tuple(i for i in range(mesh.ndim) if i not in positions)
    return _Instance(mesh, base, number, positions, others)


RANK_MARK = "*"
"""Suffix of the cell of the rank passed with ``rank=`` (readable without colour)."""


def _hosts(mesh: Mesh, topology: Topology | None, gpus_per_node: int | None) -> Topology | None:
    """The topology whose host boundaries a picture shows, checked against ``mesh``; ``None`` for none."""
    if topology is not None and gpus_per_node is not None:
        raise ValueError(f"pass topology= or gpus_per_node=, not both (got {topology!r} and {gpus_per_node!r})")
    if gpus_per_node is not None:
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"expected gpus_per_node as a positive int, but got {gpus_per_node!r}")
        if mesh.world_size % gpus_per_node:
            raise ValueError(
                f"gpus_per_node={gpus_per_node} does not divide the mesh's world size {mesh.world_size}"
            )
        return Topology(mesh.world_size // gpus_per_node, gpus_per_node)
    if topology is not None:
        if not isinstance(topology, Topology):
            raise TypeError(f"expected topology as an fmesh.Topology, but got {type(topology).__name__}: {topology!r}")
        if topology.world_size != mesh.world_size:
            raise ValueError(
                f"topology {topology!r} has {topology.world_size} ranks, but the mesh's world has {mesh.world_size}"
            )
    return topology


def _hosts_line(hosts: Topology | None, html: bool) -> str | None:
    if hosts is None:
        return None
    marks = "thick lines" if html else "| and -"
    order = hosts.rank_order if isinstance(hosts.rank_order, str) else "custom"
    return (f"hosts: {hosts.hosts} hosts of {hosts.ranks_per_host} ranks ({order} order); {marks} mark where the host"
            " changes")


def _rank_line(rank: int | None, html: bool) -> str | None:
    if rank is None:
        return None
    return f"rank {rank} is outlined" if html else f"{RANK_MARK} marks rank {rank}"


@dataclass(frozen=True)
class _View:
    """Which coordinates are drawn: blocks (leading axes), rows, columns."""

    block_sizes: tuple[int, ...]
    blocks: Pick
    rows: Pick
    cols: Pick
    summarised: bool

    @staticmethod
    def build(sizes: tuple[int, ...], limits: dict[str, int], keep: dict[str, int], summarise: bool) -> _View:
        ndim = len(sizes)
        block_sizes = sizes[:-2] if ndim >= 3 else ()
        row_size = sizes[-2] if ndim >= 2 else 1
        col_size = sizes[-1] if ndim >= 1 else 1
        big = 1 << 62
        blocks = _pick(product(block_sizes), limits["block"] if summarise else big, keep["block"])
        rows = _pick(row_size, limits["row"] if summarise else big, keep["row"])
        cols = _pick(col_size, limits["col"] if summarise else big, keep["col"])
        return _View(block_sizes, blocks, rows, cols, summarise)

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
    return f"instance {inst.number} of {mesh.num_instances}, numbered from 0 ({holding})"


def _highlight_line(inst: _Instance) -> str | None:
    if not inst.highlight:
        return None
    axes = ", ".join(inst.names[i] for i in inst.highlight)
    count = inst.num_groups
    tags = "a" if count == 1 else f"{_tag(0)}..{_tag(count - 1)}"
    noun = "group" if count == 1 else "groups"
    ranks = "rank" if inst.group_size == 1 else "ranks"
    return f"groups along {axes}: {count} {noun} of {inst.group_size} {ranks} in this instance, tagged {tags}"


def _legend_groups(inst: _Instance, shown: list[int]) -> tuple[list[int], int]:
    """The groups to list (those drawn, capped) and how many drawn ones were left out."""
    groups = sorted(set(shown))
    if len(groups) <= LEGEND_MAX_GROUPS:
        return groups, 0
    head = LEGEND_MAX_GROUPS - 4
    return [*groups[:head], *groups[-4:]], len(groups) - LEGEND_MAX_GROUPS


def _ranks_text(ranks: list[int | None]) -> str:
    return ", ".join(ELLIPSIS if r is None else str(r) for r in ranks)


def render(
    mesh: Mesh,
    highlight: HighlightArg = None,
    rank: int | None = None,
    *,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
) -> str:
    """A text picture of one instance of ``mesh``, with the groups along ``highlight`` tagged.

    Each cell shows a rank, and with ``highlight`` its group's tag (``5·b``); ``rank``'s own cell is marked
    ``5*``; with ``gpus_per_node`` (block order) or a ``topology``, ``|`` and a line of ``-`` mark where the host
    changes;
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
    hosts = _hosts(mesh, topology, gpus_per_node)
    sizes = mesh.axis_sizes
    ndim = mesh.ndim
    summarise = mesh.size > TEXT_MAX_CELLS or (ndim >= 1 and sizes[-1] > TEXT_MAX_COLUMNS)
    limits = {"block": 2 * _TEXT_KEEP["block"], "row": 2 * _TEXT_KEEP["row"], "col": 2 * _TEXT_KEEP["col"]}
    view = _View.build(sizes, limits, _TEXT_KEEP, summarise)

    header = [repr(mesh)]
    notes = (_instance_line(mesh, inst, rank), _layout_line(mesh), _highlight_line(inst), _rank_line(rank, False),
             _hosts_line(hosts, False))
    for note in notes:
        if note is not None:
            header.append(note)
    if view.summarised:
        header.append(
            f"summary: {mesh.size} ranks per instance (more than {TEXT_MAX_CELLS} cells or {TEXT_MAX_COLUMNS} "
            f"columns); showing {', '.join(view.elided(sizes))}; {ELLIPSIS} marks the rest"
        )

    col_labels = [ELLIPSIS if c is None else f"{mesh.axis_names[-1]}={c}" for c in view.cols] if ndim else [""]
    # Cells of each drawn block: rows of strings; remember the groups drawn for the legend.
    shown_groups: list[int] = []
    blocks: list[tuple[str, list[tuple[str, list[str]]]]] = []
    cell_hosts: dict[tuple[int, int, int], int] = {}  # (block, row, col) -> host, when hosts are drawn
    for block in view.blocks:
        if block is None:
            blocks.append((ELLIPSIS, []))
            continue
        label = ", ".join(f"{n}={d}" for n, d in zip(mesh.axis_names, _unravel(block, view.block_sizes), strict=False))
        rows: list[tuple[str, list[str]]] = []
        for row in view.rows:
            row_label = "" if ndim < 2 else ELLIPSIS if row is None else f"{mesh.axis_names[-2]}={row}"
            cells: list[str] = []
            for col in view.cols:
                if row is None or col is None:
                    cells.append(ELLIPSIS)
                    continue
                coordinate = view.coordinate(block, row, col, ndim)
                cell_rank = inst.rank(coordinate)
                text = str(cell_rank) + (RANK_MARK if cell_rank == rank else "")
                if hosts is not None:
                    cell_hosts[block, row, col] = hosts.host_of(cell_rank)
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

    def text_row(label: str, cells: list[str], block: int | None, row: int | None) -> str:
        prefix = label.ljust(label_width) + "  " if label_width else ""
        line = cells[0].ljust(width) if cells else ""
        for index in range(1, len(cells)):
            crossing = _host_changes(cell_hosts, block, row, view.cols[index - 1], row, view.cols[index])
            line += (" |" if crossing else "  ") + cells[index].ljust(width)
        return (prefix + line).rstrip()

    def rule(block: int | None, above: int | None, row: int | None) -> str | None:
        """A line of ``-`` between two rows where some column changes host, else ``None``."""
        if not any(_host_changes(cell_hosts, block, above, col, row, col) for col in view.cols):
            return None
        return "-" * ((label_width + 2 if label_width else 0) + len(view.cols) * (width + 2) - 2)

    body: list[str] = []
    for (label, rows), block in zip(blocks, view.blocks, strict=True):
        body.append("")
        if ndim >= 3:
            if not rows:
                hidden = product(view.block_sizes) - sum(1 for b in view.blocks if b is not None)
                body.append(f"{ELLIPSIS} ({hidden} blocks not drawn)")
                continue
            body.append(f"{label}{_block_hosts(inst, view, block, hosts) if block is not None else ''}:")
        if ndim:
            body.append((lead + "  ".join(c.ljust(width) for c in col_labels)).rstrip())
        for index, ((row_label, cells), row) in enumerate(zip(rows, view.rows, strict=True)):
            line = rule(block, view.rows[index - 1], row) if index else None
            if line is not None:
                body.append(line)
            body.append(text_row(row_label, cells, block, row))

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
        if view.summarised and inst.num_groups > len(set(shown_groups)):
            legend.append(f"  ({inst.num_groups} groups in all; only those drawn are listed)")
    return "\n".join(header + body + legend)


def _host_changes(
    hosts: dict[tuple[int, int, int], int], block: int | None, row_a: int | None, col_a: int | None,
    row_b: int | None, col_b: int | None,
) -> bool:
    """Whether two drawn cells of one block are on different hosts (``False`` when hosts are not drawn, or either
    cell is an ellipsis)."""
    if block is None or None in (row_a, col_a, row_b, col_b):
        return False
    a = hosts.get((block, row_a, col_a))  # type: ignore[arg-type]
    b = hosts.get((block, row_b, col_b))  # type: ignore[arg-type]
    return a is not None and b is not None and a != b


def _block_hosts(inst: _Instance, view: _View, block: int, hosts: Topology | None) -> str:
    """`` (host 0)`` or `` (hosts 0, 1)``: the hosts of a block's drawn cells (blocks are drawn apart, so the host
    changes between blocks are said in their labels); empty when no hosts are drawn."""
    if hosts is None:
        return ""
    ndim = inst.mesh.ndim
    found = sorted({
        hosts.host_of(inst.rank(view.coordinate(block, row, col, ndim)))
        for row in view.rows if row is not None for col in view.cols if col is not None
    })
    shown = ", ".join(map(str, found)) if len(found) <= 4 else f"{found[0]}, {found[1]}, {ELLIPSIS}, {found[-1]}"
    return f" (host {shown})" if len(found) == 1 else f" (hosts {shown})"


def _esc(text: object) -> str:
    return _html.escape(str(text), quote=True)


def _colours(inst: _Instance, view: _View) -> dict[int, str]:
    """One distinct colour per drawn group, in group order (:func:`group_colour`)."""
    if not inst.highlight:
        return {}
    ndim = inst.mesh.ndim
    drawn = {
        inst.group_of(view.coordinate(block, row, col, ndim))
        for block in view.blocks
        if block is not None
        for row in view.rows
        if row is not None
        for col in view.cols
        if col is not None
    }
    return {group: group_colour(i) for i, group in enumerate(sorted(drawn))}


# Cells carry only their colours (inline, so that notebook viewers that drop <style> keep them);
# borders and padding come from the table's own attributes, which cost nothing per cell.
_CELL = "color:#000;background:"
CAPTION_STYLE = "text-align:left;padding-bottom:4px;font-weight:bold"
"""Style of the line above the table that names the mesh (a block as wide as the notebook cell)."""
_GAP = "color:#666;text-align:center"
_MARKED = "font-weight:bold;outline:3px solid #000;outline-offset:-3px"
_HOST_LINE = "3px solid #000"


def html(
    mesh: Mesh,
    highlight: HighlightArg = None,
    rank: int | None = None,
    *,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
) -> str:
    """An HTML table of one instance of ``mesh``, one colour and one tag per group along ``highlight``.

    ``highlight`` defaults to the last axis. Each cell shows its rank and its group's tag (``5·b``: readable
    without colour); ``rank``'s own cell is outlined and marked ``5*``; with ``gpus_per_node`` (block order) or a
    ``topology``, thick lines mark where the host changes. Each cell's ``title`` (shown on
    hover) names its rank, coordinates, group and host; a legend follows, and the
    caption above the table (as wide as the page, not the table) is the mesh's repr.
    At most about 32 x 32 cells are drawn; larger instances are summarised with
    ``…`` rows and columns and a note of what was left out. Everything is escaped, and the result is well-formed XML.

    >>> import fmesh
    >>> out = fmesh.rendering.html(fmesh.make_mesh((2, 2), ("dp", "tp")))
    >>> out.startswith("<div"), 'title="rank 3: dp=1, tp=1; group b along tp"' in out, ">3·b</td>" in out
    (True, True, True)
    """
    if highlight is None and isinstance(mesh, Mesh) and mesh.ndim:
        highlight = mesh.axis_names[-1]
    inst = _instance(mesh, highlight, rank)
    hosts = _hosts(mesh, topology, gpus_per_node)
    sizes = mesh.axis_sizes
    ndim = mesh.ndim
    shown_blocks = min(product(sizes[:-2]) if ndim >= 3 else 1, HTML_MAX_BLOCKS + 1)
    row_limit = max(4, HTML_MAX_ROWS // shown_blocks)
    limits = {"block": HTML_MAX_BLOCKS, "row": row_limit, "col": HTML_MAX_COLUMNS}
    keep = {"block": HTML_MAX_BLOCKS // 2, "row": row_limit // 2, "col": HTML_MAX_COLUMNS // 2}
    view = _View.build(sizes, limits, keep, summarise=True)
    names = mesh.axis_names
    hl_axes = ", ".join(names[i] for i in inst.highlight)

    out: list[str] = ['<div class="fmesh-mesh" style="font-family:monospace;font-size:12px">']
    caption = [repr(mesh)]
    line = _instance_line(mesh, inst, rank)
    if line:
        caption.append(line)
    caption.append(_layout_line(mesh))
    caption += [note for note in (_rank_line(rank, True), _hosts_line(hosts, True)) if note is not None]
    # A block of its own above the table, not a <caption>: a caption is laid out at the table's width, so
    # a narrow table (one axis of 2) squeezed the mesh's description into a column of words.
    out.append(f'<div class="fmesh-caption" style="{CAPTION_STYLE}">{_esc(" — ".join(caption))}</div>')
    out.append('<table border="1" cellpadding="3" cellspacing="0" style="border-collapse:collapse;margin-bottom:6px">')

    corner = f"{names[-2]} \\ {names[-1]}" if ndim >= 2 else names[-1] if ndim == 1 else ""
    out.append(f'<thead><tr><th>{_esc(corner)}</th>')
    for col in view.cols:
        label = ELLIPSIS if col is None else f"{names[-1]}={col}" if ndim else ""
        out.append(f'<th>{_esc(label)}</th>')
    out.append("</tr></thead><tbody>")

    span = len(view.cols) + 1
    shown_groups: list[int] = []
    cell_hosts: dict[tuple[int, int, int], int] = {}
    colours = _colours(inst, view)
    for block in view.blocks:
        if ndim >= 3:
            label = (
                f"{ELLIPSIS} blocks elided"
                if block is None
                else ", ".join(f"{n}={d}" for n, d in zip(names, _unravel(block, view.block_sizes), strict=False))
            )
            if block is not None:
                label += _block_hosts(inst, view, block, hosts)
            out.append(f'<tr><th colspan="{span}" style="text-align:left">{_esc(label)}</th></tr>')
        if block is None:
            continue
        for index, row in enumerate(view.rows):
            row_label = "" if ndim < 2 else ELLIPSIS if row is None else f"{names[-2]}={row}"
            out.append(f'<tr><th>{_esc(row_label)}</th>')
            above = view.rows[index - 1] if index else None
            for col_index, col in enumerate(view.cols):
                if row is None or col is None:
                    out.append(f'<td style="{_GAP}">{ELLIPSIS}</td>')
                    continue
                coordinate = view.coordinate(block, row, col, ndim)
                cell_rank = inst.rank(coordinate)
                title = f"rank {cell_rank}: " + (
                    ", ".join(f"{n}={d}" for n, d in zip(names, coordinate, strict=True)) or "no axes"
                )
                text = str(cell_rank) + (RANK_MARK if cell_rank == rank else "")
                background = "#fff"
                if inst.highlight:
                    group = inst.group_of(coordinate)
                    shown_groups.append(group)
                    background = colours[group]
                    title += f"; group {_tag(group)} along {hl_axes}"
                    text += "·" + _tag(group)
                style = f"{_CELL}{background}"
                if cell_rank == rank:
                    style += f";{_MARKED}"
                if hosts is not None:
                    host = hosts.host_of(cell_rank)
                    title += f"; host {host}"
                    cell_hosts[block, row, col] = host
                    left = view.cols[col_index - 1] if col_index else None
                    if _host_changes(cell_hosts, block, row, left, row, col):
                        style += f";border-left:{_HOST_LINE}"
                    if _host_changes(cell_hosts, block, above, col, row, col):
                        style += f";border-top:{_HOST_LINE}"
                out.append(f'<td style="{style}" title="{_esc(title)}">{_esc(text)}</td>')
            out.append("</tr>")
    out.append("</tbody></table>")

    elided = view.elided(sizes)
    if elided:
        note = f"summary: {mesh.size} ranks per instance; showing {', '.join(elided)}; {ELLIPSIS} marks the rest"
        out.append(f"<div>{_esc(note)}</div>")
    if inst.highlight:
        listed, left_out = _legend_groups(inst, shown_groups)
        noun = "group" if inst.num_groups == 1 else "groups"
        ranks = "rank" if inst.group_size == 1 else "ranks"
        count = f"groups along {hl_axes}: {inst.num_groups} {noun} of {inst.group_size} {ranks}, tagged in each cell"
        out.append(f"<div>{_esc(count)}</div>")
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


# The world axes each derived mesh of ParallelDims flattens (ParallelDims.mesh); the expert axes live on its
# expert mesh.
_WORLD_AXES_OF = {"dp_shard_cp": ("dp_shard", "cp"), "dp": ("dp_replicate", "dp_shard"),
                  "dp_cp": ("dp_replicate", "dp_shard", "cp")}


def traffic_html(dims: ParallelDims, moved: Sequence[Transfer], topology: Topology | None = None) -> str:
    """The job's mesh once per axis that moves bytes, that axis's groups coloured (:func:`html`), under a caption
    with the bytes one rank moves along it per step, by collective (:func:`fmesh.plan.traffic.traffic`).

    >>> from fmesh.plan.model import Options, preset
    >>> from fmesh.plan.traffic import traffic
    >>> dims = ParallelDims(16, dp_shard=2, tp=8)
    >>> out = traffic_html(dims, traffic(preset("llama3-8b"), Options(recompute="none"), dims), Topology(2, 8))
    >>> out.count("<table"), "tp: " in out
    (3, True)
    """
    by_axis: dict[str, list[Transfer]] = {}
    for transfer in moved:
        by_axis.setdefault(transfer.axis, []).append(transfer)
    out = ['<div class="fmesh-traffic">']
    for axis, transfers in by_axis.items():
        total = sum(t.nbytes for t in transfers)
        parts = ", ".join(f"{t.collective} {format_bytes(t.nbytes)} in {t.calls} calls ({t.purpose})"
                          for t in transfers)
        out.append(f'<p style="{CAPTION_STYLE}"><b>{_esc(axis)}: {_esc(format_bytes(total))} per step</b>: '
                   f"{_esc(parts)}</p>")
        highlight: tuple[str, ...]
        if axis in ("ep", "efsdp", "etp"):
            mesh, highlight = dims.expert_mesh, (axis,)
        else:
            mesh, highlight = dims.world_mesh, _WORLD_AXES_OF.get(axis, (axis,))
        if all(name in WORLD_AXES or mesh is dims.expert_mesh for name in highlight):
            out.append(html(mesh, highlight, topology=topology))
    out.append("</div>")
    return "".join(out)
