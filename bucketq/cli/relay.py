"""``bucketq relay``: run a ``bucketq.outbox.Outbox`` relay from an application collection into a queue until
SIGTERM or Ctrl-C (or, with ``--once``, until no event is waiting)."""

from __future__ import annotations

import logging
import time

import click

from bucketq.cli.common import Target, connection_options, log_options, log_to_stderr, open_queue, run, stop_on_signals
from bucketq.cli.params import DURATION
from bucketq.outbox import FIELD, Outbox


@click.command()
@click.argument("collection")
@click.option("--queue", "-q", required=True, metavar="NAME", help="Queue to relay into (it may not exist yet).")
@click.option("--field", default=FIELD, show_default=True, metavar="NAME",
              help="The array field of the documents that holds their events.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True, metavar="N",
              help="Documents handled per pass.")
@click.option("--poll-interval", type=DURATION, default=1.0, show_default=True, metavar="DURATION",
              help="Longest wait between polls when idle (change streams, where the server has them, wake sooner).")
@click.option("--once", is_flag=True, help="Relay the events waiting now, then exit.")
@log_options
@connection_options
def relay(target: Target, collection: str, queue: str, field: str, batch_size: int, poll_interval: float,
          once: bool, log_level: str, driver_log_level: str) -> None:
    """Move the outbox events of COLLECTION's documents into a queue, exactly once.

    The application adds events (bucketq.outbox.event(...)) to a document's FIELD array in the same update as
    its own change; the relay inserts each into the queue, then removes it from the document. Several relays
    at once, or a relay killed at any point and restarted (within the queue's tombstone_retention), never
    duplicate or lose an event. Malformed events are set aside into FIELD_rejected, with the reason. On SIGTERM
    or Ctrl-C, the pass in progress ends and the relay exits with code 0.

    \b
    Examples:
      bucketq relay invoices --queue invoice-events
      bucketq relay invoices --queue invoice-events --once
    """
    log_to_stderr(log_level, driver_log_level)
    run(_relay(target, collection, queue, field, batch_size, poll_interval, once))


async def _relay(target: Target, collection: str, name: str, field: str, batch_size: int, poll_interval: float,
                 once: bool) -> None:
    log = logging.getLogger("bucketq.cli")
    started = time.monotonic()
    async with open_queue(target, name, must_exist=False) as queue:
        outbox = Outbox(collection, queue, field=field, batch_size=batch_size, poll_interval=poll_interval)
        if once:
            while await outbox.run_once():
                pass
        else:
            with stop_on_signals(outbox.stop):
                log.info("relay started: %s.%s into queue %r; stop with SIGTERM or Ctrl-C", outbox.namespace,
                         field, name)
                await outbox.run()
    rejected = f"; {outbox.rejected:,} set aside in {field}_rejected" if outbox.rejected else ""
    click.echo(f"relayed {outbox.relayed:,} event(s) from {collection!r} to {name!r} in "
               f"{time.monotonic() - started:.2f}s{rejected}")
