"""A reader of a stream's group: claims the group's next buckets, hands out their messages, writes acks, and
moves the group's committed position forward (docs/FORMAT.md, Reader groups).

Delivery is at-least-once: a message is read twice by a group only when the reader that had it stopped (killed,
lease lost, group reset) before its ack was written. Acks are written every ``state_flush_period`` and at once
when a bucket's last message is acked; a bucket held by a reader that died is read again, from its unwritten
acks on, once its ``lease`` expires.

In a partitioned stream a reader looks at the partitions in turn, from the one after where it last claimed, so
that the readers of a group spread over them; each partition is read as a stream of its own. What to write
after a look at a partition is ``bucketq.core.stream_step``'s; this module runs it.

An idle reader looks again only when a wake-up calls for it (``bucketq.shell.wakeup``): a bucket lands (a change
stream on the stream's buckets), a hole it waits on is due to be marked as a gap, another reader's lease it saw
ends, a reader of the same ``Stream`` object hands buckets back; else the slow jittered safety poll. Without
change streams it polls every ``poll_interval`` or sooner, as before.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Generator, Iterable
from typing import Any, Protocol, TypeVar

from pymongo.errors import PyMongoError

from bucketq.codecs import Codec, codec_for
from bucketq.core import reader_groups, stream_claims, stream_read, stream_step
from bucketq.core.claims import new_token, owner_name
from bucketq.core.conversation import carry_async
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.retry import is_transient
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_gaps import HoleWatch
from bucketq.core.stream_held import HeldStreamBucket
from bucketq.core.stream_read import ReadStep
from bucketq.errors import InvalidOption, LeaseLost, QueueClosed
from bucketq.options import StreamOptions, check_timeout
from bucketq.shell.clock import ServerClock
from bucketq.shell.redaction import redact
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.base import raise_if_cancelled
from bucketq.store.aio.stream_store import RECHECK_S, AsyncStreamStore

T = TypeVar("T")
log = logging.getLogger("bucketq")


class Stream(Protocol):
    """What a reader uses of its ``bucketq.Stream`` (a protocol, so that this module does not import the stream,
    which makes readers)."""

    store: AsyncStreamStore
    options: StreamOptions
    codec: Codec
    clock: ServerClock

    async def ready(self, *, write: bool = True) -> None: ...

    async def start_positions(self, start: str | Position | Iterable[Position] | dt.datetime,
                              current: ReaderGroup | None = None) -> list[Position]: ...

    async def expire_group(self, group: ReaderGroup, part: Partition, floor: int) -> None: ...

    def forget(self, reader: StreamReader) -> None: ...


class StreamMessage:
    """``position``, ``payload``, ``headers`` and ``created`` (when its bucket was opened) of one message read
    by a group; ``ack()`` once it is processed."""

    __slots__ = ("position", "payload", "headers", "created", "_reader", "_held")

    def __init__(self, position: Position, payload: Any, headers: dict[str, Any], created: dt.datetime,
                 reader: StreamReader, held: HeldStreamBucket) -> None:
        self.position = position
        self.payload = payload
        self.headers = headers
        self.created = created
        self._reader = reader
        self._held = held

    async def ack(self) -> None:
        """The group has read this message. Written with the next flush, or at once when it completes its bucket.
        Raises ``LeaseLost`` when this reader no longer holds the bucket (the message will be read again)."""
        await self._reader.ack(self._held, self.position.slot)

    def __repr__(self) -> str:
        return f"StreamMessage(position={str(self.position)!r}, payload={self.payload!r:.60})"


class StreamReader:
    """One reader of a reader group: ``stream.reader(group, start=...)``, used with ``async with``. The readers
    of a group, in any number of processes, share its messages; each message is read by one of them, in
    position order within a partition, and the group's committed position moves past what they acked."""

    def __init__(self, stream: Stream, group: str, start: str | Position | dt.datetime) -> None:
        self._stream = stream
        self._store = stream.store
        self._options = stream.options
        self.group = group
        self._start = start
        self._token = new_token()
        self._owner = owner_name()
        self._held: dict[tuple[int, int], HeldStreamBucket] = {}  # by (partition, sequence)
        self._lost: list[Position] = []  # buckets dropped since the last flush() call: their leases were lost
        self._holes: dict[int, HoleWatch] = {}  # by partition
        self._next_part = 0  # where the next look for a bucket to claim starts
        self._joined = False  # the group exists (created with ``start`` if it did not)
        self._epoch: int | None = None
        self._wakeup = Wakeup(stream.options.queue.poll_interval)
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    async def read(self, timeout: float | None = None) -> StreamMessage | None:
        """The group's next message; None when none arrives within ``timeout`` seconds."""
        messages = await self.read_many(1, timeout)
        return messages[0] if messages else None

    async def read_many(self, n: int, timeout: float | None = None) -> list[StreamMessage]:
        """Up to ``n`` of the group's next messages, in position order within each bucket: those available now,
        across as many buckets as it takes; waits up to ``timeout`` seconds only while it has none. Empty when
        none arrives in time."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidOption(f"n must be a positive int, got {n!r}")
        wait = check_timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        await self._ready()
        messages: list[StreamMessage] = []
        must_look = wait == 0  # a read that may not wait looks once, wake-up or not
        while True:
            messages += self._take(n - len(messages))
            if len(messages) == n:
                return messages
            if must_look or self._wakeup.ready:
                must_look = False
                claimed = await self._look()
                # a reset (the look at the group) or a lost lease drops buckets: their messages are read again
                messages = [m for m in messages if self._held.get(m._held.key) is m._held]
                if claimed:
                    self._wakeup.hit()
                    continue
            if messages:
                return messages
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            await self._wakeup.wait(self._options.queue.lease if left is None else left)

    def notify(self) -> None:
        """Something this process did may have left the group a bucket to read (another reader handed its
        buckets back, a reset): look again."""
        self._wakeup.notify()

    async def _ready(self) -> None:
        if self._closed:
            raise QueueClosed("the reader is closed")
        await self._stream.ready()
        if not self._joined:
            await self._converse(stream_read.join(self.group))
            self._joined = True
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="bucketq-stream-acks")
        if self._options.queue.change_streams is not False:  # again after a lost stream: a server restart
            self._wakeup.start_stream(self._store.watch_inserts, self._stream.clock,
                                      required=bool(self._options.queue.change_streams))

    def _take(self, n: int) -> list[StreamMessage]:
        """Up to ``n`` messages of the buckets held, only from those whose lease no reading of the clock puts past
        its end (as the queue's consumer serves): a bucket whose lease ran out (flushes failed through a stall or a
        cut) may be another reader's already, read and committed past; it is dropped, as a lost lease."""
        out: list[StreamMessage] = []
        latest = self._stream.clock.latest()
        for held in list(self._held.values()):
            if not held.serves_at(latest):
                self._drop_lost(held)
                continue
            codec = codec_for(held.codec, self._stream.codec)
            for slot in held.take(n - len(out)):
                out.append(StreamMessage(Position(held.seq, slot, held.partition), codec.load(held.payloads[slot]),
                                         held.headers[slot] or {}, held.created, self, held))
            if len(out) >= n:
                break
        return out

    # -- claiming ------------------------------------------------------------------------------------------

    async def _converse(self, conversation: Generator[ReadStep, Any, T]) -> T:
        """Carry one of the group's conversations (``core.stream_read``) to the store."""
        return await carry_async(conversation, self._read_step)

    async def _read_step(self, step: ReadStep) -> Any:
        store = self._store
        match step:
            case stream_read.ReadGroup():
                group = await store.group(self.group)
                if group is not None and group.epoch != self._epoch:  # reset: what this reader holds is the old epoch's
                    self._held.clear()
                    self._epoch = group.epoch
                return group
            case stream_read.StartPositions():
                return await self._stream.start_positions(self._start)
            case stream_read.ReadClock():
                return self._stream.clock.now()
            case stream_read.UpsertGroup(query, update):
                return await store.upsert_group(query, update)
            case stream_read.MoveGroup(query, update):
                return await store.move_group(query, update)
            case stream_read.ReadWindow(part, start, size):
                return await store.window(part, start, size)
            case stream_read.ReadClaims(group, part, start):
                return await store.claim_leases(group, part, start, reader_groups.SCAN_BUCKETS)
            case stream_read.ReadBucket(part, seq):
                return await store.bucket(part, seq)
            case stream_read.UpdateClaim(query, update, mine):
                return await store.update_claim(query, update, mine=mine)
        raise AssertionError(f"a reader takes no step {step!r}")

    async def _group(self) -> ReaderGroup:
        return await self._converse(stream_read.current_group(self.group, self._store.parts))

    async def _look(self) -> bool:
        """``_claim_next``, its transient errors (a connection cut, a server restart) survived as the queue's consumer
        survives them: looked at again after the poll delay, within the read's timeout. A claim whose reply was lost
        leaves its bucket to come back when its lease ends; a commit not written is written by a later look."""
        try:
            return await self._claim_next()
        except PyMongoError as exc:
            if not is_transient(exc):
                raise
            log.warning("stream read of group %r failed, will retry: %s", self.group, redact(str(exc)))
            self._wakeup.failed()
            return False

    async def _claim_next(self) -> bool:
        """In each partition in turn (those a wake-up named first): commit what the group has settled, then claim
        its next unclaimed bucket; mark holes that waited ``gap_wait`` as gaps. True when this reader got a
        bucket, marked a gap or moved the group (look again at once)."""
        hinted = self._wakeup.checking()
        group = await self._group()
        counters = await self._store.counters()
        parts = self._store.parts
        turns = [*hinted, *((self._next_part + turn) % len(parts) for turn in range(len(parts)))]
        for number in dict.fromkeys(n for n in turns if n < len(parts)):
            if await self._claim_in(group, parts[number], *counters[number]):
                self._next_part = (number + 1) % len(parts)  # the next look starts at the next partition
                return True
        if not self._store.settled:  # its first bucket may be in a partition this reader does not know of yet
            self._wakeup.due_at(time.monotonic() + RECHECK_S)
        return False

    async def _claim_in(self, group: ReaderGroup, part: Partition, last: int, floor: int) -> bool:
        """``_claim_next`` in one partition: ``stream_step.step`` says what to write."""
        if group.at(part).seq < floor:
            await self._stream.expire_group(group, part, floor)
            return True
        # Another reader's lease is over only when no reading of the clock says otherwise; in whole milliseconds,
        # as the server compares it with the stored lease, so that the step and the claim's filter agree.
        earliest = self._stream.clock.earliest()
        now = earliest.replace(microsecond=earliest.microsecond // 1000 * 1000)
        holes = self._holes.setdefault(part.number, HoleWatch(self._options.gap_wait))
        step = stream_step.step(await self._scan(group, part, last), [s for pt, s in self._held if pt == part.number],
                                holes, now, time.monotonic())
        if step.commit is not None:
            await self._commit(group, part, step.commit)
        for seq in step.claims:
            if await self._claim(group, part, seq, now):
                return True
        if step.claims:  # another reader claimed them since the scan: look again once its lease may be over
            self._wakeup.due_at(time.monotonic() + self._options.queue.lease)
        for seq in step.gaps:
            await self._store.mark_gap(part, seq, now, self._owner)  # or the producer's bucket landed after all
        if step.recheck_at is not None:
            self._wakeup.due_at(step.recheck_at)
        if step.lease_ends is not None:
            self._wakeup.due(step.lease_ends, self._stream.clock)
        return bool(step.gaps)

    async def _commit(self, group: ReaderGroup, part: Partition, seq: int) -> None:
        """Move the group's committed position in ``part`` forward to ``seq`` (never back: ``reader_groups.commit``)."""
        await self._converse(stream_read.commit(group, part, seq))

    async def _scan(self, group: ReaderGroup, part: Partition, last: int = 0) -> stream_step.Window:
        """The group's window in ``part``: its documents and the group's claims there."""
        return await self._converse(stream_read.window(group, part, last))

    async def _claim(self, group: ReaderGroup, part: Partition, seq: int, now: dt.datetime) -> bool:
        claim = await self._store.claim(group, part, seq, now, self._options.queue.lease, self._token, self._owner)
        if claim is None:  # another reader holds it, or finished it meanwhile
            return False
        held = await self._converse(stream_read.after_claim(self.group, self._store.parts, group, part, seq, claim,
                                                            self._token))
        if held is not None:
            self._held[held.key] = held
        return True

    # -- acks ----------------------------------------------------------------------------------------------

    async def ack(self, held: HeldStreamBucket, slot: int) -> None:
        """Record the ack of ``slot`` of a bucket this reader holds: what ``StreamMessage.ack`` calls. Raises
        ``LeaseLost`` when the reader no longer holds the bucket."""
        if self._held.get(held.key) is not held:
            raise LeaseLost(f"this reader no longer holds bucket {held.position} of group {self.group!r}; "
                            "the message will be read again")
        held.acked.add(slot)
        if held.complete:
            await self._finish(held)

    async def _finish(self, held: HeldStreamBucket) -> None:
        """Write the bucket's claim as finished (fenced by this reader's token), then commit what it settles."""
        self._held.pop(held.key, None)
        await self._converse(stream_read.finish(self.group, self._store.parts, held))

    async def flush(self, *, release: bool = False) -> list[Position]:
        """Write the acks not written yet and extend this reader's leases (``release``: end them, so that another
        reader of the group takes the unacked messages at once). Returns the positions (slot 0) of the buckets
        whose lease was lost since the last call (by this flush or a background one): they were dropped, and their
        messages whose acks were not written yet will be read again."""
        lease = dt.timedelta(seconds=self._options.queue.lease)
        until = stream_claims.NEVER if release else self._stream.clock.now() + lease
        for held in list(self._held.values()):
            unwritten = held.unwritten()
            applied = await self._store.extend_claim(held.cid, held.token, until, unwritten)
            if applied:
                held.written(unwritten)
                held.until = until
            elif self._held.get(held.key) is held:
                self._drop_lost(held)
        lost, self._lost = self._lost, []
        return lost

    def _drop_lost(self, held: HeldStreamBucket) -> None:
        """Let go of ``held``, whose lease is lost: the next ``flush()`` reports its position."""
        del self._held[held.key]
        self._lost.append(held.position)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._options.queue.state_flush_period)
            try:
                await self.flush()
            except PyMongoError:
                pass  # written at the next flush; a lease lost meanwhile means a redelivery, never a loss
            raise_if_cancelled()  # a cancel the driver swallowed during the flush

    async def close(self) -> None:
        """Write the acks not written yet, hand back the buckets held (their unacked messages go to another reader
        of the group, or to this group's next reader), and stop."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            self._flusher.cancel()
        await self._wakeup.stop()
        try:
            await self.flush(release=True)
        finally:
            self._held.clear()
            self._stream.forget(self)

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
