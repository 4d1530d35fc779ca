"""The outbox: a message is enqueued if and only if the application's own write happens.

Two ways, both writing each message as a bucket of its own (``transaction.single_bucket``):

* **In a transaction** (replica sets): ``await queue.push(payload, session=s)`` inside the application's
  transaction writes the message in that transaction, unbuffered (``bucketq.shell.transaction``). It exists if and
  only if the transaction commits.

* **Embedded outbox** (any MongoDB, no transaction), this module: the application adds events made by
  ``event()`` to its own document, in the same single-document update as its business change, which MongoDB
  applies atomically::

      await orders.update_one({"_id": order_id}, {"$set": {"status": "paid"},
                                                  "$push": {"_outbox": bucketq.outbox.event({"paid": order_id})}})

  ``Outbox(collection, queue)`` relays them (``await relay.run()``, or ``run_once()``): it finds documents with
  events, inserts one bucket per event into the queue, then ``$pull``s the events by id. It wakes on change
  streams where the server has them, and polls ``{"_outbox.0": {"$exists": true}}`` otherwise.

**Exactly once into the queue.** The bucket of an event has an ``_id`` derived from (source namespace, document
``_id``, event id): ``event_bucket_id``. Whoever relays an event, and however often, writes the same ``_id``; a
second insert fails as a duplicate key, which counts as stored, as for any producer's retried insert. So a relay
killed between its queue write and its ``$pull`` leaves the events in their document, and the next pass (after
a restart, or another relay) inserts nothing new and pulls them; two relays that read the same events write
each bucket once, and both pulls are idempotent. The ``$pull`` comes only after the insert is acknowledged:
an event is never removed before it is stored. For the same reason an event pushed twice (an application's
update retried after a lost reply) is enqueued once.

**In order per document.** A pass gives a document's undelayed events due times one millisecond apart, in the
order of the array, and later passes start after them (``core.outbox_plan.plan``): a consumer reserving alone
receives them in that order.

Why a bucket per event rather than per document or per batch: a bucket ``_id`` that names several events is a
proof only if every relay would put exactly those events in it, and it would not: events keep arriving, and
another relay may have pulled some, so a restart or a second relay reading the same document later builds a
different batch that repeats events of the first. Dedupe keys instead of ``_id``s would let the second copy into
the queue and count on every consumer running with ``dedupe=True``. The price: consumers spend about two commands
(claim, finish) per relayed message, not per bucket of up to ``bucket_max_size``; the application already spent
one write per business change.

**The bound.** The proof that an event is in the queue is its bucket or, once consumed, the bucket's tombstone,
which is kept ``tombstone_retention`` seconds (docs/FORMAT.md, Tombstones). A relay killed between insert and
``$pull``, followed by no relay pass until its buckets were consumed and their tombstones reaped, relays those
events a second time: at-least-once then, never lost. Keep a relay running (a supervisor restarts it), or raise
``tombstone_retention`` above the longest relay outage to cover.

Event format (a subdocument of the ``_outbox`` array): ``id`` (ObjectId, the event's identity), ``enc`` (codec
name), ``p`` (the encoded payload: string or binary), and optionally ``h`` (headers), ``k`` (dedupe key),
``delay`` (seconds, counted from when the relay moves the event) or ``at`` (date). An element that does not
follow it is set aside, in the same document, into ``_outbox_rejected`` as ``{event, reason, at}``, and logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Mapping
from typing import Any

from bson import ObjectId
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import InvalidName, PyMongoError

from bucketq.codecs import Codec, codec_option
from bucketq.core.format import MAX_BUCKET_BYTES, encode_slot
from bucketq.core.outbox_plan import REJECTED_SUFFIX, RelayPass, plan, removals
from bucketq.core.retry import is_transient
from bucketq.errors import InvalidOption, PayloadTooLarge
from bucketq.motor_adapter import MotorCollection, is_motor
from bucketq.options import check_delay
from bucketq.queue import Queue, internals
from bucketq.shell.redaction import redact
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.base import raise_if_cancelled
from bucketq.store.aio.outbox import OutboxStore

log = logging.getLogger("bucketq.outbox")

FIELD = "_outbox"


# -- the embedded outbox: events ---------------------------------------------------------------------------------

def event(payload: Any, *, key: str | None = None, headers: Mapping[str, Any] | None = None,
          delay: float | dt.timedelta | None = None, at: dt.datetime | None = None,
          codec: str | Codec = "json") -> dict[str, Any]:
    """An outbox event: add it to a document's ``_outbox`` array in the update that makes the business change
    (``{"$push": {"_outbox": event(...)}}``, or ``{"$each": [...]}`` for several), and ``Outbox`` relays it.

    The payload is encoded here with ``codec``, so a bad payload fails this call (``EncodeError``,
    ``PayloadTooLarge``, ``InvalidOption``), never the relay. ``delay`` counts from when the relay moves the
    event (normally milliseconds after the write); ``at`` is an absolute, timezone-aware time. ``id``, a new
    ObjectId, is the event's identity: the same event pushed twice to one document is enqueued once."""
    resolved = codec_option(codec)
    slot, size = encode_slot(resolved, payload, headers, key)
    if size > MAX_BUCKET_BYTES:
        raise PayloadTooLarge(f"encoded event takes {size} bytes; a bucket holds at most {MAX_BUCKET_BYTES}")
    doc: dict[str, Any] = {"id": ObjectId(), "enc": resolved.name, "p": slot.payload}
    if slot.headers is not None:
        doc["h"] = slot.headers
    if key is not None:
        doc["k"] = key
    if delay is not None and at is not None:
        raise InvalidOption("give delay or at, not both")
    if delay is not None and (seconds := check_delay(delay)):
        doc["delay"] = seconds
    if at is not None:
        if not isinstance(at, dt.datetime) or at.tzinfo is None:
            raise InvalidOption("at must be a timezone-aware datetime")
        doc["at"] = at
    return doc


