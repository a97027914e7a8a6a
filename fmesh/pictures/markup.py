"""A :class:`~fmesh.pictures.grid.Grid` drawn as an HTML table (for notebooks and the docs).

Cells carry only their colours, inline (notebook viewers drop ``<style>``), and thick borders where the host
changes; the table's own attributes give every other border and the padding, at no cost per cell. The caption
(the grid's title) is a block of its own above the table, as wide as the page; the summary and the legend follow
the table. A scaled grid's cells are as wide and as tall as the pieces they stand for. Everything is escaped, and
the result is well-formed XML.
"""

from __future__ import annotations

import html as _html

from fmesh.pictures.grid import ELLIPSIS, Block, Cell, Grid, Legend, Row, crosses_hosts, scale

__all__ = ["CAPTION_STYLE", "markup"]

CAPTION_STYLE = "text-align:left;padding-bottom:4px;font-weight:bold"
"""Style of the line above the table that names what is drawn (a block as wide as the notebook cell)."""
_CELL = "color:#000;background:"
_GAP = "color:#666;text-align:center"
_MARKED = "font-weight:bold;outline:3px solid #000;outline-offset:-3px"
_HOST_LINE = "3px solid #000"
_TABLE = 'border="1" cellpadding="3" cellspacing="0" style="border-collapse:collapse;margin-bottom:6px"'

# A scaled grid, in pixels: each cell at least this wide and tall; the largest column and row reach this far
# where the smallest needs it; the whole table about this wide and tall at most.
CELL_WIDTH, COLUMN_REACH, TABLE_WIDTH = 56, 160, 640
CELL_HEIGHT, ROW_REACH, TABLE_HEIGHT = 28, 80, 480


def _esc(text: object) -> str:
    return _html.escape(str(text), quote=True)


def markup(grid: Grid, kind: str = "fmesh-mesh") -> str:
    """The picture ``grid`` as an HTML ``<div>`` of class ``kind``: caption, table, summary, legend.

    >>> from fmesh.pictures.grid import Block, Cell, Grid, Row
    >>> markup(Grid(("one rank",), "", ("",), (Block("", (Row("", (Cell("0", title="rank 0"),)),)),)))[-87:]
    '<td style="color:#000;background:#fff" title="rank 0">0</td></tr></tbody></table></div>'
    """
    caption = list(grid.title)
    if grid.marked is not None:
        caption.append(f"{grid.marked} is outlined")
    if grid.hosts is not None:
        caption.append(f"{grid.hosts}; thick lines mark where the host changes")
    out = [f'<div class="{_esc(kind)}" style="font-family:monospace;font-size:12px">',
           # A block of its own above the table, not a <caption>: a caption is laid out at the table's width, so
           # a narrow table (one axis of 2) squeezed the description into a column of words.
           f'<div class="fmesh-caption" style="{CAPTION_STYLE}">{_esc(" — ".join(caption))}</div>',
           f"<table {_TABLE}>", f"<thead><tr><th>{_esc(grid.corner)}</th>"]
    widths: tuple[int | None, ...] = (None,) * len(grid.columns)
    rows = [row for block in grid.blocks for row in block.rows]
    heights: tuple[int | None, ...] = (None,) * len(rows)
    if grid.column_sizes is not None:
        widths = scale(grid.column_sizes, [CELL_WIDTH] * len(widths), COLUMN_REACH, TABLE_WIDTH)
        heights = scale([row.size for row in rows], [CELL_HEIGHT] * len(rows), ROW_REACH, TABLE_HEIGHT)
    out += [f"<th>{_esc(label)}</th>" for label in grid.columns]
    out.append("</tr></thead><tbody>")
    height_of = dict(zip(map(id, rows), heights, strict=True))
    for block in grid.blocks:
        out += _block(grid, block, widths, height_of)
    out.append("</tbody></table>")
    if grid.summary is not None:
        out.append(f"<div>{_esc(grid.summary)}</div>")
    out += _legend(grid.legend)
    out.append("</div>")
    return "".join(out)


def _block(grid: Grid, block: Block, widths: tuple[int | None, ...], height_of: dict[int, int | None]) -> list[str]:
    out = []
    if block.label or block.hidden:
        label = f"{ELLIPSIS} blocks elided" if block.hidden else block.label
        out.append(f'<tr><th colspan="{len(grid.columns) + 1}" style="text-align:left">{_esc(label)}</th></tr>')
    above: Row | None = None
    for row in block.rows:
        out.append(f"<tr><th>{_esc(row.label)}</th>")
        for index, cell in enumerate(row.cells):
            left = row.cells[index - 1] if index else None
            out.append(_cell(cell, left, above.cells[index] if above is not None else None,
                             widths[index], height_of[id(row)]))
        out.append("</tr>")
        above = row
    return out


def _cell(cell: Cell, left: Cell | None, above: Cell | None, width: int | None, height: int | None) -> str:
    size = f";text-align:center;width:{width}px;height:{height}px" if width is not None else ""
    if cell.gap:
        return f'<td style="{_GAP}{size}">{ELLIPSIS}</td>'
    style = _CELL + (cell.colour or "#fff")
    if cell.marked:
        style += f";{_MARKED}"
    if left is not None and crosses_hosts(left, cell):
        style += f";border-left:{_HOST_LINE}"
    if above is not None and crosses_hosts(above, cell):
        style += f";border-top:{_HOST_LINE}"
    return f'<td style="{style}{size}" title="{_esc(cell.title)}">{_esc(cell.text)}</td>'


def _legend(legend: Legend | None) -> list[str]:
    """How many groups there are, and the listed ones, each with its colour."""
    if legend is None:
        return []
    out = [f"<div>{_esc(f'{legend.title}: {legend.counts}, tagged in each cell')}</div>",
           '<ul style="list-style:none;padding-left:0;margin:2px 0">']
    for index, entry in enumerate(legend.entries):
        if legend.left_out and index == len(legend.entries) - 4:
            out.append(f"<li>{_esc(f'{ELLIPSIS} {legend.left_out} more drawn groups not listed')}</li>")
        out.append(f'<li><span style="background:{entry.colour};border:1px solid #888;padding:0 6px">&#160;</span> '
                   f"{_esc(f'{entry.tag}  {entry.text}')}</li>")
    out.append("</ul>")
    if legend.total is not None:
        out.append(f"<div>{_esc(f'({legend.total} groups in all; only those drawn are listed)')}</div>")
    return out
