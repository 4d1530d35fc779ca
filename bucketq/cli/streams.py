"""``bucketq stream list|lag|reset``: a stream's reader groups, their lag, and replay."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import click

from bucketq.cli.common import CliError, Target, connection_options, database, run
from bucketq.cli.output import print_table, table
from bucketq.cli.params import parse_duration
from bucketq.core.format import SEQ_SUFFIX
from bucketq.core.stream_format import Position
from bucketq.errors import InvalidOption
from bucketq.shell.discovery import collection_names
from bucketq.shell.text_views import age, to_json
from bucketq.stream import Stream


@click.group()
def stream() -> None:
    """Reader groups of streams (`bucketq.Stream`): list them, show their lag, reset them (replay).

    \b
    Examples:
      bucketq stream list events
      bucketq stream lag events --json
      bucketq stream reset events audit --beginning
      bucketq stream reset events audit --at 2h          # replay the last two hours
    """


@asynccontextmanager
async def open_stream(target: Target, name: str) -> AsyncIterator[Stream]:
    """A ``Stream`` on the target database; an unknown stream is an error, and nothing is created."""
    async with database(target) as db:
        collections = await collection_names(db)
        if name + SEQ_SUFFIX not in collections:
            known = sorted(c[:-len(SEQ_SUFFIX)] for c in collections if c.endswith(SEQ_SUFFIX))
            hint = f"streams: {', '.join(known[:10])}" if known else "it has no streams"
            raise CliError(f"unknown stream {name!r} in database {db.name!r} ({hint})")
        handle = Stream(db, name=name)
        try:
            yield handle
        finally:
            await handle.close()


@stream.command("list")
@click.argument("name", metavar="STREAM")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per group.")
@connection_options
def list_groups(target: Target, name: str, as_json: bool) -> None:
    """List the reader groups of STREAM with their committed positions (the first message each has not read).

    \b
    Examples:
      bucketq stream list events
    """
    run(_list(target, name, as_json))


async def _list(target: Target, name: str, as_json: bool) -> None:
    async with open_stream(target, name) as handle:
        groups = await handle.groups()
    if as_json:
        for group in groups:
            click.echo(to_json({"group": group.name, "position": str(group), "resets": group.epoch,
                                "expired": group.expired}))
        return
    if not groups:
        click.echo(f"stream {name!r} has no reader groups")
        return
    out = table()
    for column in ("group", "position", "resets", "expired"):
        out.add_column(column, justify="left" if column == "group" else "right")
    for group in groups:
        out.add_row(group.name, str(group), str(group.epoch), f"{group.expired:,}")
    print_table(out)


@stream.command()
@click.argument("name", metavar="STREAM")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per group.")
@connection_options
def lag(target: Target, name: str, as_json: bool) -> None:
    """Show how far behind each reader group of STREAM is: messages not yet read and acked, and the age of the
    oldest of them. `expired` counts messages retention deleted before the group read them.

    \b
    Examples:
      bucketq stream lag events
      bucketq stream lag events --json | jq 'select(.lag_messages > 1000)'
    """
    run(_lag(target, name, as_json))


async def _lag(target: Target, name: str, as_json: bool) -> None:
    async with open_stream(target, name) as handle:
        stats = await handle.stats()
    groups: dict[str, dict[str, Any]] = stats["groups"]
    if as_json:
        for group, row in groups.items():
            click.echo(to_json({"group": group, **row}))
        return
    if not groups:
        click.echo(f"stream {name!r} has no reader groups")
        return
    out = table(title=f"stream {name}: last sequence {_by_partition(stats['last_sequence'])}, "
                      f"oldest kept {_by_partition(stats['floor'])}")
    for column in ("group", "position", "lag", "behind by", "expired"):
        out.add_column(column, justify="left" if column == "group" else "right")
    for group, row in groups.items():
        out.add_row(group, row["position"], f"{row['lag_messages']:,}", age(row["lag_s"]), f"{row['expired']:,}")
    print_table(out)


@stream.command()
@click.argument("name", metavar="STREAM")
@click.argument("group")
@click.option("--position", metavar="[PT/]SEQ:SLOT",
              help="Read on from this position (as `push` returned it; in a partitioned stream, of its partition).")
@click.option("--at", "at", metavar="TIME",
              help="Read on from the first message pushed at or after TIME: ISO 8601 with a time zone "
                   "(2026-11-23T10:00:00Z), or a duration ago (90s, 2h, 1d).")
@click.option("--beginning", is_flag=True, help="Read on from the oldest message retained.")
@click.option("--end", is_flag=True, help="Skip everything pushed so far.")
@connection_options
def reset(target: Target, name: str, group: str, position: str | None, at: str | None, beginning: bool,
          end: bool) -> None:
    """Move GROUP of STREAM (created if missing) to another position. Its readers drop the buckets they hold
    and read on from there: messages before it are skipped, messages after it are read again.

    \b
    Examples:
      bucketq stream reset events audit --beginning
      bucketq stream reset events audit --position 1200:0
      bucketq stream reset events audit --at 2026-11-23T10:00:00Z
      bucketq stream reset events audit --end
    """
    chosen = [flag for flag, given in (("--position", position), ("--at", at), ("--beginning", beginning),
                                       ("--end", end)) if given]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --position, --at, --beginning, --end"
                               + (f" (got {', '.join(chosen)})" if chosen else ""))
    try:
        to = Position.parse(position) if position else "beginning" if beginning else "end" if end else None
        when = _time(at) if at else None
    except (InvalidOption, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    run(_reset(target, name, group, to, when))


def _time(text: str) -> dt.datetime:
    """An aware datetime from ISO 8601 with a zone, or from a duration ago."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=parse_duration(text))
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: add Z or +HH:MM")
    return when


async def _reset(target: Target, name: str, group: str, to: str | Position | None, at: dt.datetime | None) -> None:
    async with open_stream(target, name) as handle:
        start = await handle.reset(group, to, at=at)
    click.echo(f"group {group!r} of stream {name!r} now reads from position {_by_partition(start)}")


def _by_partition(value: Any) -> str:
    """A value of a stream, or of each of its partitions (a list), as text."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)
