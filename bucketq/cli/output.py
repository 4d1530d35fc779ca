"""Rendering: JSON lines for machines, short human forms (ages, payload previews) and rich consoles."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import orjson
from bson import ObjectId


def to_json(value: Any) -> str:
    """Compact JSON; dates as ISO 8601, ObjectIds as hex, binary as base64."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


def pretty_json(value: Any) -> str:
    """``to_json`` indented by two spaces, for a page showing one value whole."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2).decode()


def _default(value: Any) -> Any:
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def preview(value: Any, width: int = 80) -> str:
    text = to_json(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def age(seconds: float) -> str:
    """``42s``, ``3m 5s``, ``2h 10m``, ``4d 3h``."""
    s = int(max(0.0, seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {s % size // sub_size}{sub}"
    return f"{s}s"


def relative(when: dt.datetime | None, now: dt.datetime) -> str:
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return "now" if abs(delta) < 1 else f"in {age(delta)}" if delta > 0 else f"{age(-delta)} ago"


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
