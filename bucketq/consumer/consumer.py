"""The consume path: claim buckets under a lease, serve their messages, flush per-message state.

Runs the sans-I/O ``ClaimedBucket`` and ``claims``; adds the event loop around them: one claim in flight at a
time, a periodic flusher that writes resolutions and extends leases, wake-ups, and an orderly drain. Each of
those is a part of its own in this package (``Claiming``, ``Decoding``, ``OrderedGroupTurns``, ``Flushing``,
``Draining``), given only what it uses; ``Consumer`` wires them together and serves and resolves messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from itertools import repeat
from operator import attrgetter

from pymongo.errors import PyMongoError

from bucketq import metrics
from bucketq.codecs import Codec
from bucketq.consumer.claiming import Backlog, Claiming
from bucketq.consumer.decoding import Decoding
from bucketq.consumer.dedupe_keys import KeyRecorder
from bucketq.consumer.draining import Draining
from bucketq.consumer.finishing import Finishes
from bucketq.consumer.flushing import Flushing
from bucketq.consumer.group_turns import OrderedGroupTurns
from bucketq.consumer.holding import Holding
from bucketq.consumer.tasks import BackgroundTasks
from bucketq.core import claims
from bucketq.core.backoff import Backoff
from bucketq.core.claim_step import Claimer
from bucketq.core.held import Policy, SlotState
from bucketq.core.priorities import Turns
from bucketq.core.retry import is_transient
from bucketq.errors import InvalidOption, LeaseLost, QueueClosed
from bucketq.message import Message
from bucketq.options import QueueOptions, check_delay, check_timeout
from bucketq.shell.clock import ServerClock
from bucketq.shell.pause_gate import PauseGate
from bucketq.shell.rate_limit import Permits
from bucketq.shell.wakeup import Wakeup
from bucketq.store.aio.queue_store import AsyncQueueStore

log = logging.getLogger("bucketq")


class Consumer:
    """The consume path of one queue object: reserves and serves messages, resolves them; its parts claim, decode,
    flush and drain."""

    def __init__(self, store: AsyncQueueStore, codec: Codec, options: QueueOptions, clock: ServerClock,
                 wakeup: Wakeup, pause: PauseGate, *, before_claim: Callable[[], Awaitable[None]]) -> None:
        self._before_claim = before_claim  # the queue's set-up, clock resync and stream restarts, as they fall due
        self._options = options
        self._clock = clock
        self._wakeup = wakeup
        self._backoff = Backoff(options.retry_base, options.retry_factor, options.retry_max, options.retry_jitter)
        self._holdings: list[Holding] = []  # the buckets held, oldest first: shared with the parts
        self._draining = False
        self._keys = KeyRecorder(store, clock)
        self._metrics = metrics.for_queue(store.name, store.database.name)
        # Until the first claim's set-up tells whether the queue has a rate limit (a consumer that names none
        # adopts the queue's), every reserve goes through the permits; then None when it has none
        self._permits: Permits | None = Permits(store, clock)
        owner = claims.owner_name()
        background = BackgroundTasks()
        finishes = Finishes(store, min(options.finish_linger, options.state_flush_period), background.spawn)
        backlog = Backlog()
        group_turns = OrderedGroupTurns(store, wakeup)
        self._flushing = Flushing(store, clock, options, wakeup, self._holdings, owner=owner, metrics=self._metrics,
                                  finishes=finishes, backlog=backlog, spawn=background.spawn,
                                  converse=group_turns.converse, draining=self._is_draining)
        self._schedule_flush = self._flushing.schedule_flush  # bound once: resolving a message calls it
        self._decoding = Decoding(store, clock, owner, self._metrics, self._schedule_flush)
        claimer = Claimer(owner, Policy(options.lease, options.max_attempts, options.due_granularity),
                          quarantine_malformed=options.malformed == "quarantine", dedupe=options.dedupe)
        self._claiming = Claiming(store, codec, clock, wakeup, pause, self._holdings, claimer=claimer,
                                  turns=Turns(options.priority_fairness), backlog=backlog, decoding=self._decoding,
                                  before_claim=before_claim, group_step=group_turns.step,
                                  schedule_flush=self._schedule_flush, spawn=background.spawn,
                                  draining=self._is_draining)
        self._backlog = backlog
        self._drainer = Draining(options, clock, self._holdings, finishes=finishes, flushing=self._flushing,
                                 background=background, claims_landed=self._claiming.claims_landed)
        # Claims that took a bucket (True) or found none (False), for the bench's measure of claim conflicts
        self.claim_counts: Counter[bool] = self._claiming.claim_counts

    def _is_draining(self) -> bool:
        return self._draining

    async def drain(self) -> None:
        """Stop claiming and wake the reserves waiting, then drain (``Draining.drain``: served messages waited
        for, held buckets flushed and released, within ``drain_timeout`` plus one ``write_timeout``)."""
        self._draining = True
        self._wakeup.notify()
        await self._drainer.drain()

    # -- reserving -----------------------------------------------------------------------------------------

    async def reserve(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when none arrives within ``timeout`` seconds (None: wait forever). Under a
        rate limit, a permit is taken first (waiting for the next window while this one's are spent)."""
        if self._draining:
            raise QueueClosed("the consumer is draining or closed")
        if type(timeout) is not float or timeout != timeout:  # else a number of seconds already: no call
            timeout = check_timeout(timeout)
        permits = self._permits  # read once: a concurrent reserve may drop them while this one awaits
        if permits is None:
            # A message at hand is served without a further coroutine (most reserves of a busy consumer).
            message = self._next_message()
            if message is None:
                message = await self._reserve(timeout)
        else:
            deadline = None if timeout is None else time.monotonic() + timeout
            await self._before_claim()  # the permits are counted by the server's clock: synced first
            if permits.unlimited:  # the queue has none (learned at set-up): served without permits
                self._permits = None
                return await self.reserve(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not await permits.wait_for_one(deadline, lambda: self._draining):
                return None
            message = await self._reserve(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if message is None:
                permits.give_back(1)
        if message is not None and self._claiming.ahead_unsent:
            # Yield until the claim ahead has sent its request (after the pause read, if one is due): tasks whose
            # handlers never await I/O would not yield before the messages at hand run out, and its round trip
            # would not overlap their work. Every such task yields once a message meanwhile, so it is soon its turn.
            await asyncio.sleep(0)
        return message

    async def _reserve(self, timeout: float | None) -> Message | None:
        """``reserve`` when no message is at hand: claim, or wait for a wake-up, until one is or ``timeout``."""
        self._flushing.start()  # before the first claim: a message at hand means the flusher runs already
        deadline = None if timeout is None else time.monotonic() + timeout
        claimed = False
        must_claim = timeout == 0  # a reserve that may not wait claims once, wake-up or not
        while True:
            message = self._next_message()
            if message is not None:
                return message
            if self._draining:
                return None
            if claimed and deadline is not None and time.monotonic() >= deadline:
                # The last claim took a bucket with nothing to serve (an ordered group's bucket that must wait, one
                # gone to quarantine): it counts as an attempt, not as a reason to claim on past the timeout.
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
        # under a rate limit, as many further messages as the window has permits left for, without waiting
        allowed = n
        permits = self._permits
        if permits is not None:
            try:
                allowed = 1 + await permits.take(n - 1)
            except PyMongoError as exc:  # the message at hand is held: hand it over
                log.warning("asking for rate-limit permits failed, returning the message at hand: %s", exc)
                allowed = 1
        fruitless = False  # the last claim took a bucket with nothing to serve (an ordered group's that must wait)
        while len(batch) < allowed and not self._draining:
            if self._next_messages(batch, allowed):
                fruitless = False
                continue
            if fruitless:  # claim no further: each such claim only pushes another ordered group's bucket back
                break
            try:
                message, claimed = await self._next_or_claim()
            except PyMongoError as exc:  # the batch is held: hand it over; the next reserve claims again
                log.warning("claim failed, returning the %d message(s) at hand: %s", len(batch), exc)
                break
            if message is None and not claimed:
                break
            fruitless = message is None
            if message is not None:
                batch.append(message)
        if permits is not None:
            permits.give_back(allowed - len(batch))
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
        claiming = self._claiming
        async with claiming.lock:
            message = self._next_message()
            if message is None and claiming.ahead is not None and not claiming.ahead.done():
                await claiming.ahead_landed()
                message = self._next_message()
            if message is not None or self._draining or not (force or self._wakeup.ready):
                return message, False
            await self._before_claim()  # its errors reach the reserve, as before a first claim
            try:
                claimed = await claiming.claim()
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
        """The next message at hand, if any; the claim ahead is started when it came from the newest bucket held
        while the queue has a backlog and no claim is under way (``Claiming.start_ahead``)."""
        now = self._clock.latest()  # serve only while no reading of the clock could put the lease past its end
        for holding in self._holdings:
            held = holding.held
            while held.unserved:  # else every slot is handed out: the bucket waits for its acks and final flush
                slot = held.serve(now)
                if slot is None:
                    if held.finished:  # the last slots were dead-lettered unserved
                        self._schedule_flush(holding)
                    break
                payload = holding.payloads[slot]
                if holding.load is not None:  # a bucket its writer checked: each payload decoded as it is served
                    try:
                        payload = holding.load(payload)
                    except Exception as exc:
                        self._decoding.undecodable(holding, slot, exc)
                        continue
                self._metrics.consumed(1)
                if holding is self._holdings[-1]:  # the checks inline, not a call: most messages come here
                    claiming = self._claiming
                    if ((claiming.ahead is None or claiming.ahead.done()) and not claiming.lock.locked()
                            and self._backlog.likely(held)):
                        claiming.start_ahead(holding)
                return Message(payload, self, holding, slot)
        return None

    def _next_messages(self, batch: list[Message], n: int) -> bool:
        """``_next_message`` for ``reserve_many``: add to ``batch`` up to ``n`` in all, a held bucket's at a time
        (one clock reading, one count); whether it added any."""
        now, before = self._clock.latest(), len(batch)
        for holding in self._holdings:
            held = holding.held
            if not held.unserved:
                continue
            slots = held.serve_many(now, n - len(batch))
            if not slots:
                if held.finished:
                    self._schedule_flush(holding)
                continue
            stored = holding.payloads
            if holding.load is None:
                payloads = list(map(stored.__getitem__, slots))
            else:  # a bucket its writer checked: each payload decoded as it is served
                try:
                    payloads = list(map(holding.load, map(stored.__getitem__, slots)))
                except Exception:  # one at a time, to quarantine each that fails
                    slots, payloads = self._decoding.decoded(holding, slots)
            batch += map(Message, payloads, repeat(self), repeat(holding), slots)
            if len(batch) >= n:
                break
        if len(batch) == before:
            return False
        self._metrics.consumed(len(batch) - before)
        return True

    # -- resolving -----------------------------------------------------------------------------------------

    def ack_at_once(self, holding: Holding, slot: int) -> bool:
        """Ack ``slot`` now, without a coroutine (``Message.ack``, ``ack_many``); False, having done nothing,
        when the ack has a dedupe key to store first and so goes through ``resolve``."""
        held = holding.held
        if self._options.dedupe and held.bucket.keys[slot] is not None:
            return False
        if held.ack(slot):  # True: a flush is due
            self._schedule_flush(holding)
        return True

    async def ack_many(self, messages: Iterable[Message], *, wait: bool = False) -> None:
        """Ack each of ``messages`` in turn, as ``message.ack(wait=wait)`` of each would, in one call: the first
        that raises (``LeaseLost``, ``AlreadyResolved``) stops it, the ones before it are acked. With ``wait``,
        returns once every ack is written. ``InvalidOption``, before any ack, for what is not a message of this
        consumer's."""
        messages = list(messages)
        # checked in C when each is a Message of this consumer's, as in a reserve_many batch
        if not set(map(type, messages)) <= {Message} or not set(map(_CONSUMER, messages)) <= {self}:
            for message in messages:
                if not isinstance(message, Message) or message._consumer is not self:
                    raise InvalidOption(f"not a message this queue's consumer handed out: {message!r:.80}")
        futures: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        try:
            for holding, slots in _runs(messages):  # a run of messages of one bucket at a time
                held = holding.held
                if wait or (self._options.dedupe and any(held.bucket.keys[slot] is not None for slot in slots)):
                    for slot in slots:  # one by one: a future each, or a dedupe key to store first
                        if not self.ack_at_once(holding, slot):
                            await self.resolve(holding, slot, ("ack", None, ""), wait=wait)
                        elif wait:
                            futures.append(loop.create_future())
                            holding.waiters[slot] = futures[-1]
                            self._schedule_flush(holding)
                    continue
                try:
                    held.ack_each(slots)
                finally:  # the acks made before one that raised are flushed as theirs would be
                    if held.finished or held.held_back is not None:
                        self._schedule_flush(holding)
        finally:
            if futures:  # the acks made before a failure are still waited for
                await asyncio.gather(*futures)

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
            if self._options.dedupe and key is not None and not held.cancel_requested(slot):  # else no ack
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


_CONSUMER, _HOLDING, _SLOT = attrgetter("_consumer"), attrgetter("_holding"), attrgetter("_slot")


def _runs(messages: list[Message]) -> Iterator[tuple[Holding, list[int]]]:
    """``(holding, slots)`` of each run of ``messages`` from one bucket, in order: one for a batch from one bucket
    (found in C, as most ``reserve_many`` batches are)."""
    holdings: list[Holding] = list(map(_HOLDING, messages))
    ids = list(map(id, holdings))  # by identity: a Holding is a dataclass, whose == compares its fields
    if ids and ids.count(ids[0]) == len(ids):
        yield holdings[0], list(map(_SLOT, messages))
        return
    start = 0
    for stop in range(1, len(messages) + 1):
        if stop == len(messages) or holdings[stop] is not holdings[start]:
            yield holdings[start], list(map(_SLOT, messages[start:stop]))
            start = stop
