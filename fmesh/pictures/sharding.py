"""Which ranks hold which block of a tensor, as a :class:`~fmesh.pictures.grid.Grid` (JAX's
``visualize_array_sharding``), from plain values: each dimension's length and the sizes of the axes that cut it.

Rows cut the next-to-last dimension and columns the last (a 1-D tensor is one row); a tensor of three or more
dimensions is drawn as one 2-D view per block of its leading dimensions, labelled with that block's index
(``[0:2, :, :]``). Each cell names the ranks holding its block; its hover title says which part of the tensor
it is. The grid is *scaled*: each cell as wide and as tall as its block, so uneven blocks look uneven.

A dimension cut by axes of sizes ``(a, b)`` is cut the way DTensor's ``Shard`` cuts it: first into ``a`` pieces,
then each piece into ``b``, each time by ``torch.chunk``'s rule (pieces of ``ceil(length / n)``, the last ones
shorter or empty), which is the even split when the sizes divide the length. :mod:`fmesh.spmd` turns a sharding
or a DTensor into these values (:func:`fmesh.spmd.sharding_text`). Pure: no torch, no mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from fmesh.layout.int_tuple import product
from fmesh.layout.int_tuple import row_major_coordinate as unravel
from fmesh.pictures.grid import ELLIPSIS, GAP, Block, Cell, Grid, Row, group_colour, hosts_label, hosts_note, pick
from fmesh.plan.topology import Topology

__all__ = ["HTML_LIMITS", "TEXT_LIMITS", "Limits", "Split", "holders_text", "sharding_grid"]


@attrs.frozen
class Split:
    """One tensor dimension: its ``length`` and the sizes of the axes that cut it, major first (``ways``).

    >>> Split(7, (2,)).bounds(0), Split(7, (2,)).bounds(1), Split(5, (4,)).bounds(3), Split(8, (2, 2)).bounds(3)
    ((0, 4), (4, 7), (5, 5), (6, 8))
    """

    length: int
    ways: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        """How many pieces the dimension is cut into."""
        return product(self.ways)

    def bounds(self, piece: int) -> tuple[int, int]:
        """``(start, stop)`` of piece ``piece``: cut by each axis in turn, by ``torch.chunk``'s rule."""
        start, stop = 0, self.length
        for digit, size in zip(unravel(piece, self.ways), self.ways, strict=True):
            step = -(-(stop - start) // size)
            start, stop = min(start + digit * step, stop), min(start + (digit + 1) * step, stop)
        return start, stop

    @property
    def even(self) -> bool:
        """Whether every piece has the same length."""
        return self.length % self.count == 0


@attrs.frozen
class Limits:
    """How many views, rows and columns are drawn in full, and how many at each end beyond."""

    views: int
    rows: int
    columns: int

    def keep(self, limit: int) -> int:
        return limit // 2 - (limit >= 8)


TEXT_LIMITS = Limits(views=4, rows=8, columns=8)
HTML_LIMITS = Limits(views=4, rows=16, columns=16)


def holders_text(ranks: Sequence[int]) -> str:
    """A cell's text: the ranks holding its block (the first two and the last of many).

    >>> holders_text([3]), holders_text([0, 2, 4, 6]), holders_text(range(0, 64, 2))
    ('rank 3', 'rank 0,2,4,6', '32 ranks 0,2,…,62')
    """
    ranks = list(ranks)
    if len(ranks) <= 4:
        return "rank " + ",".join(map(str, ranks))
    return f"{len(ranks)} ranks {ranks[0]},{ranks[1]},{ELLIPSIS},{ranks[-1]}"


def _span(bounds: tuple[int, int]) -> str:
    return f"{bounds[0]}:{bounds[1]}"


def _length(bounds: tuple[int, int]) -> int:
    return bounds[1] - bounds[0]


def _layout_line(splits: Sequence[Split]) -> str:
    ndim = len(splits)
    if ndim == 0:
        return "a scalar: one block"
    columns = f"columns: dimension {ndim - 1} ({splits[-1].length} in {splits[-1].count})"
    if ndim == 1:
        return columns
    rows = f"rows: dimension {ndim - 2} ({splits[-2].length} in {splits[-2].count})"
    if ndim == 2:
        return f"{rows}, {columns}"
    views = product(tuple(s.count for s in splits[:-2]))
    lead = "dimension 0" if ndim == 3 else f"dimensions 0..{ndim - 3}"
    return f"{rows}, {columns}; one view per block of {lead} ({views} views)"


def _blocks_line(splits: Sequence[Split]) -> str:
    """Each block's shape when they are even, else how each uneven dimension is cut."""
    if all(split.even for split in splits):
        return f"each block {tuple(split.length // split.count for split in splits)}"
    cuts = []
    for d, split in enumerate(splits):
        if not split.even:
            lengths = [b - a for a, b in map(split.bounds, range(min(split.count, 8)))]
            more = f", {ELLIPSIS}" if split.count > 8 else ""
            cuts.append(f"dimension {d} in {', '.join(map(str, lengths))}{more}")
    return "uneven blocks (torch.chunk's rule): " + "; ".join(cuts)


def sharding_grid(title: str, splits: Sequence[Split], holders: Callable[[tuple[int, ...]], Sequence[int]],
                  hosts: Topology | None, limits: Limits) -> Grid:
    """The picture of a tensor cut by ``splits``, each block held by ``holders(its piece index per dimension)``,
    under ``title``; host lines where the holders' hosts change.

    >>> from fmesh.pictures.text import text
    >>> print(text(sharding_grid("x", [Split(5, (2,))], lambda index: (index[0],), None, TEXT_LIMITS)))
    x
    columns: dimension 0 (5 in 2)
    uneven blocks (torch.chunk's rule): dimension 0 in 3, 2
    <BLANKLINE>
               0:3                  3:5
    +------------------------+----------------+
    |         rank 0         |     rank 1     |
    +------------------------+----------------+
    """
    ndim = len(splits)
    leading, inner = tuple(splits[:-2]), tuple(splits[-2:])
    rows_split = inner[0] if ndim >= 2 else Split(1)
    cols_split = inner[-1] if ndim >= 1 else Split(1)
    counts = tuple(s.count for s in leading)
    views = pick(product(counts), limits.views, limits.keep(limits.views))
    rows = pick(rows_split.count, limits.rows, limits.keep(limits.rows))
    cols = pick(cols_split.count, limits.columns, limits.keep(limits.columns))
    drawn = 0

    def cell(index: tuple[int, ...]) -> Cell:
        nonlocal drawn
        ranks = sorted(holders(index))
        where = ", ".join(_span(split.bounds(piece)) for split, piece in zip(splits, index, strict=True))
        title = f"[{where}] held by rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        on: tuple[int, ...] = ()
        if hosts is not None:
            on = tuple(sorted({hosts.host_of(rank) for rank in ranks}))
            title += f"; host{'s' if len(on) > 1 else ''} {', '.join(map(str, on))}"
        drawn += 1
        return Cell(holders_text(ranks), title, group_colour(drawn - 1), on)

    blocks = []
    for view in views:
        if view is None:
            blocks.append(Block(ELLIPSIS, hidden=product(counts) - sum(v is not None for v in views)))
            continue
        lead = unravel(view, counts)
        drawn_rows = []
        for row in rows:
            cells = tuple(GAP if row is None or col is None
                          else cell(lead + ((row, col) if ndim >= 2 else (col,) if ndim == 1 else ()))
                          for col in cols)
            label = "" if ndim < 2 else ELLIPSIS if row is None else _span(rows_split.bounds(row))
            drawn_rows.append(Row(label, cells, 0 if row is None else _length(rows_split.bounds(row))))
        label = ""
        if ndim >= 3:
            label = "[" + ", ".join([_span(s.bounds(p)) for s, p in zip(leading, lead, strict=True)] + [":", ":"]) + "]"
            if hosts is not None:
                label += hosts_label([h for r in drawn_rows for c in r.cells for h in c.hosts])
        blocks.append(Block(label, tuple(drawn_rows)))
    elided = [f"{sum(p is not None for p in chosen)} of {total} {what}"
              for what, total, chosen in (("views", product(counts), views), ("rows", rows_split.count, rows),
                                          ("columns", cols_split.count, cols)) if None in chosen]
    total = product(tuple(s.count for s in splits))
    summary = (f"summary: {total} blocks; showing {', '.join(elided)}; {ELLIPSIS} marks the rest"
               if elided else None)
    corner = " \\ ".join(f"dim {d}" for d in range(max(ndim - 2, 0), ndim))
    return Grid(
        (title, _layout_line(splits), _blocks_line(splits)) if ndim else (title, _layout_line(splits)), corner,
        tuple(ELLIPSIS if col is None else _span(cols_split.bounds(col)) if ndim else "" for col in cols),
        tuple(blocks), hosts=hosts_note(hosts), summary=summary,
        column_sizes=tuple(0 if col is None else _length(cols_split.bounds(col)) for col in cols))
