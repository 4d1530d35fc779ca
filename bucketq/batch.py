"""``BatchQueue``: the synchronous shell for batch consumers such as a Spark driver (pymongo ``MongoClient``).

A batch is up to ``max_buckets`` buckets claimed one by one with the async consumer's claim step
(``core.claim_step``) under a single token and lease: a message whose cancellation was requested before the claim
ends as cancelled there (its record, its slot done), never handed out. The caller processes them (e.g. Spark
reads ``{"lease.token": token}``), then ``commit`` copies the messages it could not decode (``Batch.malformed``)
to ``<queue>.quarantine`` and replaces the buckets by tombstones (``core.claims.finish``), or ``release`` hands
them back after a failure (tries + 1, backoff) and moves a bucket that has used up ``max_attempts`` to
``<queue>.quarantine``. Every write after the claim is fenced by the token; a write retried after a lost reply
counts as applied only if the bucket carries this token's mark (``finished_by``, ``released_by``), never merely
because the bucket changed or is gone. Copies to quarantine come after the consumer's fenced guard
(``claims.guard``): a batch whose lease passed to another copies nothing.

Which buckets a batch takes, which go to quarantine and what a failed batch releases is decided in
``core.batch_attempt`` and ``core.claim_step``; this shell carries their steps to the store.

Batch claims skip group buckets (``push(group=...)``): a batch is processed in parallel, with no order, so the
ordered groups are left to the async consumers (``claims.ungrouped``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient, ReplaceOne, UpdateOne
from pymongo.database import Database

from bucketq.core import claim_step, claims, unique
from bucketq.core.backoff import Backoff
from bucketq.core.batch_attempt import AttemptPolicy, BatchStep, ClaimNext, GiveBack, Quarantine, ReleaseWithBackoff
from bucketq.core.claim_step import Claimer, ClaimStep, Opened
from bucketq.core.conversation import carry
from bucketq.core.format import StoredBucket, as_utc, parse_bucket, quarantined_bucket, quarantined_message
from bucketq.core.held import ClaimedBucket, Policy
from bucketq.core.priorities import DEFAULT_FAIRNESS, Turns
from bucketq.core.sharding import MAX_PARTITIONS, Rotation, check_partitions, key
from bucketq.errors import InvalidOption
from bucketq.memory import MemoryClient, MemoryDatabase, SyncDatabase
from bucketq.options import (
    QueueOptions,
    check_database,
    check_delay,
    check_names,
    check_write_concern,
    tombstone_default,
)
from bucketq.shell.clock import ServerClock
from bucketq.shell.connection import reaching
from bucketq.shell.sync_database import sync_database
from bucketq.store.sync.base import retrying
from bucketq.store.sync.queue_store import QueueStore

REAP_EVERY_S = 60.0

log = logging.getLogger("bucketq")



@dataclass
class Batch:
    """Buckets held under one token. ``buckets`` are the documents as claimed (``c`` already counts this claim)."""

    token: str
    lease_until: dt.datetime
    buckets: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[Any] = field(default_factory=list)  # ids sent to quarantine by the claim itself
    # (bucket id, slot) -> why: messages the caller could not decode; ``commit`` quarantines them first
    malformed: dict[tuple[Any, int], str] = field(default_factory=dict)

    @property
    def ids(self) -> list[Any]:
        """The claimed buckets' ``_id``s."""
        return [doc["_id"] for doc in self.buckets]

    @property
    def refs(self) -> dict[Any, dict[str, Any]]:
        """The buckets' shard keys (``sharding.key``) by ``_id``."""
        return {doc["_id"]: key(doc) for doc in self.buckets}

    @property
    def messages(self) -> int:
        """How many messages the claimed buckets hold that are not done yet."""
        return sum(len(doc["p"]) - len(doc.get("done") or []) for doc in self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)


