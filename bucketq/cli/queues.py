"""``bucketq stats``, ``peek`` and ``drain``: message counts per state (once, as JSON, or refreshed live), the
next messages in claim order without claiming them, and consuming messages for debugging."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import sys
import time
from typing import Any

import click

from bucketq.cli.common import (
    Target,
    connection_options,
    database,
    open_queue,
    require_queue,
    run,
    stop_on_signals,
)
from bucketq.cli.output import console, fitted, print_table, table
from bucketq.message import Message
from bucketq.queue import Queue, internals
from bucketq.shell.discovery import queue_names
from bucketq.shell.flow import Flow
from bucketq.shell.text_views import age, one_line, preview, relative, server_now, to_json

# -- stats ---------------------------------------------------------------------------------------------------

COLUMNS = {"ready": "ready", "scheduled": "scheduled", "in_flight": "in flight", "dead": "dead",
           "quarantined": "quarantined", "buckets": "buckets", "oldest_ready_age_s": "oldest"}
COUNTS = tuple(COLUMNS)[:-1]  # the columns of counts; the last is an age


@click.command()
@click.argument("queue", required=False)
@click.option("--watch", "-w", is_flag=True,
              help="Refresh every --interval seconds until Ctrl-C, with the rates in and out (messages/s).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, metavar="SECONDS",
              help="Refresh period of --watch.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON with the keys of Queue.stats() (a mapping by queue name when QUEUE is omitted); "
                   "one line per refresh with --watch, which adds \"rates\" (null until the second refresh).")
@connection_options
def stats(target: Target, queue: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """Show message counts of QUEUE, or of every queue in the database.

    Counts ready, scheduled (delayed or backing off), in-flight (claimed) messages, dead letters and
    quarantined entries, the number of buckets, and the age of the oldest ready message. A paused queue is
    marked "(paused)".

    With --watch, "in/s" is the rate of messages written into the queue (pushes, and nacked messages
    written again for their retry) and "out/s" the rate of messages finished (acked, nacked, dead-lettered,
    removed), from one refresh to the next. They need change streams (a replica set).

    \b
    Examples:
      bucketq stats events
      bucketq stats --watch
      bucketq stats events --json
    """
    run(_stats(target, queue, watch, interval, as_json))


async def _stats(target: Target, name: str | None, watch: bool, interval: float, as_json: bool) -> None:
    out = console()
    async with database(target) as db:
        if name is not None:
            await require_queue(db, name)
        queues: dict[str, Queue] = {}
        flows: dict[str, Flow] = {}
        stop = asyncio.Event()
        try:
            with contextlib.ExitStack() as stack:
                live = None
                if watch:
                    stack.enter_context(stop_on_signals(stop.set))
                    if not as_json and out.is_terminal:
                        live = stack.enter_context(_live(out))
                while not stop.is_set():
                    for n in [name] if name else await queue_names(db):
                        if n not in queues:
                            queues[n] = Queue(db, name=n)
                            if watch:
                                flows[n] = await Flow.open(db, n, _warn)
                    rows = {n: await q.stats() for n, q in sorted(queues.items())}
                    if watch:
                        for n, row in rows.items():
                            row["rates"] = await flows[n].rates(row)
                    paused = {n for n, q in queues.items() if await q.paused()}
                    _show(out, live, rows, paused, single=name is not None, as_json=as_json, db=db.name)
                    if not watch:
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), interval)
        finally:
            for flow in flows.values():
                await flow.close()
            for q in queues.values():
                await q.close()


def _warn(text: str) -> None:
    click.echo(one_line(text), err=True)


def _live(out: Any) -> Any:
    from rich.live import Live

    return Live(console=out, auto_refresh=False)


def _show(out: Any, live: Any, rows: dict[str, dict[str, Any]], paused: set[str], *, single: bool, as_json: bool,
          db: str) -> None:
    if as_json:
        click.echo(to_json(next(iter(rows.values())) if single else rows))
        return
    grid = fitted(out, _stats_table(rows, paused, db))
    if live is not None:
        live.update(grid, refresh=True)
    elif not rows:
        out.print(f"no queues in database {db!r}")
    else:
        out.print(grid)


def _stats_table(rows: dict[str, dict[str, Any]], paused: set[str], db: str) -> Any:
    grid = table(title=f"{db} · {dt.datetime.now().strftime('%H:%M:%S')}", title_justify="left")
    grid.add_column("queue", no_wrap=True)
    for heading in COLUMNS.values():
        grid.add_column(heading, justify="right")
    watching = any("rates" in row for row in rows.values())
    if watching:
        grid.add_column("in/s", justify="right")
        grid.add_column("out/s", justify="right")
    for name, row in rows.items():
        cells = [f"{row[k]:,}" for k in COUNTS]
        cells.append(age(row["oldest_ready_age_s"]) if row["ready"] else "-")
        if watching:
            rates = row.get("rates")
            cells += [f"{rates[k]:,.1f}" if rates else "-" for k in ("in_per_s", "out_per_s")]
        grid.add_row(f"{name} (paused)" if name in paused else name, *cells)
    notes = [f"{name}: {line}" for name, row in rows.items() for line in _notes(name, row)]
    if notes:
        grid.caption, grid.caption_justify = "\n".join(notes), "left"
    return grid


def _notes(name: str, row: dict[str, Any]) -> list[str]:
    """A queue's lines under the table: its stored rate limit, what its ordered groups wait for, and the documents
    of its collection that no claim can take."""
    notes = []
    if limit := row.get("rate_limit"):
        notes.append(f"rate limit {limit['limit']:,} per {limit['per']:g} s (stored with the queue)")
    if line := _group_waits(row.get("groups") or {}):
        notes.append(line)
    if row.get("not_buckets"):
        notes.append(f"{row['not_buckets']:,} document(s) no claim can take, not counted above (bucketq peek "
                     f"{name} lists them)")
    return notes


def _group_waits(groups: dict[str, dict[str, Any]]) -> str:
    """What the ordered groups wait for, in one line: "ordered groups: 2 served (until 10:31:07), 5 waiting"."""
    parts = [f"{row['groups']:,} {state}" + (f" (until {row['until']:%H:%M:%S})" if row["until"] and state != "ready"
                                             else "")
             for state, row in groups.items() if row["groups"]]
    return "ordered groups: " + ", ".join(parts) if parts else ""


# -- peek ----------------------------------------------------------------------------------------------------

@click.command()
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="How many messages to show.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: id, due, tries, priority and payload (or undecodable / malformed); "
                   "then one {not_a_bucket: id, reason} per document no claim can take.")
@connection_options
def peek(target: Target, queue: str, count: int, as_json: bool) -> None:
    """Show the next N messages of QUEUE in claim order, without claiming them.

    Messages in flight are included (they come back if their consumer fails); nothing changes on the server.
    A "priority" column shows each message's level when one of them has a level above 0. The ages are
    counted from the server's clock. Then the documents of the queue's collection that no claim can take (up
    to N, and how many): broken buckets, which consumers move to quarantine, or not buckets at all (an
    application's own documents).

    \b
    Examples:
      bucketq peek events
      bucketq peek events -n 100 --json | jq .payload
    """
    run(_peek(target, queue, count, as_json))


async def _peek(target: Target, name: str, count: int, as_json: bool) -> None:
    async with open_queue(target, name) as queue:
        entries = await queue.peek(count)
        now = server_now(internals(queue))
        strays = await queue.not_buckets(count)
    if as_json:
        for entry in entries:
            click.echo(to_json(entry))
        for doc in strays["documents"]:
            click.echo(to_json({"not_a_bucket": doc["id"], "reason": doc["reason"]}))
        return
    if entries:
        print_table(_peek_table(entries, now))
    else:
        click.echo(f"queue {name!r} has no messages")
    if strays["count"]:
        click.echo(f"{strays['count']:,} document(s) of {name!r} no claim can take"
                   f"{'' if strays['count'] == len(strays['documents']) else ', the first ones'}:")
        for doc in strays["documents"]:
            click.echo(f"  {doc['id']}: {doc['reason']}")


def _peek_table(entries: list[dict[str, Any]], now: dt.datetime) -> Any:
    """The peeked messages, due times counted from ``now`` (the server's time); a priority column only when a
    message has a level above 0, so that a queue without priorities shows what it always did."""
    from rich.markup import escape
    levels = any(e.get("priority") for e in entries)
    columns = [("id", "left"), ("due", "left"), ("tries", "right"), *([("priority", "right")] if levels else []),
               ("payload", "left")]
    grid = table()
    for column, justify in columns:
        grid.add_column(column, justify=justify, no_wrap=column != "payload")
    for e in entries:
        if "malformed" in e:
            grid.add_row(str(e.get("bucket")), "-", "-", *(["-"] if levels else []),
                         f"[red]malformed bucket: {escape(e['malformed'])}[/]")
            continue
        payload = escape(preview(e["payload"], 200)) if "payload" in e else f"[red]{escape(e['undecodable'])}[/]"
        grid.add_row(e["id"], relative(e.get("due"), now), str(e["tries"]),
                     *([str(e["priority"])] if levels else []), payload)
    return grid


# -- drain ---------------------------------------------------------------------------------------------------

STOP_CHECK_S = 0.25


@click.command()
@click.argument("queue")
@click.option("--discard", is_flag=True, help="Acknowledge messages without printing them.")
@click.option("--meta", is_flag=True,
              help="Print {id, tries, enqueued_at, headers, key, payload} instead of the bare payload.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Stop after N messages.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=1.0, show_default=True, metavar="SECONDS",
              help="Stop when no message arrives for this long.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new messages until Ctrl-C or SIGTERM.")
@connection_options
def drain(target: Target, queue: str, discard: bool, meta: bool, limit: int | None, idle_timeout: float,
          follow: bool) -> None:
    """Consume ready messages of QUEUE and print each as one JSON line (or discard them).

    Each message is acknowledged after it is printed, so it is gone from the queue. Without --meta, a
    line is the bare payload, which `bucketq push` reads back. Delayed messages that are not due yet stay
    in the queue. A count goes to stderr at the end.

    \b
    Examples:
      bucketq drain events --limit 10
      bucketq drain events --meta | jq .
      bucketq drain events --discard
      bucketq drain events --follow
    """
    run(_drain(target, queue, discard=discard, meta=meta, limit=limit, idle=None if follow else idle_timeout))


async def _drain(target: Target, name: str, *, discard: bool, meta: bool, limit: int | None,
                 idle: float | None) -> None:
    started = time.monotonic()
    count = 0
    stop = asyncio.Event()
    async with open_queue(target, name) as queue:
        if await queue.paused():
            click.echo(f"queue {name!r} is paused: nothing is claimed until `bucketq resume {name}`", err=True)
        with stop_on_signals(stop.set):
            while (limit is None or count < limit) and not stop.is_set():
                message = await _next(queue, idle, stop)
                if message is None:
                    break
                if not discard and not _print(message, meta):
                    await message.nack(0, error="bucketq drain: stdout closed before the message was printed")
                    break
                await message.ack()
                count += 1
    click.echo(f"{'discarded' if discard else 'drained'} {count:,} message(s) from {name!r} "
               f"in {time.monotonic() - started:.2f}s", err=True)


async def _next(queue: Any, idle: float | None, stop: asyncio.Event) -> Message | None:
    """The next message, or None after ``idle`` seconds without one or once a stop signal came. Waits in short
    slices rather than cancelling a reserve, which could leave a just-claimed bucket leased."""
    deadline = None if idle is None else time.monotonic() + idle
    while not stop.is_set():
        wait = STOP_CHECK_S if deadline is None else max(0.0, min(STOP_CHECK_S, deadline - time.monotonic()))
        message = await queue.reserve(wait)
        if message is not None:
            return message
        if deadline is not None and time.monotonic() >= deadline:
            return None
    return None


def _print(message: Message, meta: bool) -> bool:
    """Write the message to stdout; False when stdout is gone (the message is then not acknowledged)."""
    value: Any = message.payload
    if meta:
        value = {"id": message.id, "tries": message.tries, "enqueued_at": message.enqueued_at,
                 "headers": message.headers, "key": message.key, "payload": message.payload}
    try:
        sys.stdout.write(to_json(value) + "\n")
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return False
