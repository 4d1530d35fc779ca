"""The consume path: claim buckets under a lease, serve their messages, flush per-message state.

Runs the sans-I/O ``HeldBucket`` and ``claims``; adds the event loop around them: one claim in flight at a
time, a periodic flusher that writes resolutions and extends leases, wake-ups, and an orderly drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo.errors import PyMongoError

from bucketq import metrics
from bucketq.clock import ServerClock
from bucketq.codecs import Codec, codec_for
from bucketq.control import PAUSE_REFRESH_S
from bucketq.core import claims, group_turn, groups
from bucketq.core.backoff import Backoff
from bucketq.core.format import StoredBucket, parse_bucket, quarantined_bucket
from bucketq.core.group_turn import GroupStep
from bucketq.core.held import FlushPlan, HeldBucket, Policy, SlotState
from bucketq.core.retry import is_too_large, is_transient
from bucketq.core.sharding import Rotation
from bucketq.core.sharding import key as shard_key
from bucketq.errors import InvalidOption, LeaseLost, MalformedBucket, QueueClosed, WriteFailed
from bucketq.message import Message
from bucketq.options import QueueOptions, check_delay, check_timeout
from bucketq.store.aio.queue import AsyncQueueStore
from bucketq.wakeup import Wakeup

log = logging.getLogger("bucketq")

T = TypeVar("T")

# A bucket holding this many messages was written under load (group commit writes smaller ones when producers
# trickle): the first claim that takes one already counts as a backlog for claiming ahead.
BACKLOG_BUCKET_SIZE = 64


@dataclass
class Holding:
    """A claimed bucket's state machine with its decoded payloads and the tasks and futures around it."""

    held: HeldBucket
    payloads: list[Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    flushing: asyncio.Task[None] | None = None  # the periodic flush under way, if any


class KeyRecorder:
    """Writes dedupe keys to the inbox, one insert in flight at a time: keys acked meanwhile share the next."""

    def __init__(self, store: AsyncQueueStore, clock: ServerClock) -> None:
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
    def __init__(self, store: AsyncQueueStore, codec: Codec, options: QueueOptions, clock: ServerClock,
                 wakeup: Wakeup) -> None:
        self._store = store
        self._codec = codec
        self._options = options
        self._clock = clock
        self._wakeup = wakeup
        self._backoff = Backoff(options.retry_base, options.retry_factor, options.retry_max, options.retry_jitter)
        self._policy = Policy(options.lease, options.max_attempts, options.due_granularity)
        self._holdings: list[Holding] = []
        self._claim_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._draining = False
        self._owner = claims.owner_name()
        # Claims in a row that took a bucket: from two on (or one of a bucket written under load, see
        # BACKLOG_BUCKET_SIZE), the queue has a backlog and claiming ahead pays. A consumer that empties each
        # bucket before the next is written alternates found and empty claims, and claiming ahead would only add
        # an empty claim per bucket.
        self._found_in_a_row = 0
        self._ahead: asyncio.Task[None] | None = None  # the claim ahead under way, if any
        self._ahead_unstarted = False  # it is spawned and has not run yet
        self._keys = KeyRecorder(store, clock)
        self._metrics = metrics.for_queue(store.name, store.database.name)
        self._rotation = Rotation(store.partitions)
        # Claims that took a bucket (True) or found none (False), for the bench's measure of claim conflicts
        self.claim_counts: Counter[bool] = Counter()

    # -- reserving -----------------------------------------------------------------------------------------

    async def reserve(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when none arrives within ``timeout`` seconds (None: wait forever)."""
        if self._draining:
            raise QueueClosed("the consumer is draining or closed")
        timeout = check_timeout(timeout)
        self._start()
        deadline = None if timeout is None else time.monotonic() + timeout
        claimed = False
        must_claim = timeout == 0  # a reserve that may not wait claims once, wake-up or not
        while True:
            message = self._next_message()
            if message is not None:
                if (message._holding is self._holdings[-1] and self._backlog(message._holding.held)
                        and not self._claim_lock.locked() and (self._ahead is None or self._ahead.done())):
                    self._ahead = self._spawn(self._claim_ahead(message._holding))
                    self._ahead_unstarted = True
                if self._ahead_unstarted:
                    # Yield until the claim ahead has sent its request: tasks whose handlers never await I/O
                    # would not yield before the messages at hand run out, and its round trip would not overlap
                    # their work. Every such task yields once a message meanwhile, so it is soon its turn.
                    await asyncio.sleep(0)
                return message
            if self._draining:
                return None
            if claimed and deadline is not None and time.monotonic() >= deadline:
                # The last claim took a bucket with nothing to serve (a group bucket that must wait, one gone to
                # quarantine): it counts as an attempt, not as a reason to claim on past the timeout.
                return None
            message, claimed = await self._next_or_claim(force=must_claim)
            must_claim = False
            if message is not None or self._draining:
                return message
            if claimed:
                continue
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._wakeup.wait(remaining)

    async def reserve_many(self, n: int, timeout: float | None = None) -> list[Message]:
        """Up to ``n`` messages: the first as ``reserve`` gives it, then those due now, from the buckets held
        and from further claims, without waiting."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidOption(f"n must be a positive int, got {n!r}")
        first = await self.reserve(timeout)
        if first is None:
            return []
        batch = [first]
        fruitless = False  # the last claim took a bucket with nothing to serve (a group bucket that must wait)
        while len(batch) < n and not self._draining:
            message = self._next_message()
            if message is None:
                if fruitless:  # claim no further: each such claim only pushes another group's bucket back
                    break
                try:
                    message, claimed = await self._next_or_claim()
                except PyMongoError as exc:  # the batch is held: hand it over; the next reserve claims again
                    log.warning("claim failed, returning the %d message(s) at hand: %s", len(batch), exc)
                    break
                if message is None and not claimed:
                    break
                fruitless = message is None
            else:
                fruitless = False
            if message is not None:
                batch.append(message)
        return batch

    async def consume(self, idle_timeout: float | None = None) -> AsyncIterator[Message]:
        """Messages as they come; ends after ``idle_timeout`` seconds without one, or when draining."""
        check_timeout(idle_timeout)
        while not self._draining:
            message = await self.reserve(timeout=idle_timeout)
            if message is None:
                return
            yield message

    async def _next_or_claim(self, *, force: bool = False) -> tuple[Message | None, bool]:
        """Under the claim lock: a message at hand (once the claim ahead under way, if any, has landed), or else
        one claim if a wake-up calls for it (``Wakeup.ready``) or ``force``. Returns the message, or None and
        whether a bucket was claimed (none while draining)."""
        async with self._claim_lock:
            message = self._next_message()
            if message is None and self._ahead is not None and not self._ahead.done():
                await self._ahead_landed()
                message = self._next_message()
            if message is not None or self._draining or not (force or self._wakeup.ready):
                return message, False
            try:
                claimed = await self._claim()
            except PyMongoError as exc:
                if not is_transient(exc):
                    raise
                # A claim whose reply was lost leaves its bucket claimed by nobody: it comes back when
                # the lease expires, with one more try.
                log.warning("claim failed, will retry: %s", exc)
                self._wakeup.failed()
                claimed = False
        return None, claimed

    def _next_message(self) -> Message | None:
        now = self._clock.latest()  # serve only while no reading of the clock could put the lease past its end
        for holding in self._holdings:
            held = holding.held
            slot = held.serve(now)
            if slot is None:
                if held.finished:  # the last slots were dead-lettered unserved
                    self._schedule_flush(holding)
                continue
            bucket = held.bucket
            self._metrics.consumed(1)
            return Message(holding.payloads[slot], bucket.message_id(slot), held.tries(slot),
                           bucket.headers[slot] or {}, bucket.enqueued_at(slot), bucket.keys[slot], self, holding,
                           slot)
        return None

    async def _wake_when_due(self, expired_by: dt.datetime) -> None:
        """After a claim that found nothing, with a change stream (so that no poll comes soon): wake when the
        next bucket becomes due or its lease ends. One read, served by the ``due`` index. Events announce the
        buckets written later; a lease extended meanwhile costs one claim that finds nothing, and a read.
        After ``expired_by``, the claim's earliest reading of the server's clock: a lease that ended by its
        latest reading is not over for a claim yet (a slow clock read on a loaded server: seconds)."""
        try:
            due = await self._store.next_due(expired_by)
        except PyMongoError as exc:  # the safety poll comes anyway
            log.debug("reading the next due time failed: %s", exc)
            return
        if due is not None:
            self._wakeup.due(due, self._clock)

    async def _claim_ahead(self, newest: Holding) -> None:
        """Claim the next bucket as soon as the newest one held (``newest``) is being served, so that consumers
        find messages at hand when it runs out instead of all waiting for a claim's round trip. At most one
        bucket ahead, only while the queue has a backlog (``_found_in_a_row``: an idle queue or a trickle costs
        no extra commands), and never two claims at once: it starts only while no reserve is claiming, and a
        reserve that needs to claim first waits for it (``_ahead_landed``), as does a drain."""
        self._ahead_unstarted = False
        if self._draining or not self._holdings or self._holdings[-1] is not newest:
            return
        try:
            await self._claim()
        except Exception as exc:  # the next reserve that finds nothing at hand claims again, and raises
            log.warning("claim ahead failed: %s", exc)

    def _backlog(self, newest: HeldBucket) -> bool:
        """Whether the queue likely holds another bucket behind ``newest``, the newest one claimed."""
        return self._found_in_a_row >= 2 or (self._found_in_a_row == 1 and newest.bucket.size >= BACKLOG_BUCKET_SIZE)

    async def _ahead_landed(self) -> None:
        """Wait for the claim ahead under way, if any: its bucket is in ``_holdings`` afterwards."""
        if self._ahead is not None and not self._ahead.done():
            await asyncio.wait([self._ahead])

    async def _claim(self, only: dict | None = None) -> bool:
        """Claim one due bucket (``only``: the bucket of that shard key, if due), trying the partitions in turn
        (``sharding.Rotation``: each at most once). Returns whether a bucket was taken (even one that went to
        quarantine or had to wait for its group)."""
        if only is None:
            self._wakeup.checking()
        if await self._store.pause.holds():  # paused by an operator (Queue.pause): held buckets are still served
            self._wakeup.due_at(time.monotonic() + PAUSE_REFRESH_S)  # no event tells of a resume: read again
            return False
        now, expired_by = self._clock.now(), self._clock.earliest()
        token = claims.new_token()
        held_groups = self._held_groups()
        doc = unclaimable = None
        for partition in self._rotation.round() if only is None else [only["pt"]]:
            spec = groups.skip(claims.claim(now, self._options.lease, token, self._owner, expired_by=expired_by,
                                            partition=partition), held_groups)
            if only is not None:
                spec = groups.instead(spec, only)
            doc, unclaimable = await self._store.claim(spec)
            self.claim_counts[doc is not None] += 1
            if doc is not None:
                self._rotation.claimed(partition)
                break
        if doc is not None and unclaimable is not None:
            self._wakeup.hit()
            await self._quarantine_bucket(doc, token, unclaimable)
            return True
        self._found_in_a_row = self._found_in_a_row + 1 if doc is not None else 0
        if doc is None:
            if self._wakeup.streaming and only is None:
                await self._wake_when_due(expired_by)
            return False
        self._wakeup.hit()
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
        if bucket.group is not None:
            turn = await self._converse(group_turn.take_turn(bucket, token, now, self._policy.lease_from(now),
                                                             expired_by, self._clock, waited=bool(doc.get("w"))))
            if not turn.serve:
                if only is None and turn.claim_instead is not None:
                    await self._claim(only=turn.claim_instead)  # the group was free: its first is the one to serve
                return True
        held = HeldBucket(bucket, token, self._policy.lease_from(now), self._policy)
        holding = Holding(held, payloads)
        for slot, reason in bad.items():
            held.quarantine(slot, f"undecodable: {reason}")
        if self._options.dedupe:
            await self._skip_known_keys(holding)
        self._holdings.append(holding)
        if held.finished:
            self._schedule_flush(holding)
        return True

    def _held_groups(self) -> list[str]:
        """The groups whose turn this consumer holds: their later buckets can only wait for it to end."""
        return [h.held.bucket.group for h in self._holdings if h.held.bucket.group is not None and not h.held.ended]

    async def _converse(self, conversation: Generator[GroupStep, Any, T]) -> T:
        """Carry an ordered group's conversation (``core.group_turn``) to the store: each step's reply goes back
        in, each error is thrown in at the step that raised it (the lock may still have to be given back)."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = conversation.send(reply) if error is None else conversation.throw(error)
            except StopIteration as done:
                return done.value
            try:
                reply, error = await self._group_step(step), None
            except BaseException as exc:  # a cancellation too: the conversation unlocks, then raises it
                reply, error = None, exc

    async def _group_step(self, step: GroupStep) -> Any:
        store = self._store
        match step:
            case group_turn.LockGroup(query, update, mine):
                return await store.lock_group(query, update, mine)
            case group_turn.ReadEarliestLive(query, sort):
                return await store.first_bucket(query, sort)
            case group_turn.ReleaseToWait(query, update, mine):
                return await store.update_fenced(query, update, mine=mine)
            case group_turn.Unlock(mine):
                return await store.unlock_group(mine)
            case group_turn.ReadLock(group):
                return await store.group_lock(group)
            case group_turn.Wake(query, update):
                await store.wake(query, update)
                self._wakeup.notify()
                return None

    def _decode(self, bucket: StoredBucket, codec: Codec) -> tuple[list[Any], dict[int, str]]:
        payloads: list[Any] = [None] * bucket.size
        bad: dict[int, str] = {}
        load, done = codec.load, bucket.done
        for slot, stored in enumerate(bucket.payloads):
            if done and slot in done:
                continue
            try:
                payloads[slot] = load(stored)
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
        now = self._clock.now()
        entry = quarantined_bucket(doc, reason=reason, at=now, host=self._owner.split(":")[0], pid=os.getpid())
        ref = shard_key(doc)
        await self._store.quarantine_bucket(entry, claims.fenced(ref, token), claims.finish(now, token, ref["pt"]),
                                            claims.finished_by(ref, token))
        # reported once stored, not before: a copy refused (too large) must not read as quarantined
        log.warning("bucket %s quarantined%s: %s", doc.get("_id"),
                    f" without its fields {', '.join(entry['omitted'])} (over 16 MiB)" if "omitted" in entry else "",
                    reason)
        self._metrics.quarantined(1)

    # -- resolving -----------------------------------------------------------------------------------------

    async def resolve(self, holding: Holding, slot: int, outcome: tuple[str, float | None, str], *,
                      wait: bool) -> float | None:
        """Record ``outcome``, ``(kind, delay, reason)`` with kind "ack", "nack" or "dead". A nack returns the
        seconds until its retry, or None when it was the message's last attempt (a dead letter)."""
        held = holding.held
        held.check_held(slot)
        kind, delay, reason = outcome
        retry_in = None
        if kind == "ack":
            key = held.bucket.keys[slot]
            if self._options.dedupe and key is not None:
                # Stored before ack returns, not at the next flush: once acked, a crash cannot make the
                # handler run again for this key.
                await self._keys.record(key)
                if held.lease_ending(self._clock.latest()):
                    with contextlib.suppress(LeaseLost):  # written if a flush still lands under this lease
                        held.ack(slot)
                        self._schedule_flush(holding)
                    raise LeaseLost(f"the lease on bucket {held.bucket.id} may have run out before the ack of "
                                    f"{held.bucket.message_id(slot)} was stored: it may be delivered again")
            held.ack(slot)
        elif kind == "dead":
            held.dead(slot, reason or "rejected by the handler")
        else:
            delay = self._backoff.delay(held.tries(slot)) if delay is None else check_delay(delay)
            retry_at = self._clock.now() + dt.timedelta(seconds=max(0.0, delay))
            if held.nack(slot, retry_at, reason) is SlotState.RETRY:
                retry_in = delay
        future = None
        if wait:
            future = holding.waiters[slot] = asyncio.get_running_loop().create_future()
        if future is not None or held.finished or held.held_back is not None:
            self._schedule_flush(holding)
        if future is not None:
            await future
        return retry_in

    # -- flushing ------------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop(), name="bucketq-flush")

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _flush_loop(self) -> None:
        """Every ``state_flush_period``, start a flush for each held bucket that needs one and has none under
        way. Each bucket's flush is a task of its own: one write retrying for a long time (a server
        restarting) holds back only its own bucket, never the lease extensions of the others."""
        while True:
            await asyncio.sleep(self._options.state_flush_period)
            now = self._clock.latest()
            for holding in list(self._holdings):
                if holding.held.needs_flush(now):
                    self._schedule_flush(holding)

    def _schedule_flush(self, holding: Holding) -> None:
        """Start a flush of ``holding`` unless one is under way: that one goes on to write what is resolved
        meanwhile when the bucket is finished or someone waits for a resolution (see ``_flush``)."""
        if holding.flushing is None or holding.flushing.done():
            holding.flushing = self._spawn(self._flush_logged(holding))

    async def _flush_logged(self, holding: Holding) -> None:
        try:
            await self._flush(holding)
        except Exception as exc:
            log.warning("state flush of bucket %s failed; will retry: %s", holding.held.bucket.id, exc)

    async def _flush(self, holding: Holding, *, release: bool = False) -> None:
        """Write the bucket's pending plan (a failed one first, as it was), then go on while resolutions that
        someone waits for were made meanwhile. A release, or a bucket with every slot resolved, goes on until
        the write that ends the bucket is applied or refused."""
        held = holding.held
        async with holding.lock:
            while not held.ended and holding in self._holdings:
                plan = held.take_plan(self._clock.now(), release=release, host=self._owner, pid=os.getpid())
                await self._run(holding, plan)
                if not (release or held.finished or (held.dirty and holding.waiters)):
                    return

    async def _run(self, holding: Holding, plan: FlushPlan) -> None:
        held = holding.held
        refused: WriteFailed | None = None
        try:
            applied = await self._execute(plan)  # raises: the plan stays pending, to be retried as it is
        except Exception as exc:
            if not is_too_large(exc):
                raise
            # Over 16 MiB (a bucket someone else wrote near the limit): the same plan would be refused for ever.
            # The bucket is given up as a lost lease would be: it comes back when the lease expires.
            refused = WriteFailed(f"a write for bucket {held.bucket.id} was refused as too large ({exc}); its "
                                  "unflushed messages come back when the lease expires")
            applied = False
        held.outcome(plan, applied)
        self._metrics.flushed(plan, applied)
        if refused is not None:
            log.error("%s", refused)
        elif not applied:
            log.warning("lease on bucket %s lost; its unflushed state was refused", held.bucket.id)
        elif plan.retry_docs:
            self._wakeup.due(min(d["due"] for d in plan.retry_docs), self._clock)
        if held.ended and held.bucket.group is not None:  # before the acks return: then the group has moved on
            await self._end_turn(held.bucket.group, held.bucket.partition, held.token)
        for slot in plan.slots if holding.waiters else ():
            future = holding.waiters.pop(slot, None)
            if future is not None and not future.done():
                if applied:
                    future.set_result(None)
                else:
                    future.set_exception(refused or LeaseLost(f"the lease on bucket {held.bucket.id} was lost "
                                                              "before the flush"))
        if held.ended:
            self._holdings.remove(holding)
            for future in holding.waiters.values():
                if not future.done():
                    future.set_exception(LeaseLost(f"bucket {held.bucket.id} is no longer held"))

    async def _end_turn(self, group: str, partition: int | None, token: str) -> None:
        """``group_turn.end_turn``. On failure the lock expires with the lease, and waiting buckets come back at
        their recheck time."""
        self._wakeup.notify()  # our claims skipped the group's later buckets while we held it: no event says so
        try:
            await self._converse(group_turn.end_turn(group, partition, token, self._clock))
        except PyMongoError as exc:
            log.warning("group %r: unlock or hand-off failed; the lock expires with the lease: %s", group, exc)

    async def _execute(self, plan: FlushPlan) -> bool:
        """Run a flush plan's writes in order; False when the lease turned out to be lost."""
        store = self._store
        if plan.lock_until is not None:  # a group bucket: its lock first, so that it never expires before the lease
            assert plan.group is not None
            if not await store.extend_group(groups.held_by(plan.group, plan.token), groups.extend(plan.lock_until)):
                return False
        if plan.guard is not None and not await store.update_fenced(plan.filter, plan.guard):
            return False
        for collection, docs in ((store.buckets, plan.retry_docs), (store.dead, plan.dead_docs),
                                 (store.quarantine, plan.quarantine_docs)):
            if docs:
                await store.insert_copies(collection, docs)
        if plan.kind == "finish":
            assert plan.mine is not None
            return await store.finish_fenced(plan.filter, plan.final, plan.mine)
        return await store.update_fenced(plan.filter, plan.final, mine=plan.mine)

    # -- shutting down -------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Stop claiming, wait (up to ``drain_timeout``) for served messages, flush, and release held buckets,
        all at once, so that their unserved messages are claimable at once by others, with no tries added.
        Returns within ``drain_timeout`` plus one ``write_timeout`` whatever the server does: a claim or a
        release it has not answered by then is abandoned (those buckets come back when their leases expire)
        and ``WriteFailed`` is raised. Background tasks stop even when a write fails (the server is
        unreachable)."""
        self._draining = True
        self._wakeup.notify()
        started = time.monotonic()
        stop_by = started + self._options.drain_timeout + self._options.write_timeout
        try:
            # A claim already under way lands in self._holdings, to be released.
            claiming = self._spawn(self._claims_landed())
            await asyncio.wait([claiming], timeout=stop_by - time.monotonic())
            deadline = started + self._options.drain_timeout
            while any(h.held.outstanding for h in self._holdings if not h.held.ended) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            now = self._clock.now()
            releases = []
            for holding in list(self._holdings):
                held = holding.held
                if held.ended:
                    continue
                # handlers that did not finish in time: retried, with a try counted
                held.give_back(now, "not resolved before the consumer drained")
                releases.append(self._spawn(self._flush(holding, release=not held.finished)))
            if self._background:
                await asyncio.wait(list(self._background), timeout=max(0.0, stop_by - time.monotonic()))
            for task in releases:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            unanswered = sum(not task.done() for task in [claiming, *releases])
            if unanswered:
                raise WriteFailed(f"drain: {unanswered} claim(s) or release(s) unanswered by the server within "
                                  "drain_timeout + write_timeout; their buckets come back when their leases expire")
        finally:
            tasks = [*self._background, *([self._flusher] if self._flusher else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._flusher = None

    async def _claims_landed(self) -> None:
        """Wait for a claim under way (a reserve's or the claim ahead): its bucket is in ``_holdings`` after."""
        async with self._claim_lock:
            await self._ahead_landed()
