"""The one model every picture is drawn from: a grid of cells in blocks, under row and column headers.

A :class:`Grid` says *what* is drawn (cells with their text, colour, hover title and hosts; the rows and columns
they stand in; the blocks a picture of three or more dimensions is cut into; a legend) and nothing of *how*:
:func:`fmesh.pictures.text.text` draws it as plain text and :func:`fmesh.pictures.markup.markup` as an HTML
table, each reading the same cells, so the two can never disagree about what a picture holds. Where neighbouring
cells are on different hosts both draw a line (text: ``|`` and ``-``, or ``‖`` and ``=`` in a boxed grid; HTML:
thick borders); the rule for "different hosts" is :func:`crosses_hosts`, here once.

A grid whose columns and rows have *extents* (:attr:`Grid.column_sizes`, :attr:`Row.size`) is *scaled*: each
cell is drawn as large as the piece it stands for (the sharding picture: a block of 3 rows is taller than one of
2). Pure values: no torch, no mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from fmesh.plan.topology import Topology

__all__ = ["ELLIPSIS", "GOLDEN_ANGLE", "RANK_MARK", "Block", "Cell", "Grid", "Legend", "LegendEntry", "Row",
           "crosses_hosts", "group_colour", "hosts_label", "hosts_note", "pick", "picture_hosts", "scale", "tag"]

ELLIPSIS = "…"
"""Stands for the coordinates, cells or blocks a summarised picture leaves out."""

RANK_MARK = "*"
"""Suffix of the cell of the rank passed with ``rank=`` (readable without colour)."""

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


def tag(index: int) -> str:
    """Spreadsheet-style letters naming the ``index``-th group.

    >>> tag(0), tag(25), tag(26)
    ('a', 'z', 'aa')
    """
    letters = ""
    index += 1
    while index:
        index, digit = divmod(index - 1, 26)
        letters = chr(ord("a") + digit) + letters
    return letters


Pick = list[int | None]
"""The coordinates drawn along one dimension; ``None`` stands for an ellipsis."""


def pick(size: int, limit: int, keep: int) -> Pick:
    """All of ``range(size)`` when ``size <= limit``, else the first and last ``keep`` around ``None``.

    >>> pick(3, 4, 1), pick(9, 4, 2)
    ([0, 1, 2], [0, 1, None, 7, 8])
    """
    if size <= limit or size <= 2 * keep + 1:
        return list(range(size))
    return [*range(keep), None, *range(size - keep, size)]


@attrs.frozen
class Cell:
    """One drawn cell: its ``text`` (both media), the ``title`` HTML shows on hover, its background ``colour``
    (``None``: white), the ``hosts`` it lies on (empty when hosts are not drawn), whether it is ``marked`` (the
    rank asked about: outlined in HTML) and whether it is a ``gap`` standing for cells left out."""

    text: str
    title: str = ""
    colour: str | None = None
    hosts: tuple[int, ...] = ()
    marked: bool = False
    gap: bool = False


GAP = Cell(ELLIPSIS, gap=True)
"""The cell drawn where a summary leaves cells out."""


@attrs.frozen
class Row:
    """A row of cells under its ``label``; ``size`` is its extent in a scaled grid (rows of a tensor)."""

    label: str
    cells: tuple[Cell, ...]
    size: int = 1


@attrs.frozen
class Block:
    """One 2-D view of a picture of three or more dimensions, under its ``label`` (empty for a picture's only
    block); a block with ``hidden`` > 0 stands for that many blocks left out and has no rows."""

    label: str
    rows: tuple[Row, ...] = ()
    hidden: int = 0


@attrs.frozen
class LegendEntry:
    """One listed group: its ``tag``, what it is (``dp=0: 0, 1, 2``) and its ``colour``."""

    tag: str
    text: str
    colour: str


@attrs.frozen
class Legend:
    """The groups a picture tags: ``title`` (``groups along tp``), ``counts`` (``2 groups of 3 ranks``),
    ``scope`` (where they were counted), ``tags`` (``a..b``), the listed ``entries``, how many drawn groups
    were ``left_out`` of the list (before its last four), and the ``total`` when not every group is drawn."""

    title: str
    counts: str
    scope: str
    tags: str
    entries: tuple[LegendEntry, ...]
    left_out: int = 0
    total: int | None = None


@attrs.frozen
class Grid:
    """What a picture draws: ``title`` lines (the first names the value), the ``corner`` and ``columns``
    headers, the ``blocks``, the name of the ``marked`` cell's rank, the ``hosts`` the lines follow, the
    ``summary`` of what was left out, the ``legend``, and each column's extent when the grid is scaled."""

    title: tuple[str, ...]
    corner: str
    columns: tuple[str, ...]
    blocks: tuple[Block, ...]
    marked: str | None = None
    hosts: str | None = None
    summary: str | None = None
    legend: Legend | None = None
    column_sizes: tuple[int, ...] | None = None

    @property
    def scaled(self) -> bool:
        """Whether each cell is drawn as large as the piece it stands for."""
        return self.column_sizes is not None


