"""``bucketq dead`` and ``bucketq quarantine``: list, requeue and purge, filtered by age, error text or id; and
the entries as a table (the entries themselves, as plain dicts, are ``bucketq.shell.text_views``')."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import click

from bucketq.cli.common import Target, confirm, connection_options, open_queue, run
from bucketq.cli.output import print_table, table
from bucketq.cli.params import DURATION
from bucketq.queue import internals
from bucketq.shell.text_views import (
    Kind,
    count_matching,
    entry_ids,
    entry_view,
    preview,
    relative,
    server_now,
    to_json,
)


def _filters(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--error", "error_contains", metavar="TEXT",
                     help="Only entries whose error/reason contains TEXT (case-insensitive).")(f)
    return click.option("--older-than", type=DURATION, metavar="DURATION",
                        help="Only entries that arrived longer ago than this: 90, 30s, 5m, 2h, 1d.")(f)


def group(kind: Kind) -> click.Group:
    examples = (f"\b\nExamples:\n  bucketq {kind.command} list events\n"
                f"  bucketq {kind.command} requeue events --error timeout --yes\n"
                f"  bucketq {kind.command} purge events --older-than 7d")
    cli = click.Group(kind.command, help=f"{kind.about}\n\n{examples}", no_args_is_help=True)
    cli.add_command(_list_command(kind))
    cli.add_command(_action_command(kind, "requeue", "requeued", "Put matching {many} back in QUEUE, ready now "
                                    "with their tries reset and their ids kept."))
    cli.add_command(_action_command(kind, "purge", "purged", "Delete matching {many} for good."))
    return cli


def _list_command(kind: Kind) -> click.Command:
    @click.command("list", help=f"List {kind.many} of QUEUE, oldest first.")
    @click.argument("queue")
    @_filters
    @click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, metavar="N")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
    @connection_options
    def command(target: Target, queue: str, older_than: float | None, error_contains: str | None, limit: int,
                as_json: bool) -> None:
        run(_list(kind, target, queue, older_than=older_than, error_contains=error_contains, limit=limit,
                  as_json=as_json))
    return command


async def _list(kind: Kind, target: Target, name: str, *, as_json: bool, **filters: Any) -> None:
    async with open_queue(target, name) as queue:
        entries = await getattr(queue, kind.methods[0])(**filters)
        now = server_now(internals(queue))
    views = [entry_view(e) for e in entries]
    if as_json:
        for view in views:
            click.echo(to_json(view))
    elif not views:
        click.echo(f"no {kind.many} match")
    else:
        print_table(entry_table(views, kind.reason, now))


def _action_command(kind: Kind, verb: str, done: str, summary: str) -> click.Command:
    @click.command(verb, help=f"{summary.format(many=kind.many)} Asks for confirmation unless given --yes.")
    @click.argument("queue")
    @_filters
    @click.option("--id", "ids", multiple=True, metavar="ID", help="Only this entry (repeatable).")
    @click.option("--yes", "-y", is_flag=True, help=f"Do not ask before the {verb}.")
    @connection_options
    def command(target: Target, queue: str, older_than: float | None, error_contains: str | None,
                ids: tuple[str, ...], yes: bool) -> None:
        run(_act(kind, verb, done, target, queue, yes=yes, ids=entry_ids(ids), older_than=older_than,
                 error_contains=error_contains))
    return command


async def _act(kind: Kind, verb: str, done: str, target: Target, name: str, *, yes: bool, **filters: Any) -> None:
    async with open_queue(target, name) as queue:
        matching = await count_matching(internals(queue), kind, **filters)
        if not matching:
            click.echo(f"no {kind.many} match; nothing {done}")
            return
        if not yes:
            confirm(f"{verb.capitalize()} {kind.count(matching)} of queue {name!r}?", verb, done)
        method = kind.methods[1] if verb == "requeue" else kind.methods[2]
        n = await getattr(queue, method)(**filters)
    click.echo(f"{done} {kind.count(n)} of queue {name!r}")


def entry_table(views: list[dict[str, Any]], reason: str, now: dt.datetime) -> Any:
    """The entries as a table, their ages counted from ``now``: the server's time."""
    from rich.markup import escape
    quarantine = reason == "reason"
    grid = table()
    for column in ("id", "at", "kind" if quarantine else "tries", reason, "payload"):
        grid.add_column(column, no_wrap=column in ("id", "at"))
    for v in views:
        if "payload" in v:
            payload = escape(preview(v["payload"], 120))
        elif "messages" in v:
            payload = f"(whole bucket, {v['messages']} messages)"
        else:
            payload = f"[red]{escape(v.get('undecodable', '-'))}[/]"
        grid.add_row(str(v["id"]), relative(v.get("at"), now), str(v.get("kind" if quarantine else "tries", "-")),
                      escape(str(v.get(reason, ""))), payload)
    return grid
