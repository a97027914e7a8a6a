"""A picture of a tensor's sharding (JAX's ``visualize_array_sharding``): which ranks hold which block.

For a 1-D or 2-D global shape, one cell per block (rows split dimension 0, columns dimension 1), naming the ranks
that hold it; with a topology (or ``gpus_per_node``), where the host of neighbouring blocks changes the line
between them is doubled (text) or thick (HTML), as in the mesh pictures of :mod:`fmesh.rendering`. Pure: no torch.
"""

from __future__ import annotations

import html as _html
from collections.abc import Sequence

from fmesh.plan.topology import Topology
from fmesh.rendering import group_colour
from fmesh.spmd.spec import Sharding


def _grid(sharding: Sharding, shape: Sequence[int]) -> list[list[tuple[int, ...]]]:
    """The holders of each block, row by row."""
    if len(shape) not in (1, 2):
        raise ValueError(f"expected a 1-D or 2-D shape to draw, but got {tuple(shape)!r}")
    shape2 = (1, *shape) if len(shape) == 1 else tuple(shape)
    holders = sharding.holders(shape)
    local = sharding.local_shape(shape)
    local2 = (1, *local) if len(local) == 1 else local
    rows, cols = shape2[0] // local2[0], shape2[1] // local2[1]
    grid: list[list[tuple[int, ...]]] = [[() for _ in range(cols)] for _ in range(rows)]
    for block, ranks in holders.items():
        block2 = ((0, 1), *block) if len(block) == 1 else block
        grid[block2[0][0] // local2[0]][block2[1][0] // local2[1]] = ranks
    return grid


def _host(topology: Topology | None, ranks: tuple[int, ...]) -> int | None:
    return None if topology is None or not ranks else topology.host_of(ranks[0])


def _hosts(sharding: Sharding, topology: Topology | None, gpus_per_node: int | None) -> Topology | None:
    if gpus_per_node is not None:
        if sharding.mesh.world_size % gpus_per_node:
            raise ValueError(f"gpus_per_node={gpus_per_node} does not divide the world size "
                             f"{sharding.mesh.world_size}")
        return Topology(sharding.mesh.world_size // gpus_per_node, gpus_per_node)
    return topology


def _title(sharding: Sharding, shape: Sequence[int]) -> str:
    sizes = ", ".join(f"{n}={s}" for n, s in sharding.mesh.shape.items())
    return f"{sharding.spec!r} of {tuple(shape)} on ({sizes}): each block {sharding.local_shape(shape)}"


def sharding_text(sharding: Sharding, shape: Sequence[int], topology: Topology | None = None,
                  gpus_per_node: int | None = None) -> str:
    """Which ranks hold which block of a tensor of ``shape``, as a text grid.

    >>> import fmesh
    >>> from fmesh.spmd import P
    >>> print(sharding_text(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P("tp")), (4, 6), gpus_per_node=2))
    P('tp') of (4, 6) on (dp=2, tp=2): each block (2, 6)
    +----------+
    | rank 0,2 |
    +----------+
    | rank 1,3 |
    +----------+
    hosts: || and = mark where the host changes
    """
    hosts = _hosts(sharding, topology, gpus_per_node)
    grid = _grid(sharding, shape)
    cells = [[f"rank {','.join(map(str, ranks))}" for ranks in row] for row in grid]
    width = max(len(c) for row in cells for c in row) + 2
    lines = [_title(sharding, shape)]
    for r, row in enumerate(cells):
        above = grid[r - 1] if r else None
        rule = "+"
        for c in range(len(row)):
            changes = above is not None and _host(hosts, above[c]) != _host(hosts, grid[r][c])
            rule += ("=" if changes else "-") * width + "+"
        lines.append(rule)
        line = "|"
        for c, text in enumerate(row):
            line += f" {text}".ljust(width)
            after = c + 1 < len(row) and _host(hosts, grid[r][c]) != _host(hosts, grid[r][c + 1])
            line += "||" if after else "|"
        lines.append(line)
    lines.append("+" + ("-" * width + "+") * len(cells[0]))
    if hosts is not None:
        lines.append("hosts: || and = mark where the host changes")
    return "\n".join(lines)


def sharding_html(sharding: Sharding, shape: Sequence[int], topology: Topology | None = None,
                  gpus_per_node: int | None = None) -> str:
    """The same picture as notebook HTML: one coloured cell per block (a colour per block), thick host lines.

    >>> import fmesh
    >>> from fmesh.spmd import P
    >>> "rank 0,2" in sharding_html(Sharding(fmesh.make_mesh((2, 2), ("dp", "tp")), P("tp")), (4, 6))
    True
    """
    hosts = _hosts(sharding, topology, gpus_per_node)
    grid = _grid(sharding, shape)
    rows = []
    for r, row in enumerate(grid):
        cells = []
        for c, ranks in enumerate(row):
            here = _host(hosts, ranks)
            top = "3px" if r and _host(hosts, grid[r - 1][c]) != here else "1px"
            left = "3px" if c and _host(hosts, row[c - 1]) != here else "1px"
            colour = group_colour(r * len(row) + c)
            cells.append(f'<td style="background:{colour};border:1px solid #333;border-top-width:{top};'
                         f'border-left-width:{left};padding:8px 14px;text-align:center;font-family:monospace">'
                         f"rank {','.join(map(str, ranks))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = "<div>thick lines mark where the host changes</div>" if hosts is not None else ""
    return (f'<div><div style="font-family:monospace">{_html.escape(_title(sharding, shape))}</div>'
            f'<table style="border-collapse:collapse">{"".join(rows)}</table>{note}</div>')
