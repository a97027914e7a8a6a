"""Pictures of a mesh: a text grid (:func:`render`) and an HTML table (:func:`html`), one :class:`Grid` each.

Only the cells that are drawn are computed (each by digit arithmetic on the mesh's layouts), so a mesh of a
million ranks is summarised in milliseconds.

What is drawn is one *instance* of the mesh (the one holding ``rank``; by default the first one, whose base slot
is ``mesh.offset`` — the instance of the lowest covered rank when the rank map is the identity):

* 1 axis: one row; 2 axes: rows are the first axis, columns the second;
* 3 or more axes: one 2-D block (rows: the next-to-last axis, columns: the last) per coordinate of the leading
  axes, labelled with those coordinates. For more than 3 axes the header says so (the leading axes are
  enumerated row-major).

The groups along ``highlight`` (one axis or several, taken together like ``mesh.group(rank, highlight)``) are
tagged with letters ``a``, ``b``, ..., ``z``, ``aa``, ... in the row-major order of the other axes' coordinates,
and the legend lists each group's ranks. In HTML each drawn group has its own colour (:func:`group_colour`: hues
a golden angle apart, in group order; no randomness, no repeats).

``rank=`` also marks that rank's cell (``5*``, and a bold outline in HTML). With ``gpus_per_node=`` (block order)
or a ``topology=`` the pictures show where the host changes: ``|`` between columns and a ``-`` line between rows in
text, thick lines in HTML, and the host in each HTML cell's title.

Large instances are summarised: the first and last few coordinates of each long axis are drawn with ``…``
standing for the rest, and the header says what was left out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import attrs

from fmesh.layout import flat
from fmesh.layout.flat import Modes
from fmesh.layout.int_tuple import product, row_major_index
from fmesh.layout.int_tuple import row_major_coordinate as unravel  # the row-major helpers: int_tuple's
from fmesh.mesh.mesh import Mesh
from fmesh.pictures.grid import (
    ELLIPSIS,
    GAP,
    RANK_MARK,
    Block,
    Cell,
    Grid,
    Legend,
    LegendEntry,
    Pick,
    Row,
    group_colour,
    hosts_label,
    hosts_note,
    pick,
    picture_hosts,
    tag,
)
from fmesh.pictures.markup import markup
from fmesh.pictures.text import text
from fmesh.plan.topology import Topology

__all__ = ["html", "render", "show_in_notebooks"]

HighlightArg = str | Sequence[str] | None

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


def _axis_offset(modes: Modes, coordinate: int) -> int:
    offset = 0
    for size, stride in reversed(modes):
        coordinate, digit = divmod(coordinate, size)
        offset += digit * stride
    return offset


@attrs.frozen
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
        return row_major_index([coordinate[i] for i in self.others], [self.sizes[i] for i in self.others])

    def group_label(self, group: int) -> str:
        digits = unravel(group, [self.sizes[i] for i in self.others])
        return ", ".join(f"{self.names[i]}={d}" for i, d in zip(self.others, digits, strict=True)) or "(whole instance)"

    def group_ranks(self, group: int, limit: int) -> list[int | None]:
        """The group's ranks, row-major along the highlighted axes (as ``mesh.group``), elided past ``limit``."""
        fixed = unravel(group, [self.sizes[i] for i in self.others])
        hsizes = [self.sizes[i] for i in self.highlight]
        ranks: list[int | None] = []
        coordinate = [0] * len(self.sizes)
        for i, digit in zip(self.others, fixed, strict=True):
            coordinate[i] = digit
        for index in pick(product(tuple(hsizes)), limit, limit // 2 - 2):
            if index is None:
                ranks.append(None)
                continue
            for i, digit in zip(self.highlight, unravel(index, hsizes), strict=True):
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


@attrs.frozen
class _View:
    """Which coordinates are drawn: blocks (leading axes), rows, columns; and why some were left out."""

    block_sizes: tuple[int, ...]
    blocks: Pick
    rows: Pick
    cols: Pick
    why: str  # the limit a summary names (text), or "" (HTML)

    @staticmethod
    def build(sizes: tuple[int, ...], limits: dict[str, int], keep: dict[str, int], why: str) -> _View:
        ndim = len(sizes)
        block_sizes = sizes[:-2] if ndim >= 3 else ()
        row_size = sizes[-2] if ndim >= 2 else 1
        col_size = sizes[-1] if ndim >= 1 else 1
        blocks = pick(product(block_sizes), limits["block"], keep["block"])
        return _View(block_sizes, blocks, pick(row_size, limits["row"], keep["row"]),
                     pick(col_size, limits["col"], keep["col"]), why)

    def coordinate(self, block: int, row: int, col: int, ndim: int) -> tuple[int, ...]:
        inner = (row, col) if ndim >= 2 else (col,) if ndim == 1 else ()
        return unravel(block, self.block_sizes) + inner

    def elided(self, sizes: tuple[int, ...]) -> list[str]:
        """Human-readable list of what the ellipses stand for."""
        shown = [
            ("blocks", product(self.block_sizes), self.blocks),
            ("rows", sizes[-2] if len(sizes) >= 2 else 1, self.rows),
            ("columns", sizes[-1] if sizes else 1, self.cols),
        ]
        return [
            f"{sum(1 for p in chosen if p is not None)} of {total} {what}"
            for what, total, chosen in shown
            if None in chosen
        ]


def _text_view(sizes: tuple[int, ...]) -> _View:
    """Everything up to 512 cells and 32 columns; beyond, the ends of each long axis."""
    if product(sizes) <= TEXT_MAX_CELLS and (not sizes or sizes[-1] <= TEXT_MAX_COLUMNS):
        everything = {"block": 1 << 62, "row": 1 << 62, "col": 1 << 62}
        return _View.build(sizes, everything, _TEXT_KEEP, "")
    limits = {"block": 2 * _TEXT_KEEP["block"], "row": 2 * _TEXT_KEEP["row"], "col": 2 * _TEXT_KEEP["col"]}
    return _View.build(sizes, limits, _TEXT_KEEP, f" (more than {TEXT_MAX_CELLS} cells or {TEXT_MAX_COLUMNS} columns)")


def _html_view(sizes: tuple[int, ...]) -> _View:
    """At most about 32 x 32 cells, in at most 4 blocks."""
    shown_blocks = min(product(sizes[:-2]) if len(sizes) >= 3 else 1, HTML_MAX_BLOCKS + 1)
    row_limit = max(4, HTML_MAX_ROWS // shown_blocks)
    limits = {"block": HTML_MAX_BLOCKS, "row": row_limit, "col": HTML_MAX_COLUMNS}
    keep = {"block": HTML_MAX_BLOCKS // 2, "row": row_limit // 2, "col": HTML_MAX_COLUMNS // 2}
    return _View.build(sizes, limits, keep, "")


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


def _title(mesh: Mesh, inst: _Instance, rank: int | None) -> tuple[str, ...]:
    """The mesh's repr, which instance is drawn (when there are several) and how its axes are laid out."""
    if mesh.num_instances == 1:
        return repr(mesh), _layout_line(mesh)
    holding = f"holding rank {rank}" if rank is not None else "the first; pass rank= to choose another"
    instance = f"instance {inst.number} of {mesh.num_instances}, numbered from 0 ({holding})"
    return repr(mesh), instance, _layout_line(mesh)


def _legend(inst: _Instance, drawn: list[int], colours: dict[int, str]) -> Legend | None:
    """The groups along the highlighted axes: how many, and those drawn (capped), each with its ranks."""
    if not inst.highlight:
        return None
    groups = sorted(set(drawn))
    listed, left_out = groups, 0
    if len(groups) > LEGEND_MAX_GROUPS:
        listed, left_out = [*groups[:LEGEND_MAX_GROUPS - 4], *groups[-4:]], len(groups) - LEGEND_MAX_GROUPS
    count = inst.num_groups
    noun = "group" if count == 1 else "groups"
    ranks = "rank" if inst.group_size == 1 else "ranks"
    entries = tuple(
        LegendEntry(tag(group), f"{inst.group_label(group)}: "
                    + ", ".join(ELLIPSIS if r is None else str(r) for r in inst.group_ranks(group, LEGEND_MAX_RANKS)),
                    colours[group])
        for group in listed)
    return Legend(f"groups along {', '.join(inst.names[i] for i in inst.highlight)}",
                  f"{count} {noun} of {inst.group_size} {ranks}", "in this instance",
                  "a" if count == 1 else f"{tag(0)}..{tag(count - 1)}", entries, left_out,
                  count if count > len(groups) else None)


def _grid(mesh: Mesh, inst: _Instance, view: _View, rank: int | None, hosts: Topology | None) -> Grid:
    """The drawn part of one instance: a cell per drawn coordinate, in blocks, with the groups' legend."""
    names, ndim = mesh.axis_names, mesh.ndim
    along = ", ".join(names[i] for i in inst.highlight)
    coordinates = [view.coordinate(block, row, col, ndim) for block in view.blocks if block is not None
                   for row in view.rows if row is not None for col in view.cols if col is not None]
    drawn = [inst.group_of(coordinate) for coordinate in coordinates] if inst.highlight else []
    colours = {group: group_colour(i) for i, group in enumerate(sorted(set(drawn)))}

    def cell(coordinate: tuple[int, ...]) -> Cell:
        cell_rank = inst.rank(coordinate)
        title = f"rank {cell_rank}: " + (", ".join(f"{n}={d}" for n, d in zip(names, coordinate, strict=True))
                                         or "no axes")
        shown = str(cell_rank) + (RANK_MARK if cell_rank == rank else "")
        colour = None
        if inst.highlight:
            group = inst.group_of(coordinate)
            colour = colours[group]
            title += f"; group {tag(group)} along {along}"
            shown += "·" + tag(group)
        on: tuple[int, ...] = ()
        if hosts is not None:
            on = (hosts.host_of(cell_rank),)
            title += f"; host {on[0]}"
        return Cell(shown, title, colour, on, marked=cell_rank == rank)

    blocks = []
    for block in view.blocks:
        if block is None:
            blocks.append(Block(ELLIPSIS, hidden=product(view.block_sizes) - sum(b is not None for b in view.blocks)))
            continue
        rows = tuple(
            Row("" if ndim < 2 else ELLIPSIS if row is None else f"{names[-2]}={row}",
                tuple(GAP if row is None or col is None else cell(view.coordinate(block, row, col, ndim))
                      for col in view.cols))
            for row in view.rows)
        label = ""
        if ndim >= 3:
            label = ", ".join(f"{n}={d}" for n, d in zip(names, unravel(block, view.block_sizes), strict=False))
            if hosts is not None:
                label += hosts_label([h for row_ in rows for c in row_.cells for h in c.hosts])
        blocks.append(Block(label, rows))
    elided = view.elided(mesh.axis_sizes)
    summary = (f"summary: {mesh.size} ranks per instance{view.why}; showing {', '.join(elided)}; {ELLIPSIS} marks "
               "the rest") if elided else None
    return Grid(
        _title(mesh, inst, rank),
        f"{names[-2]} \\ {names[-1]}" if ndim >= 2 else names[-1] if ndim == 1 else "",
        tuple(ELLIPSIS if c is None else f"{names[-1]}={c}" if ndim else "" for c in view.cols),
        tuple(blocks), None if rank is None else f"rank {rank}", hosts_note(hosts), summary,
        _legend(inst, drawn, colours))


def _picture(mesh: Mesh, highlight: HighlightArg, rank: int | None, hosts: tuple[Topology | None, int | None],
             view: Callable[[tuple[int, ...]], _View]) -> Grid:
    """The grid of the instance of ``mesh`` holding ``rank``, as much of it as ``view`` draws, with the host lines
    of ``hosts`` (a topology or a number of GPUs per node), each argument checked in that order."""
    inst = _instance(mesh, highlight, rank)
    return _grid(mesh, inst, view(mesh.axis_sizes), rank, picture_hosts(mesh.world_size, *hosts))


def render(mesh: Mesh, highlight: HighlightArg = None, rank: int | None = None, *, gpus_per_node: int | None = None,
           topology: Topology | None = None) -> str:
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
    return text(_picture(mesh, highlight, rank, (topology, gpus_per_node), _text_view))


def html(mesh: Mesh, highlight: HighlightArg = None, rank: int | None = None, *, gpus_per_node: int | None = None,
         topology: Topology | None = None) -> str:
    """An HTML table of one instance of ``mesh``, one colour and one tag per group along ``highlight``.

    ``highlight`` defaults to the last axis. Each cell shows its rank and its group's tag (``5·b``: readable
    without colour); ``rank``'s own cell is outlined and marked ``5*``; with ``gpus_per_node`` (block order) or a
    ``topology``, thick lines mark where the host changes. Each cell's ``title`` (shown on
    hover) names its rank, coordinates, group and host; a legend follows, and the
    caption above the table (as wide as the page, not the table) is the mesh's repr.
    At most about 32 x 32 cells are drawn; larger instances are summarised with
    ``…`` rows and columns and a note of what was left out. Everything is escaped, and the result is well-formed XML.

    >>> import fmesh
    >>> out = fmesh.pictures.html(fmesh.make_mesh((2, 2), ("dp", "tp")))
    >>> out.startswith("<div"), 'title="rank 3: dp=1, tp=1; group b along tp"' in out, ">3·b</td>" in out
    (True, True, True)
    """
    if highlight is None and isinstance(mesh, Mesh) and mesh.ndim:
        highlight = mesh.axis_names[-1]
    return markup(_picture(mesh, highlight, rank, (topology, gpus_per_node), _html_view))


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
