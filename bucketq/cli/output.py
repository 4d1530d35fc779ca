"""Rendering on a terminal: rich tables, fitted to the console's width, and consoles. The short forms the
dashboard shows as well (JSON, ages, payload previews) are in ``bucketq.shell.text_views``."""

from __future__ import annotations

from typing import Any


def table(**kwargs: Any) -> Any:
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, show_edge=False, **kwargs)


UNBOUNDED = 1 << 16  # a width no table reaches: measures a table's natural width, its cells unwrapped


def fitted(out: Any, grid: Any) -> Any:
    """``grid`` when it fits the console's width with no header cut and no cell wrapped; else the same rows in
    a plain layout that any width holds: one block per row, the first cell on a line of its own, then one line
    per other column, ``header  cell``."""
    if out.measure(grid, options=out.options.update_width(UNBOUNDED)).maximum <= out.width:
        return grid
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table

    columns = list(grid.columns)
    blocks: list[Any] = [grid.title] if grid.title else []
    for first, *rest in zip(*(list(column.cells) for column in columns), strict=True):
        fields = Table.grid(padding=(0, 2))
        fields.add_column(no_wrap=True)
        fields.add_column(overflow="fold")
        for column, cell in zip(columns[1:], rest, strict=True):
            fields.add_row(column.header, cell)
        blocks += [first, Padding(fields, (0, 0, 0, 2), expand=False)]
    return Group(*blocks)


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def print_table(grid: Any) -> None:
    """Print a table on stdout, in the plain layout when it does not fit (``fitted``)."""
    out = console()
    out.print(fitted(out, grid))
