"""``bucketq dead`` and ``bucketq quarantine``: list, requeue and purge, filtered by age, error text or id; and
the entries as plain dicts (for JSON) and as a table."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from bson import ObjectId

from bucketq.cli.common import Target, confirm, connection_options, open_queue, run
from bucketq.cli.output import preview, print_table, relative, table, to_json
from bucketq.cli.params import DURATION
from bucketq.codecs import codec_named
from bucketq.core.entries import entry_filter

if TYPE_CHECKING:
    from bucketq.queue import Queue


@dataclass(frozen=True)
class Kind:
    command: str  # also the queue store's collection of these entries (``store.dead``, ``store.quarantine``)
    one: str
    many: str
    reason: str  # the field the --error filter searches
    methods: tuple[str, str, str]  # Queue methods: list, requeue, purge
    about: str

    def count(self, n: int) -> str:
        return f"{n:,} {self.one if n == 1 else self.many}"


DEAD = Kind("dead", "dead letter", "dead letters", "error", ("dead_letters", "requeue_dead", "purge_dead"),
            "Dead letters: messages that failed max_attempts deliveries, kept with their last error.")
QUARANTINE = Kind("quarantine", "quarantined entry", "quarantined entries", "reason",
                  ("quarantined", "requeue_quarantined", "purge_quarantined"),
                  "Quarantine: buckets or messages that could not be decoded, kept with the reason.")


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
    views = [entry_view(e) for e in entries]
    if as_json:
        for view in views:
            click.echo(to_json(view))
    elif not views:
        click.echo(f"no {kind.many} match")
    else:
        print_table(entry_table(views, kind.reason))


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
        matching = await count_matching(queue, kind, **filters)
        if not matching:
            click.echo(f"no {kind.many} match; nothing {done}")
            return
        if not yes:
            confirm(f"{verb.capitalize()} {kind.count(matching)} of queue {name!r}?", verb, done)
        method = kind.methods[1] if verb == "requeue" else kind.methods[2]
        n = await getattr(queue, method)(**filters)
    click.echo(f"{done} {kind.count(n)} of queue {name!r}")


def _query(queue: Queue, kind: Kind, older_than: float | None, error_contains: str | None,
           ids: list[Any] | None) -> dict[str, Any]:
    return entry_filter(older_than_s=older_than, error_contains=error_contains, ids=ids, now=queue._clock.latest(),
                        error_field=kind.reason)


async def count_matching(queue: Queue, kind: Kind, *, older_than: float | None = None,
                         error_contains: str | None = None, ids: list[Any] | None = None) -> int:
    """How many of ``queue``'s entries of ``kind`` match the filters a requeue or purge is given."""
    store = queue._store
    return await store.count_entries(getattr(store, kind.command),
                                     _query(queue, kind, older_than, error_contains, ids))


async def entries_page(queue: Queue, kind: Kind, *, skip: int, limit: int, error_contains: str | None = None,
                       ids: list[Any] | None = None) -> list[dict[str, Any]]:
    """The entries of ``kind`` matching the filters, oldest first, from the ``skip``-th on: a page of a listing."""
    store = queue._store
    return await store.entries(getattr(store, kind.command), _query(queue, kind, None, error_contains, ids),
                               limit=limit, skip=skip)


def entry_ids(ids: tuple[str, ...]) -> list[Any] | None:
    """Dead-letter ids are strings; a quarantined bucket's id is an ObjectId: match a hex id either way."""
    if not ids:
        return None
    return [v for i in ids for v in ([ObjectId(i), i] if ObjectId.is_valid(i) else [i])]


# -- views ---------------------------------------------------------------------------------------------------

def entry_view(entry: dict[str, Any]) -> dict[str, Any]:
    """A dead letter (``error``) or quarantine entry (``reason``, ``kind``) with its payload decoded."""
    view: dict[str, Any] = {"id": entry["_id"]}
    for field in ("kind", "at", "tries", "error", "reason", "enqueued_at"):
        if field in entry:
            view[field] = entry[field]
    for field, name in (("h", "headers"), ("k", "key")):
        if entry.get(field) is not None:
            view[name] = entry[field]
    if entry.get("kind") == "bucket":
        doc = entry.get("doc") or {}
        view["messages"] = len(doc.get("p") or [])
    elif "p" in entry:
        try:
            view["payload"] = codec_named(entry.get("enc", "json")).load(entry["p"])
        except Exception as exc:
            view["undecodable"] = f"{type(exc).__name__}: {exc}"
    return view


def entry_table(views: list[dict[str, Any]], reason: str) -> Any:
    from rich.markup import escape
    now = dt.datetime.now(dt.timezone.utc)
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
