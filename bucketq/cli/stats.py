"""``bucketq stats``: message counts per state, once, as JSON, or refreshed live."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

import click

from bucketq.cli.common import Target, connection_options, database, queue_names, require_queue, run
from bucketq.cli.output import age, console, table, to_json
from bucketq.cli.signals import stop_on_signals
from bucketq.core.stats import STATS_KEYS
from bucketq.queue import Queue

COLUMNS = {"ready": "ready", "scheduled": "scheduled", "in_flight": "in flight", "dead": "dead",
           "quarantined": "quarantined", "buckets": "buckets", "oldest_ready_age_s": "oldest"}


@click.command()
@click.argument("queue", required=False)
@click.option("--watch", "-w", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, metavar="SECONDS",
              help="Refresh period of --watch.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON with the keys of Queue.stats() (a mapping by queue name when QUEUE is omitted); "
                   "one line per refresh with --watch.")
@connection_options
def stats(target: Target, queue: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """Show message counts of QUEUE, or of every queue in the database.

    Counts ready, scheduled (delayed or backing off), in-flight (claimed) messages, dead letters and
    quarantined entries, the number of buckets, and the age of the oldest ready message.

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
                        queues.setdefault(n, Queue(db, name=n))
                    rows = {n: await q.stats() for n, q in sorted(queues.items())}
                    _show(out, live, rows, single=name is not None, as_json=as_json, db=db.name)
                    if not watch:
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), interval)
        finally:
            for q in queues.values():
                await q.close()


def _live(out: Any) -> Any:
    from rich.live import Live

    return Live(console=out, auto_refresh=False)


def _show(out: Any, live: Any, rows: dict[str, dict[str, Any]], *, single: bool, as_json: bool, db: str) -> None:
    if as_json:
        click.echo(to_json(next(iter(rows.values())) if single else rows))
        return
    grid = _table(rows, db)
    if live is not None:
        live.update(grid, refresh=True)
    elif not rows:
        out.print(f"no queues in database {db!r}")
    else:
        out.print(grid)


def _table(rows: dict[str, dict[str, Any]], db: str) -> Any:
    grid = table(title=f"{db} · {dt.datetime.now().strftime('%H:%M:%S')}", title_justify="left")
    grid.add_column("queue")
    for key in STATS_KEYS:
        grid.add_column(COLUMNS[key], justify="right")
    for name, row in rows.items():
        cells = [f"{row[k]:,}" for k in STATS_KEYS[:-1]]
        grid.add_row(name, *cells, age(row["oldest_ready_age_s"]) if row["ready"] else "-")
    return grid