class BatchQueue:
    """The batch side of queue ``name``. ``target`` is a URI, a ``MongoClient`` or a ``Database``; for tests
    without a server also a ``bucketq.memory`` database (its ``sync`` view) or client. Every command goes
    through the queue's generated synchronous store (``bucketq.store.sync.QueueStore``): the async consumer's
    own queries and retry policy."""

    def __init__(self, target: str | MongoClient | Database | SyncDatabase | MemoryDatabase | MemoryClient, *,
                 name: str, db: str | None = None, lease: float = 300.0, max_attempts: int = 5,
                 backoff: Backoff | None = None, codecs: Iterable[str] = ("json",),
                 write_concern: int | str | None = None, op_timeout_s: float = 30.0,
                 tombstone_retention: float | None = None, partitions: int | None = None,
                 priority_fairness: int = DEFAULT_FAIRNESS) -> None:
        check_names(name, db)
        self._turns = Turns(priority_fairness)  # claims by priority, every ``priority_fairness``-th by age
        check_write_concern(write_concern)
        if tombstone_retention is None:  # follows op_timeout_s, as the queue's follows its write_timeout
            tombstone_retention = tombstone_default(check_delay(op_timeout_s))
        if check_delay(tombstone_retention) <= op_timeout_s:
            raise InvalidOption("tombstone_retention must exceed op_timeout_s (see QueueOptions.tombstone_retention)")
        if not 1 <= lease <= 86400:
            raise InvalidOption("lease must be between 1 and 86400 seconds")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidOption("max_attempts must be an int >= 1")
        if partitions is not None and not check_partitions(partitions):
            raise InvalidOption(f"partitions must be an int from 1 to {MAX_PARTITIONS} (the queue's), or None "
                                "(the default: adopt the queue's)")
        self._uri = target if isinstance(target, str) else None  # shown only redacted
        database, self._owned = sync_database(target, db, "BatchQueue")
        check_database(database, name, write_concern)
        self.name = name
        self.database = database
        self.store = QueueStore(database, name, write_concern=write_concern, op_timeout_s=op_timeout_s,
                                partitions=partitions)
        self._rotation = Rotation()
        self.lease = float(lease)
        self.policy = AttemptPolicy(max_attempts, backoff or Backoff(), frozenset(codecs))
        self.op_timeout_s = op_timeout_s
        self.owner = claims.owner_name()
        # The claim step's (the consumer's), skipping ordered groups: a batch is processed in parallel, with no order.
        # Its state machine only ends the messages cancelled before the claim: no nack makes a retry copy.
        self._claimer = Claimer(self.owner, Policy(self.lease, max_attempts, QueueOptions.due_granularity),
                                ordered=False)
        self._host = self.owner.rsplit(":", 1)[0]
        self._clock = ServerClock()
        self.tombstone_retention = float(tombstone_retention)
        self._reaped_at: float | None = None

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """A server that never answered raises ``ServerUnreachable`` (after the store's retries)."""
        with reaching(self._uri, "the operation", f"op_timeout_s {self.op_timeout_s:g} s", self.database.client):
            yield

    def now(self) -> dt.datetime:
        """The server's time, as this queue's clock reads it (the clock leases are measured on)."""
        return self._synced().now()

    def _synced(self) -> ServerClock:
        if self._clock.stale:
            with self._reaching():
                retrying(lambda _: self._clock.sync_blocking(self.database, self.op_timeout_s),
                         timeout_s=self.op_timeout_s)
        return self._clock

    # -- claim ---------------------------------------------------------------------------------------------

    def reap_tombstones(self) -> int:
        """Delete the tombstones of buckets finished more than ``tombstone_retention`` ago (the async queue's
        housekeeping does the same); ``claim`` calls it at most once a minute."""
        self._reaped_at = time.monotonic()
        now = self.now()
        with self._reaching():
            return retrying(lambda _: self.store.reap_tombstones(now, self.tombstone_retention),
                            timeout_s=self.op_timeout_s)

    def claim(self, max_buckets: int) -> Batch | None:
        """Claim up to ``max_buckets`` due buckets under one new token; None when none is due or the queue is
        paused (``Queue.pause``)."""
        if max_buckets < 1:
            raise InvalidOption("max_buckets must be at least 1")
        if self._reaped_at is None or time.monotonic() - self._reaped_at > REAP_EVERY_S:
            self.reap_tombstones()
        batch = Batch(claims.new_token(), self.now() + dt.timedelta(seconds=self.lease))
        batch.buckets, batch.quarantined = carry(self.policy.fill(max_buckets),
                                                 functools.partial(self._batch_step, batch.token))
        for doc in batch.buckets:
            batch.lease_until = min(batch.lease_until, as_utc(doc["lease"]["until"]))
        return batch if batch.buckets or batch.quarantined else None

    def _batch_step(self, token: str, step: BatchStep) -> Any:
        """One step of ``core.batch_attempt``'s conversations, for the batch of ``token``, carried to the store."""
        match step:
            case ClaimNext(check_pause):
                return carry(claim_step.claim(self._claimer, self._rotation, self._turns, token=token,
                                              check_pause=check_pause), functools.partial(self._claim_step, token))
            case Quarantine(doc, reason):
                return self._quarantine(doc, token, reason)
            case GiveBack(doc):
                return self._fenced(token, {doc["_id"]: key(doc)},
                                    lambda ref: UpdateOne(claims.fenced(ref, token), claims.release(self.now(), token)),
                                    claims.released_by)
            case ReleaseWithBackoff(due):
                now, when = self.now(), {ref["_id"]: at for ref, at in due}
                return self._fenced(token, {ref["_id"]: ref for ref, _ in due},
                                    lambda ref: UpdateOne(claims.fenced(ref, token),
                                                          claims.release(now, token, due=when[ref["_id"]],
                                                                         count_claim=True)),
                                    claims.released_by)
        raise AssertionError(f"unknown step {step!r}")

    def _claim_step(self, token: str, step: ClaimStep) -> Any:
        """One step of the claim step's conversation (``core.claim_step``, the consumer's), for the batch of
        ``token``, carried to the store. A batch skips ordered groups: no step of a group's turn comes."""
        match step:
            case claim_step.ReadPause():  # paused by an operator (Queue.pause): claim nothing, as the consumers do
                with self._reaching():
                    return retrying(lambda _: self.store.read_pause(), timeout_s=self.op_timeout_s)
            case claim_step.ReadClock():
                clock = self._synced()
                return clock.now(), clock.earliest()
            case claim_step.ReadPartitions():
                with self._reaching():  # the queue's count: read (retried, as the pause) until the queue has a layout
                    return retrying(lambda _: self.store.partition_count(), timeout_s=self.op_timeout_s)
            case claim_step.Claim(spec):
                with self._reaching():
                    return self.store.claim(spec)
            case claim_step.Quarantine(doc, _, reason):
                return self._quarantine(doc, token, reason)
            case claim_step.Open(bucket, doc):
                refusal = self.policy.refusal(bucket, doc)
                return Opened() if refusal is None else refusal
            case claim_step.Hold(held, _, doc):
                if held.dirty:  # messages ended at the claim (cancelled): written before Spark reads the bucket
                    self._write_ended(held, doc)
                return None
        raise AssertionError(f"unknown step {step!r}")

    def _write_ended(self, held: ClaimedBucket, doc: dict[str, Any]) -> None:
        """Write what the claim step resolved in ``held`` (``doc``, as claimed): the records of its cancelled
        messages, then their slots marked done (or the bucket finished, when nothing is left), as the consumer's
        flush does; ``doc`` is updated to match, so that the batch counts and hands out only the rest."""
        plan = held.take_plan(self.now(), host=self._host, pid=os.getpid())
        with self._reaching():
            applied = self.store.write_plan(plan)
        held.outcome(plan, applied)
        if applied:
            doc["done"] = sorted({*(doc.get("done") or ()), *plan.slots})
            if held.bucket.unique:
                self._free_keys(unique.freed(held.bucket, plan.slots))

    # -- after processing ----------------------------------------------------------------------------------

    def extend(self, batch: Batch) -> int:
        """Push the lease out by ``lease`` seconds; returns how many buckets are still held."""
        now = self.now()
        held = self._fenced(batch.token, batch.refs,
                            lambda ref: UpdateOne(claims.fenced(ref, batch.token), claims.extend(now, self.lease)),
                            claims.fenced)
        batch.lease_until = now + dt.timedelta(seconds=self.lease)
        return len(held)

    def commit(self, batch: Batch) -> int:
        """End the batch: first the messages in ``batch.malformed`` are copied to quarantine (idempotent by
        message id), then every bucket is replaced by a tombstone (fenced: a bucket whose lease was taken over
        is left alone). Returns how many buckets this batch finished."""
        self._quarantine_messages(batch)
        now = self.now()
        finished = set(self._fenced(batch.token, batch.refs,
                                    lambda ref: ReplaceOne(claims.fenced(ref, batch.token),
                                                           claims.finish(now, batch.token, ref["pt"])),
                                    claims.finished_by))
        self._free_keys(self._held_keys([doc for doc in batch.buckets if doc["_id"] in finished]))
        return len(finished)

    def release(self, batch: Batch, error: BaseException | str) -> dict[str, list[Any]]:
        """After a failed batch: buckets with attempts left are due again after the backoff, tries + 1;
        the others go to quarantine with ``error``. Returns the ids ``{"released": [...], "quarantined": [...]}``
        (``released``: the buckets this batch's release applied to; one whose lease was lost is in neither)."""
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return carry(self.policy.fail(batch.buckets, reason, self.now()),
                     functools.partial(self._batch_step, batch.token))

    def _guard(self, token: str, refs: dict[Any, dict[str, Any]]) -> set[Any]:
        """The fenced lease extension that comes before copies, as the consumer's (``claims.guard``): returns the
        buckets still held, the only ones whose messages may be copied; a claimant whose lease passed to another
        must not copy what the other now holds."""
        now = self.now()
        return set(self._fenced(token, refs, lambda ref: UpdateOne(claims.fenced(ref, token),
                                                                   claims.guard(now, self.lease)), claims.fenced))

    def _quarantine(self, doc: dict[str, Any], token: str, reason: str) -> bool:
        """The guard, the copy (idempotent by ``_id``), then the fenced finish: as the consumer does. False when
        the lease was lost: nothing is copied."""
        ref = key(doc)
        if not self._guard(token, {doc["_id"]: ref}):
            return False
        entry = quarantined_bucket(doc, reason=reason, at=self.now(), host=self._host, pid=os.getpid())
        with self._reaching():
            self.store.add_to_quarantine([entry])
        if not self._fenced(token, {doc["_id"]: ref},
                            lambda ref: ReplaceOne(claims.fenced(ref, token),
                                                   claims.finish(self.now(), token, ref["pt"])),
                            claims.finished_by):
            return False
        self._free_keys(self._held_keys([doc]))
        return True

    def _free_keys(self, held: dict[str, str]) -> None:
        """Free the keys of the unique jobs that finished (``{key: message id}``), as the consumer's finish does:
        else pushes of those keys would merge into jobs that are over until ``unique_for`` passes. A failed delete
        leaves them held until then (logged)."""
        if not held:
            return
        try:
            with self._reaching():
                self.store.release_keys(held)
        except Exception as exc:
            log.warning("unique keys %s of finished jobs stay held until they expire: %s", sorted(held), exc)

    @staticmethod
    def _held_keys(finished: list[dict[str, Any]]) -> dict[str, str]:
        """The keys that the buckets ``finished`` (as claimed, now tombstones) held. A bucket whose fields do not
        hold together (quarantined as malformed) keeps its keys until ``unique_for`` passes."""
        held: dict[str, str] = {}
        for doc in finished:
            if doc.get("u"):
                with contextlib.suppress(LookupError, TypeError):
                    held |= unique.held_by(doc)
        return held

    def _quarantine_messages(self, batch: Batch) -> None:
        """Copy each message of ``batch.malformed`` to quarantine (``kind: "message"``, its payload as stored), for
        the buckets still held (``_guard``)."""
        if not batch.malformed:
            return
        refs = batch.refs
        held_ids = self._guard(batch.token, {bucket_id: refs[bucket_id] for bucket_id, _ in batch.malformed})
        at = self.now()
        parsed: dict[Any, StoredBucket] = {}
        held = {doc["_id"]: doc for doc in batch.buckets}
        entries = []
        for (bucket_id, slot), reason in batch.malformed.items():
            if bucket_id not in held_ids:
                continue
            if bucket_id not in parsed:
                parsed[bucket_id] = parse_bucket(held[bucket_id])
            entries.append(quarantined_message(parsed[bucket_id], slot, reason=reason, at=at, host=self._host,
                                               pid=os.getpid()))
        with self._reaching():
            self.store.add_to_quarantine(entries)

    def _fenced(self, token: str, refs: dict[Any, dict[str, Any]], write: Callable[[dict[str, Any]], Any],
                proof: Callable[[Any, str], dict]) -> list[Any]:
        """Fenced per-bucket writes (``QueueStore.fenced_many``): ``write(ref)`` for each bucket of ``refs`` (id ->
        shard key), each proven by ``proof(ref, token)``: the mark this token's own write leaves
        (``claims.finished_by``, ``released_by``; ``fenced`` for a write that keeps the token)."""
        with self._reaching():
            return self.store.fenced_many({i: write(ref) for i, ref in refs.items()},
                                          {i: proof(ref, token) for i, ref in refs.items()})

    def close(self) -> None:
        """Close the client this queue opened from a URI (a client or database passed in is left open)."""
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> BatchQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
