"""A :class:`~fmesh.pictures.grid.Grid` drawn as plain text.

A grid of even cells is drawn as aligned columns under their headers (the mesh pictures: ``|`` between two
columns and a line of ``-`` between two rows mark where the host changes). A scaled grid is drawn in boxes as
wide and as tall as the pieces they stand for (the sharding picture: ``‖`` and ``=`` mark where the host
changes). Header lines, block labels and the legend are the same for both.
"""

from __future__ import annotations

from collections.abc import Callable

from fmesh.pictures.grid import ELLIPSIS, RANK_MARK, Block, Cell, Grid, Legend, Row, crosses_hosts, scale

__all__ = ["text"]

# A scaled grid: the largest column reaches this many characters (and a row this many lines) where the smallest
# needs it; the whole grid about this many characters wide and lines tall at most.
BOX_REACH = 24
BOX_WIDTH = 100
ROW_REACH = 4
ROW_LINES = 48


def text(grid: Grid) -> str:
    """The picture ``grid`` as text: its header lines, each block, the legend.

    >>> from fmesh.pictures.grid import Block, Cell, Grid, Row
    >>> cells = (Cell("0", hosts=(0,)), Cell("1", hosts=(1,)))
    >>> print(text(Grid(("two ranks",), "", ("x=0", "x=1"), (Block("", (Row("", cells),)),), hosts="hosts: 2")))
    two ranks
    hosts: 2; | and - mark where the host changes
    <BLANKLINE>
    x=0  x=1
    0   |1
    """
    marks = "‖ and =" if grid.scaled else "| and -"
    header = list(grid.title)
    if grid.legend is not None:
        legend = grid.legend
        header.append(f"{legend.title}: {legend.counts} {legend.scope}, tagged {legend.tags}")
    if grid.marked is not None:
        header.append(f"{RANK_MARK} marks {grid.marked}")
    if grid.hosts is not None:
        header.append(f"{grid.hosts}; {marks} mark where the host changes")
    if grid.summary is not None:
        header.append(grid.summary)
    body = _boxes(grid) if grid.scaled else _columns(grid)
    return "\n".join(header + body + _legend(grid.legend))


def _block_head(block: Block) -> list[str]:
    """The blank line before a block, and its label (or what a left-out run of blocks stands for)."""
    if block.hidden:
        return ["", f"{ELLIPSIS} ({block.hidden} blocks not drawn)"]
    return ["", f"{block.label}:"] if block.label else [""]


def _blocks(grid: Grid, header: str, block_rows: Callable[[Block], list[str]]) -> list[str]:
    """Each block under its label: the column headers (where there are any), then its rows as drawn."""
    body: list[str] = []
    for block in grid.blocks:
        body += _block_head(block)
        if not block.hidden:
            body += ([header] if any(grid.columns) else []) + block_rows(block)
    return body


def _columns(grid: Grid) -> list[str]:
    """Aligned columns of one width; ``|`` and ``-`` where the host changes."""
    rows = [row for block in grid.blocks for row in block.rows]
    width = max([len(label) for label in grid.columns] + [len(cell.text) for row in rows for cell in row.cells])
    label_width = max([len(row.label) for row in rows] + [0])
    lead = " " * label_width + "  " if label_width else ""

    def line(row: Row) -> str:
        out = row.cells[0].text.ljust(width) if row.cells else ""
        for left, right in zip(row.cells, row.cells[1:], strict=False):
            out += (" |" if crosses_hosts(left, right) else "  ") + right.text.ljust(width)
        return ((row.label.ljust(label_width) + "  " if label_width else "") + out).rstrip()

    def block_rows(block: Block) -> list[str]:
        out = []
        for above, row in zip((None, *block.rows), block.rows, strict=False):
            if above is not None and any(map(crosses_hosts, above.cells, row.cells)):
                out.append("-" * ((label_width + 2 if label_width else 0) + len(row.cells) * (width + 2) - 2))
            out.append(line(row))
        return out

    return _blocks(grid, (lead + "  ".join(label.ljust(width) for label in grid.columns)).rstrip(), block_rows)


def _boxes(grid: Grid) -> list[str]:
    """One box per cell, as wide and as tall as its piece; ``‖`` and ``=`` where the host changes."""
    rows = [row for block in grid.blocks for row in block.rows]
    # One least width for every drawn column (a gap's is its ellipsis'), so that only the sizes make them differ.
    widest = max([len(label) for label in grid.columns] + [len(cell.text) for row in rows for cell in row.cells]) + 2
    least = [3 if label == ELLIPSIS else widest for label in grid.columns]
    widths = scale(grid.column_sizes or (), least, BOX_REACH, BOX_WIDTH)
    heights = dict(zip(map(id, rows), scale([row.size for row in rows], [1] * len(rows), ROW_REACH, ROW_LINES),
                       strict=True))
    label_width = max([len(row.label) for row in rows] + [0])
    lead = " " * (label_width + 2) if label_width else ""

    def rule(above: tuple[Cell, ...] | None, below: tuple[Cell, ...] | None) -> str:
        parts = ["+"]
        for c, width in enumerate(widths):
            crossing = above is not None and below is not None and crosses_hosts(above[c], below[c])
            parts.append(("=" if crossing else "-") * width + "+")
        return lead + "".join(parts)

    def lines(row: Row) -> list[str]:
        seps = ["|", *("‖" if crosses_hosts(a, b) else "|" for a, b in zip(row.cells, row.cells[1:], strict=False)),
                "|"]
        height = heights[id(row)]
        out = []
        for index in range(height):
            middle = index == (height - 1) // 2
            label = row.label.ljust(label_width) + "  " if label_width and middle else lead
            cells = [(cell.text if middle else "").center(width) for cell, width in zip(row.cells, widths, strict=True)]
            out.append((label + "".join(sep + cell for sep, cell in zip(seps, cells, strict=False)) + seps[-1])
                       .rstrip())
        return out

    def block_rows(block: Block) -> list[str]:
        out = []
        for above, row in zip((None, *block.rows), block.rows, strict=False):
            out.append(rule(above.cells if above is not None else None, row.cells))
            out += lines(row)
        return [*out, rule(None, None)]

    header = lead + " " + " ".join(label.center(width) for label, width in zip(grid.columns, widths, strict=True))
    return _blocks(grid, header.rstrip(), block_rows)


def _legend(legend: Legend | None) -> list[str]:
    """The legend's lines: each listed group's tag and what it is."""
    if legend is None:
        return []
    out = ["", f"legend ({legend.title}):"]
    tag_width = max(len(entry.tag) for entry in legend.entries)
    for index, entry in enumerate(legend.entries):
        if legend.left_out and index == len(legend.entries) - 4:
            out.append(f"  {ELLIPSIS} {legend.left_out} more drawn groups not listed")
        out.append(f"  {entry.tag.ljust(tag_width)}  {entry.text}")
    if legend.total is not None:
        out.append(f"  ({legend.total} groups in all; only those drawn are listed)")
    return out