# -- the embedded outbox: the relay ------------------------------------------------------------------------------

class Outbox:
    """Relays the events that documents of ``collection`` hold in ``field`` into ``queue``, exactly once.

    ``collection`` is a collection name in the queue's database, or an ``AsyncCollection`` (or Motor collection)
    anywhere. ``batch_size`` documents are handled per pass. ``change_streams``: None uses them where the server
    has them, True also logs a warning where it has not, False polls only; polls back off to ``poll_interval``
    seconds when idle (at most 1 s while a change stream runs). ``relayed`` and ``rejected`` count the events
    this relay moved and set aside. See the module's docstring for the guarantees."""

    def __init__(self, collection: str | Any, queue: Queue, *, field: str = FIELD, batch_size: int = 100,
                 poll_interval: float = 1.0, change_streams: bool | None = None) -> None:
        if not isinstance(queue, Queue):
            raise InvalidOption(f"queue must be a bucketq.Queue, got {type(queue).__name__}")
        if not isinstance(field, str) or not field or "." in field or field.startswith("$") or field == "_id" \
                or "\0" in field:
            raise InvalidOption(f"field must be a top-level field name (no '.', no leading '$', not _id), got "
                                f"{field!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= 10_000:
            raise InvalidOption(f"batch_size must be an int from 1 to 10000, got {batch_size!r}")
        if not isinstance(poll_interval, (int, float)) or isinstance(poll_interval, bool) \
                or not 0.005 <= poll_interval <= 60:
            raise InvalidOption(f"poll_interval must be between 0.005 and 60 seconds, got {poll_interval!r}")
        if change_streams not in (None, True, False):
            raise InvalidOption(f"change_streams must be None, True or False, got {change_streams!r}")
        source = _collection(collection, queue)
        if source.database.name == queue.database.name and (source.name == queue.name or
                                                            source.name.startswith(queue.name + ".")):
            raise InvalidOption(f"collection {source.name!r} is queue {queue.name!r}'s own: relay from the "
                                "application's collection")
        self.store = OutboxStore(source, field, op_timeout_s=queue.options.write_timeout)
        self.queue = queue
        self._queue = internals(queue)
        self.field = field
        self.namespace = f"{source.database.name}.{source.name}"
        self.relayed = 0
        self.rejected = 0
        self._batch_size = batch_size
        self._change_streams = change_streams
        self._wakeup = Wakeup(poll_interval)
        self._stopping = False
        self._after: dt.datetime | None = None

    async def run_once(self) -> int:
        """One pass: relay the events of up to ``batch_size`` documents. Returns how many events it took out of
        documents (relayed, or set aside as malformed); 0 when none was waiting."""
        await self._queue.ready()
        docs = await self.store.waiting(self._batch_size)
        if not docs:
            return 0
        now = self._queue.clock.now()
        relay_pass = plan(docs, field=self.field, namespace=self.namespace, now=now, after=self._after)
        if relay_pass.buckets:
            await self._queue.store.insert_buckets(relay_pass.buckets)  # a duplicate key: that event is already in
            self._queue.wake()
        await self._remove(relay_pass, now)
        self._after = relay_pass.next_due
        self.relayed += len(relay_pass.buckets)
        self.rejected += len(relay_pass.set_aside)
        for aside in relay_pass.set_aside:
            log.warning("outbox event of %s _id=%r set aside in %s: %s", self.namespace, aside.doc_id,
                        self.field + REJECTED_SUFFIX, aside.reason)
        return relay_pass.events

    async def _remove(self, relay_pass: RelayPass, now: dt.datetime) -> None:
        """After the buckets are stored: the pulls and set-asides, retried like any idempotent write."""
        await self.store.remove(removals(relay_pass, field=self.field, now=now))

    async def run(self) -> None:
        """Relay until ``stop()``: a pass whenever a change stream or a poll says events may be waiting. A pass
        in progress when ``stop()`` is called ends first. Transient errors (a lost connection) are logged and
        retried with backoff; other errors end the run (a relay that cannot write must not look alive)."""
        try:
            while not self._stopping:
                if self._change_streams is not False:
                    self._wakeup.start_stream(self.store.watch_events, self._queue.clock,
                                              required=bool(self._change_streams))
                self._wakeup.checking()
                try:
                    moved = await self.run_once()
                except PyMongoError as exc:
                    if not is_transient(exc):
                        raise
                    log.warning("outbox relay of %s failed, will retry: %s", self.namespace, redact(str(exc)))
                    self._wakeup.failed()
                    moved = 0
                raise_if_cancelled()  # a cancel the driver swallowed during the pass
                if moved:
                    self._wakeup.hit()
                else:  # no limit of ours: a wake-up, or the poll (which backs off, after failed passes too), decides
                    await self._wakeup.wait(math.inf)
        finally:
            await self._wakeup.stop()

    def stop(self) -> None:
        """Ask ``run()`` to return after the pass in progress (from a signal handler, or another task)."""
        self._stopping = True
        self._wakeup.notify()


def _collection(collection: Any, queue: Queue) -> Any:
    if isinstance(collection, str):
        try:
            return queue.database[collection]
        except InvalidName as exc:
            raise InvalidOption(f"{collection!r} is not a valid collection name: {exc}") from None
    if isinstance(collection, (AsyncCollection, MotorCollection)):
        return collection
    if is_motor(collection) and type(collection).__name__.endswith("Collection"):
        return MotorCollection(collection)
    raise InvalidOption("collection must be a collection name or an AsyncCollection (pymongo's async API) or a "
                        f"Motor collection, got {type(collection).__name__}")
