"""The one table renderer of stallbench's text: ``tabulate``'s, right-aligned values beside a left label.

Columns that would pass a width go on to further blocks, each with the label column again; ``tabulate``
does not split a table so, and nothing else here renders one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

__all__ = ["Row", "grid", "plain_table"]

Row = tuple[str, list[str]]  # label, one cell per column; no cells: a section heading


def grid(corner: str, header: Sequence[str], rows: Sequence[Row], width: int | None = None) -> list[str]:
    """Aligned lines: ``corner`` above the labels, ``header`` above the values; with ``width``, columns past
    it go to further blocks (a blank line between), which leave out rows empty there."""
    label_w = max(len(label) for label, cells in [(corner, header), *rows] if cells)
    widths = [max(len(h), *(len(cells[i]) for _, cells in rows if cells)) for i, h in enumerate(header)]
    lines: list[str] = []
    for n, cols in enumerate(_chunks(label_w, widths, width)):
        block = [(label, [cells[i] for i in cols] if cells else []) for label, cells in rows]
        if n:
            block = [(label, cells) for label, cells in block if any(c.strip() for c in cells)]
            lines.append("")
        lines += _block(corner, [header[i] for i in cols], block)
    return lines


def _block(corner: str, header: list[str], rows: list[Row]) -> list[str]:
    table = [[corner, *header], *([label, *(cells or [""] * len(header))] for label, cells in rows)]
    text = tabulate(  # the header as a row: tabulate pads a header row by 2 more than its cells
        table,
        tablefmt="plain",
        colalign=("left", *["right"] * len(header)),
        disable_numparse=True,
        preserve_whitespace=True,
    )
    return [line.rstrip() for line in text.splitlines()]


def _chunks(first: int, widths: list[int], width: int | None) -> list[range]:
    """Consecutive value columns that fit ``width`` after a label column ``first`` wide."""
    chunks, start, used = [], 0, first
    for i, w in enumerate(widths):
        if width is not None and i > start and used + 2 + w > width:
            chunks.append(range(start, i))
            start, used = i, first
        used += 2 + w
    return [*chunks, range(start, len(widths))]


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table of values: the first column the label, floats with two decimals."""
    cells = [(str(row[0]), [f"{c:.2f}" if isinstance(c, float) else str(c) for c in row[1:]]) for row in rows]
    return "\n".join(grid(headers[0], list(headers[1:]), cells))
