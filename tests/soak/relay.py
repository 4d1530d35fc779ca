"""A soak outbox writer and relay: ``python -m tests.soak.relay URI DB RUN_DIR PROC``. It changes documents of
``orders`` with an event in the same update (``bucketq.outbox.event``), and runs an ``Outbox`` relay from that
collection into ``jobs``. The event's message id is known before the relay moves it (``event_bucket_id``), so
``push_ok`` is written once the business update is acknowledged, as for any push."""

from __future__ import annotations

import asyncio
import random
import sys

from pymongo.errors import PyMongoError

from bucketq.core.format import message_id
from bucketq.core.outbox_plan import event_bucket_id
from bucketq.outbox import Outbox, event
from tests.soak import role

ORDERS = "orders"
EVERY_S = 0.5
LAST_PASSES = 20


async def relay(ctx: role.Context) -> None:
    """Write orders with events and relay them until stopped; then relay what is left."""
    rng = random.Random(f"{ctx.args.seed}:{ctx.history.proc}")
    q = ctx.queue()
    outbox = Outbox(ORDERS, q, poll_interval=0.2)
    running = asyncio.create_task(outbox.run())
    orders = ctx.db[ORDERS]
    namespace = f"{ctx.db_name}.{ORDERS}"
    n = 0
    try:
        while not await ctx.pause(rng.uniform(0, 2 * EVERY_S)):
            if running.done():  # an error the relay does not retry (a restart's): log it, relay again
                print(f"{ctx.history.proc}: relay stopped: {running.exception()!r}", file=sys.stderr)
                running = asyncio.create_task(outbox.run())
            order = rng.randrange(50)
            ev = event({"p": ctx.history.proc, "n": n, "fate": "ok", "order": order}, key=f"order-{order}-{n}")
            n += 1
            try:
                await orders.update_one({"_id": order}, {"$inc": {"changes": 1}, "$push": {"_outbox": ev}},
                                        upsert=True)
            except PyMongoError as exc:  # not acknowledged: the event may or may not be there
                print(f"{ctx.history.proc}: update failed: {exc}", file=sys.stderr)
                continue
            ctx.history.op("push_ok", queue=q.name, kind="outbox",
                           id=message_id(event_bucket_id(namespace, order, ev["id"]), 0))
    finally:
        outbox.stop()
        await asyncio.wait({running}, timeout=30)
        for _ in range(LAST_PASSES):  # what the last updates added: their push_ok is written already
            if not await _relay_left(outbox):
                break
        await q.close()


async def _relay_left(outbox: Outbox) -> int:
    try:
        return await outbox.run_once()
    except PyMongoError as exc:
        print(f"relay: last pass failed: {exc}", file=sys.stderr)
        return 1


def main() -> int:
    """The role's entry point."""
    return role.run(relay, role.parser(__doc__ or "").parse_args())


if __name__ == "__main__":
    sys.exit(main())