def crosses_hosts(a: Cell, b: Cell) -> bool:
    """Whether a host line runs between neighbouring cells: both are drawn with hosts, and their hosts differ.

    >>> crosses_hosts(Cell("0", hosts=(0,)), Cell("8", hosts=(1,))), crosses_hosts(Cell("0", hosts=(0,)), GAP)
    (True, False)
    """
    return bool(a.hosts) and bool(b.hosts) and a.hosts != b.hosts


def picture_hosts(world_size: int, topology: Topology | None, gpus_per_node: int | None) -> Topology | None:
    """The topology whose host boundaries a picture of a ``world_size`` world shows; ``None`` for none.

    >>> picture_hosts(16, None, 8)
    Topology(hosts=2, ranks_per_host=8, block)
    >>> picture_hosts(12, None, 8)
    Traceback (most recent call last):
    ...
    ValueError: gpus_per_node=8 does not divide the mesh's world size 12
    """
    if topology is not None and gpus_per_node is not None:
        raise ValueError(f"pass topology= or gpus_per_node=, not both (got {topology!r} and {gpus_per_node!r})")
    if gpus_per_node is not None:
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"expected gpus_per_node as a positive int, but got {gpus_per_node!r}")
        if world_size % gpus_per_node:
            raise ValueError(f"gpus_per_node={gpus_per_node} does not divide the mesh's world size {world_size}")
        return Topology(world_size // gpus_per_node, gpus_per_node)
    if topology is not None:
        if not isinstance(topology, Topology):
            raise TypeError(f"expected topology as an fmesh.Topology, but got {type(topology).__name__}: {topology!r}")
        if topology.world_size != world_size:
            raise ValueError(
                f"topology {topology!r} has {topology.world_size} ranks, but the mesh's world has {world_size}"
            )
    return topology


def hosts_note(hosts: Topology | None) -> str | None:
    """What a picture's host lines follow (``2 hosts of 8 ranks (block order)``); ``None`` without hosts."""
    if hosts is None:
        return None
    order = hosts.rank_order if isinstance(hosts.rank_order, str) else "custom"
    return f"hosts: {hosts.hosts} hosts of {hosts.ranks_per_host} ranks ({order} order)"


def hosts_label(found: Sequence[int]) -> str:
    """`` (host 0)`` or `` (hosts 0, 1)``: the hosts of a block's cells, for its label (blocks are drawn apart, so
    the host changes between blocks are said in their labels).

    >>> hosts_label([3]), hosts_label([0, 1, 2, 3, 4, 5])
    (' (host 3)', ' (hosts 0, 1, …, 5)')
    """
    found = sorted(set(found))
    shown = ", ".join(map(str, found)) if len(found) <= 4 else f"{found[0]}, {found[1]}, {ELLIPSIS}, {found[-1]}"
    return f" (host {shown})" if len(found) == 1 else f" (hosts {shown})"


def scale(sizes: Sequence[int], least: Sequence[int], reach: int, total: int) -> tuple[int, ...]:
    """Lengths (characters, lines or pixels) proportional to ``sizes``: each at least its ``least``; the largest
    at ``reach`` or more where the smallest needs it, all together about ``total`` at most. Equal sizes all get
    their ``least``, so that an even grid stays compact; a size 0 (an empty piece, a gap) gets its ``least``.

    >>> scale([3, 2], [1, 1], 4, 48), scale([2, 2], [8, 8], 24, 100), scale([4, 3], [8, 8], 24, 100)
    ((4, 3), (8, 8), (24, 18))
    """
    drawn = [size for size in sizes if size > 0]
    if len(set(drawn)) <= 1:
        return tuple(least)
    unit = max(max(low / size for size, low in zip(sizes, least, strict=True) if size > 0), reach / max(drawn))
    unit = min(unit, total / sum(drawn))
    return tuple(max(low, round(unit * size)) for size, low in zip(sizes, least, strict=True))
