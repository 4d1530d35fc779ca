"""``bucketq peek``: the next messages in claim order, without claiming them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from bucketq.cli.common import Target, connection_options, open_queue, run
from bucketq.cli.output import console, preview, relative, table, to_json


@click.command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="How many messages to show.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: id, due, tries and payload (or undecodable / malformed).")
@connection_options
def peek(target: Target, queue: str, count: int, as_json: bool) -> None:
    """Show the next N messages of QUEUE in claim order, without claiming them.

    Messages in flight are included (they come back if their consumer fails); nothing changes on the server.

    \b
    Examples:
      bucketq peek events
      bucketq peek events -n 100 --json | jq .payload
    """
    run(_peek(target, queue, count, as_json))


async def _peek(target: Target, name: str, count: int, as_json: bool) -> None:
    async with open_queue(target, name) as queue:
        entries = await queue.peek(count)
    if as_json:
        for entry in entries:
            click.echo(to_json(entry))
        return
    out = console()
    if not entries:
        out.print(f"queue {name!r} has no messages")
        return
    out.print(_table(entries))


def _table(entries: list[dict[str, Any]]) -> Any:
    from rich.markup import escape
    now = dt.datetime.now(dt.timezone.utc)
    grid = table()
    for column, justify in (("id", "left"), ("due", "left"), ("tries", "right"), ("payload", "left")):
        grid.add_column(column, justify=justify, no_wrap=column != "payload")  # type: ignore[arg-type]
    for e in entries:
        if "malformed" in e:
            grid.add_row(str(e.get("bucket")), "-", "-", f"[red]malformed bucket: {escape(e['malformed'])}[/]")
            continue
        payload = escape(preview(e["payload"], 200)) if "payload" in e else f"[red]{escape(e['undecodable'])}[/]"
        grid.add_row(e["id"], relative(e.get("due"), now), str(e["tries"]), payload)
    return grid
