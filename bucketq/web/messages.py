"""One message of a queue, found where it is (a dead letter, a quarantine entry, or pending in a bucket) and
shaped for its page; and what the dashboard can do to it there (retry, delete), through ``Queue``'s operator
methods. Reads go through the queue's store, with the filters of ``bucketq.core.entries`` and
``bucketq.core.operator_writes`` that the CLI's ``dead``, ``quarantine`` and ``remove`` use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bucketq.codecs import codec_named
from bucketq.core.format import parse_bucket
from bucketq.core.operator_writes import live_lease, pending_slots
from bucketq.queue import Queue, internals
from bucketq.shell.text_views import DEAD, QUARANTINE, entries_page, entry_ids, entry_view

# what each place offers: verb -> (label, the call on the queue). A pending message has no retry: it is on its way.
VERBS: dict[str, dict[str, tuple[str, Callable[[Queue, str], Awaitable[Any]]]]] = {
    "dead": {"retry": ("Retry", lambda q, i: q.requeue_dead(ids=[i])),
             "delete": ("Delete", lambda q, i: q.purge_dead(ids=[i]))},
    "quarantine": {"retry": ("Retry", lambda q, i: q.requeue_quarantined(ids=entry_ids((i,)))),
                   "delete": ("Delete", lambda q, i: q.purge_quarantined(ids=entry_ids((i,))))},
    "pending": {"delete": ("Delete", lambda q, i: q.remove(i))},
}
PLACES = {"dead": "a dead letter", "quarantine": "in quarantine", "pending": "pending"}


async def find_message(queue: Queue, message_id: str) -> dict[str, Any] | None:
    """The message ``message_id`` of ``queue`` as its page shows it (``where``: ``dead``, ``quarantine`` or
    ``pending``), or None when it is nowhere (unknown, or finished)."""
    for where, kind in (("dead", DEAD), ("quarantine", QUARANTINE)):
        ids = [message_id] if kind is DEAD else entry_ids((message_id,))
        found = await entries_page(internals(queue), kind, skip=0, limit=1, ids=ids)
        if found:
            entry = found[0]
            view = entry_view(entry)
            for field, name in (("origin", "origin"), ("g", "group"), ("host", "host"),
                                ("cancelled", "cancelled"), ("omitted", "omitted")):
                if entry.get(field) is not None:
                    view[name] = entry[field]
            return {"where": where, **view}
    return await _pending(queue, message_id)


async def _pending(queue: Queue, message_id: str) -> dict[str, Any] | None:
    """The message in the first live bucket that holds it unfinished (its producer's bucket, or a retry or
    requeued copy), with its deliveries so far and the lease it is under, if any."""
    store = internals(queue).store
    now = internals(queue).clock.latest()
    for doc in await store.holders(message_id):
        slots = pending_slots(doc, message_id)
        if not slots:
            continue
        bucket, slot = parse_bucket(doc), slots[0]
        view: dict[str, Any] = {"where": "pending", "id": message_id, "bucket": bucket.id,
                                "tries": bucket.base_tries[slot] + bucket.claims, "due": doc.get("due"),
                                "enqueued_at": bucket.enqueued_at(slot)}
        for name, value in (("headers", bucket.headers[slot]), ("key", bucket.keys[slot]), ("group", bucket.group),
                            ("priority", bucket.priority or None)):
            if value is not None:
                view[name] = value
        lease = live_lease(doc, now)
        if lease is not None:
            view["held_by"], view["held_until"] = lease.get("owner"), doc.get("due")
        try:
            view["payload"] = codec_named(bucket.codec).load(bucket.payloads[slot])
        except Exception as exc:  # shown as the consumer would quarantine it
            view["undecodable"] = f"{type(exc).__name__}: {exc}"
        return view
    return None

