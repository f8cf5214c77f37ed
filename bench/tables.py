"""The same rows as a terminal table and as a Markdown table."""

from __future__ import annotations

from collections.abc import Sequence

Row = Sequence[str]


def text_table(header: Row, rows: Sequence[Row]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ["-" * width for width in widths], *rows]
    return "\n".join(
        "  " + "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
        for line in lines
    )


def markdown_table(header: Row, rows: Sequence[Row]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)
