"""The consume path: claim buckets under a lease, serve their messages, flush per-message state.

Runs the sans-I/O ``HeldBucket`` and ``claims``; adds the event loop around them: one claim in flight at a
time, a periodic flusher that writes resolutions and extends leases, wake-ups, and an orderly drain.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pymongo.errors import OperationFailure, PyMongoError

from bucketq.clock import ServerClock
from bucketq.codecs import Codec, codec_for
from bucketq.core import claims
from bucketq.core.backoff import Backoff
from bucketq.core.format import StoredBucket, parse_bucket, quarantined_bucket
from bucketq.core.held import FlushPlan, HeldBucket, SlotState, dead_letter_reason_for_expired
from bucketq.errors import LeaseLost, MalformedBucket, QueueClosed
from bucketq.message import Message
from bucketq.options import QueueOptions, check_delay, check_timeout
from bucketq.store import Store, is_transient
from bucketq.wakeup import Wakeup

log = logging.getLogger("bucketq")

# Stop serving a bucket this share of its lease before the lease runs out, in case no extension got through.
LEASE_SAFETY = 0.1


@dataclass
class Holding:
    """A claimed bucket with its decoded payloads and the flush state around it."""

    held: HeldBucket
    payloads: list[Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    failed_plan: FlushPlan | None = None
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)


class KeyRecorder:
    """Writes dedupe keys to the inbox, one insert in flight at a time: keys acked meanwhile share the next."""

    def __init__(self, store: Store, clock: ServerClock) -> None:
        self._store = store
        self._clock = clock
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def record(self, key: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write())
        await future

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._store.record_keys([k for k, _ in batch], self._clock.now())
            except Exception as exc:
                for _, future in batch:
                    future.set_exception(exc)
            else:
                for _, future in batch:
                    future.set_result(None)
        self._task = None


class Consumer:
    def __init__(self, store: Store, codec: Codec, options: QueueOptions, clock: ServerClock, wakeup: Wakeup) -> None:
        self._store = store
        self._codec = codec
        self._options = options
        self._clock = clock
        self._wakeup = wakeup
        self._backoff = Backoff(options.retry_base, options.retry_factor, options.retry_max, options.retry_jitter)
        self._holdings: list[Holding] = []
        self._claim_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._draining = False
        self._owner = claims.owner_name()
        self._next_local_due: float | None = None  # monotonic time of the earliest retry bucket we wrote
        self._keys = KeyRecorder(store, clock)

    # -- reserving -----------------------------------------------------------------------------------------

    async def reserve(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when none arrives within ``timeout`` seconds (None: wait forever)."""
        if self._draining:
            raise QueueClosed("the consumer is draining or closed")
        timeout = check_timeout(timeout)
        self._start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = self._next_message()
            if message is not None:
                return message
            if self._draining:
                return None
            async with self._claim_lock:
                message = self._next_message()
                if message is not None or self._draining:
                    return message
                try:
                    claimed = await self._claim()
                except PyMongoError as exc:
                    if not is_transient(exc):
                        raise
                    # A claim whose reply was lost leaves its bucket claimed by nobody: it comes back when
                    # the lease expires, with one more try.
                    log.warning("claim failed, will retry: %s", exc)
                    claimed = False
            if claimed:
                self._wakeup.hit()
                continue
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._next_local_due is not None:
                remaining = min(remaining, max(0.0, self._next_local_due - time.monotonic()))
                if remaining == 0.0:
                    self._next_local_due = None
            await self._wakeup.wait(remaining)

    async def consume(self, idle_timeout: float | None = None) -> AsyncIterator[Message]:
        """Messages as they come; ends after ``idle_timeout`` seconds without one, or when draining."""
        check_timeout(idle_timeout)
        while not self._draining:
            message = await self.reserve(timeout=idle_timeout)
            if message is None:
                return
            yield message

    def _lease_ending(self, held: HeldBucket, now: dt.datetime) -> bool:
        """Whether ``held`` is lost or within the safety margin of its (server-applied) lease expiry."""
        return held.lost or now >= held.lease_until - dt.timedelta(seconds=self._options.lease * LEASE_SAFETY)

    def _next_message(self) -> Message | None:
        now = self._clock.now()
        for holding in self._holdings:
            held = holding.held
            if self._lease_ending(held, now):
                continue
            while (slot := held.next_pending()) is not None:
                tries = held.tries(slot)
                if tries >= self._options.max_attempts:
                    held.dead(slot, dead_letter_reason_for_expired(tries))
                    self._after_resolve(holding)
                    continue
                bucket = held.bucket
                return Message(holding.payloads[slot], bucket.message_id(slot), tries, bucket.headers[slot] or {},
                               bucket.enqueued_at(slot), bucket.keys[slot], self, holding, slot)
        return None

    async def _claim(self) -> bool:
        """Claim one due bucket. Returns whether a bucket was taken (even one that went to quarantine)."""
        now = self._clock.now()
        token = claims.new_token()
        spec = claims.claim(now, self._options.lease, token, self._owner)
        try:
            doc = await self._store.claim(spec)
        except OperationFailure as exc:
            if is_transient(exc):
                raise
            doc = await self._store.claim(claims.claim_uncounted(spec))
            if doc is None:
                raise
            await self._quarantine_bucket(doc, token, f"cannot be claimed: {exc}")
            return True
        if doc is None:
            return False
        try:
            bucket = parse_bucket(doc)
            codec = codec_for(bucket.codec, self._codec)
        except (MalformedBucket, ValueError) as exc:
            await self._quarantine_bucket(doc, token, str(exc))
            return True
        payloads, bad = self._decode(bucket, codec)
        if bad and self._options.malformed == "quarantine":
            first = ", ".join(f"slot {s}: {reason}" for s, reason in list(bad.items())[:3])
            await self._quarantine_bucket(doc, token, f"{len(bad)} undecodable message(s) ({first})")
            return True
        held = HeldBucket(bucket, token, now + dt.timedelta(seconds=self._options.lease),
                          max_attempts=self._options.max_attempts)
        holding = Holding(held, payloads)
        for slot, reason in bad.items():
            held.quarantine(slot, f"undecodable: {reason}")
        if self._options.dedupe:
            await self._skip_known_keys(holding)
        self._holdings.append(holding)
        if held.finished:
            self._spawn(self._flush_logged(holding))
        return True

    def _decode(self, bucket: StoredBucket, codec: Codec) -> tuple[list[Any], dict[int, str]]:
        payloads: list[Any] = [None] * bucket.size
        bad: dict[int, str] = {}
        for slot, stored in enumerate(bucket.payloads):
            if slot in bucket.done:
                continue
            try:
                payloads[slot] = codec.load(stored)
            except Exception as exc:
                bad[slot] = f"{type(exc).__name__}: {exc}"
        return payloads, bad

    async def _skip_known_keys(self, holding: Holding) -> None:
        held = holding.held
        keyed = {k: s for s, k in enumerate(held.bucket.keys) if k is not None and held.state[s] is SlotState.PENDING}
        known = await self._store.known_keys(list(keyed))
        for key in known:
            held.ack(keyed[key])

    async def _quarantine_bucket(self, doc: dict, token: str, reason: str) -> None:
        log.warning("bucket %s quarantined: %s", doc.get("_id"), reason)
        entry = quarantined_bucket(doc, reason=reason, at=self._clock.now(), host=self._owner.split(":")[0],
                                   pid=os.getpid())
        entry["doc"].pop("lease", None)
        await self._store.delete_bucket_into_quarantine(entry, claims.fenced(doc["_id"], token))

    # -- resolving -----------------------------------------------------------------------------------------

    async def resolve(self, holding: Holding, slot: int, nack: tuple[float | None, str] | None, *,
                      wait: bool) -> None:
        held = holding.held
        if held.lost:
            raise LeaseLost(f"the lease on bucket {held.bucket.id} was lost; message {held.bucket.message_id(slot)} "
                            "will be delivered again")
        if nack is None:
            key = held.bucket.keys[slot]
            if self._options.dedupe and key is not None:
                # Stored before ack returns, not at the next flush: once acked, a crash cannot make the
                # handler run again for this key.
                await self._keys.record(key)
                if self._lease_ending(held, self._clock.now()):
                    if not held.lost:
                        held.ack(slot)
                        self._after_resolve(holding)
                    raise LeaseLost(f"the lease on bucket {held.bucket.id} may have run out before the ack of "
                                    f"{held.bucket.message_id(slot)} was stored: it may be delivered again")
            held.ack(slot)
        else:
            delay, reason = nack
            delay = self._backoff.delay(held.tries(slot)) if delay is None else check_delay(delay)
            retry_at = self._clock.now() + dt.timedelta(seconds=max(0.0, delay))
            held.nack(slot, retry_at, reason)
        future = None
        if wait:
            future = holding.waiters[slot] = asyncio.get_running_loop().create_future()
        self._after_resolve(holding)
        if future is not None:
            if not held.finished:
                self._spawn(self._flush_logged(holding))
            await future

    def _after_resolve(self, holding: Holding) -> None:
        if holding.held.finished:
            self._spawn(self._flush_logged(holding))

    # -- flushing ------------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="bucketq-flush")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._options.state_flush_period)
            await self.flush()

    async def flush(self) -> None:
        """Write every held bucket's new resolutions, and extend leases that are past half their time."""
        half = dt.timedelta(seconds=self._options.lease / 2)
        now = self._clock.now()
        for holding in list(self._holdings):
            held = holding.held
            if held.dirty or held.finished or holding.failed_plan or held.lease_until - now < half:
                await self._flush_logged(holding)

    async def _flush_logged(self, holding: Holding) -> None:
        try:
            await self._flush(holding)
        except Exception:
            log.exception("state flush of bucket %s failed; will retry", holding.held.bucket.id)

    async def _flush(self, holding: Holding, *, release: bool = False) -> None:
        held = holding.held
        async with holding.lock:
            if held.lost or holding not in self._holdings:
                return
            plan = holding.failed_plan
            if plan is None or release:
                if plan is not None:  # write the failed plan's resolutions first
                    await self._run(holding, plan)
                    if held.lost:
                        return
                plan = held.plan(self._clock.now(), self._options.lease, granularity=self._options.due_granularity,
                                 release=release, host=self._owner, pid=os.getpid())
            await self._run(holding, plan)

    async def _run(self, holding: Holding, plan: FlushPlan) -> None:
        held = holding.held
        holding.failed_plan = plan
        applied = await self._execute(plan)
        holding.failed_plan = None
        # Only an extension the server applied counts: one still in flight (a server restarting) must not
        # let this consumer serve messages of a bucket someone else may already have claimed.
        if applied and plan.lease_until is not None and plan.lease_until > held.lease_until:
            held.lease_until = plan.lease_until
        if not applied:
            held.lost = True
            log.warning("lease on bucket %s lost; its unflushed state was refused", held.bucket.id)
        if plan.retry_docs and applied:
            due = min(d["due"] for d in plan.retry_docs)
            at = time.monotonic() + max(0.0, (due - self._clock.now()).total_seconds())
            self._next_local_due = at if self._next_local_due is None else min(self._next_local_due, at)
        for slot in plan.slots:
            future = holding.waiters.pop(slot, None)
            if future is not None and not future.done():
                if applied:
                    future.set_result(None)
                else:
                    future.set_exception(LeaseLost(f"the lease on bucket {held.bucket.id} was lost before the flush"))
        if not applied or plan.releases or plan.final[0] == "delete":
            self._holdings.remove(holding)
            for future in holding.waiters.values():
                if not future.done():
                    future.set_exception(LeaseLost(f"bucket {held.bucket.id} is no longer held"))

    async def _execute(self, plan: FlushPlan) -> bool:
        """Run a flush plan's writes in order; False when the lease turned out to be lost."""
        store = self._store
        if plan.guard is not None:
            if not await store.update_fenced(plan.filter, plan.guard):
                return False
        for collection, docs in ((store.buckets, plan.retry_docs), (store.dead, plan.dead_docs),
                                 (store.quarantine, plan.quarantine_docs)):
            if docs:
                await store.insert_copies(collection, docs)
        kind, update = plan.final
        if kind == "delete":
            return await store.delete_fenced(plan.filter)
        return await store.update_fenced(plan.filter, update)

    # -- shutting down -------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Stop claiming, wait (up to ``drain_timeout``) for served messages, flush, and release held buckets
        so that their unserved messages are claimable at once by others, with no tries added."""
        self._draining = True
        self._wakeup.notify()
        async with self._claim_lock:  # a claim already under way lands in self._holdings, to be released
            pass
        deadline = time.monotonic() + self._options.drain_timeout
        while any(h.held.outstanding for h in self._holdings if not h.held.lost) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        now = self._clock.now()
        for holding in list(self._holdings):
            held = holding.held
            for slot in held.outstanding:  # handlers that did not finish in time: retried, with a try counted
                held.nack(slot, now, "not resolved before the consumer drained")
            await self._flush(holding, release=not held.finished)
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
