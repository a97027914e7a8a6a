"""The one text table every CLI report prints: aligned columns two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table"]

def format_table(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """``rows`` as lines of aligned columns two spaces apart; a column with ``right`` set is right-aligned.

    >>> format_table([("mesh", "size"), ("tp", "8")], (False, True))
    ['mesh  size', 'tp       8']
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row, widths, right, strict=True)
                      ).rstrip() for row in rows]
