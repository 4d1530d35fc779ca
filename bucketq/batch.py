"""``BatchQueue``: the synchronous shell for batch consumers such as a Spark driver (pymongo ``MongoClient``).

A batch is up to ``max_buckets`` buckets claimed one by one with the shared claim (``core.claims.claim``) under
a single token and lease. The caller processes them (e.g. Spark reads ``{"lease.token": token}``), then
``commit`` deletes them, or ``release`` hands them back after a failure (tries + 1, backoff) and moves a bucket
that has used up ``max_attempts`` to ``<queue>.quarantine``. Every write after the claim is fenced by the token.

Attempts of a bucket: ``max(t) + c`` counting the current claim (a message's tries are ``t[slot] + c - 1``).
A bucket on its last attempt is claimed alone, so a poisoned bucket cannot take good ones to quarantine with
it; one claimed past its last attempt (leases expired: the job died or hung) goes to quarantine at once.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo import DeleteOne, MongoClient, ReturnDocument, UpdateOne, WriteConcern
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, PyMongoError

from bucketq.clock import ServerClock
from bucketq.core import claims
from bucketq.core.backoff import Backoff
from bucketq.core.format import as_utc, parse_bucket, quarantined_bucket
from bucketq.errors import InvalidOption, MalformedBucket
from bucketq.store import RETRY_FIRST_S, RETRY_MAX_S, is_transient

T = TypeVar("T")


@dataclass
class Batch:
    """Buckets held under one token. ``buckets`` are the documents as claimed (``c`` already counts this claim)."""

    token: str
    lease_until: dt.datetime
    buckets: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[Any] = field(default_factory=list)  # ids sent to quarantine by the claim itself

    @property
    def ids(self) -> list[Any]:
        return [doc["_id"] for doc in self.buckets]

    @property
    def messages(self) -> int:
        return sum(len(doc["p"]) - len(doc.get("done") or []) for doc in self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)


def attempts(doc: dict[str, Any]) -> int:
    """Attempts at the bucket's messages, the current claim included."""
    return max((t or 0 for t in doc.get("t") or []), default=0) + int(doc.get("c") or 0)


class SyncServerClock(ServerClock):
    def sync_with(self, client: MongoClient) -> None:
        before = time.time()
        reply = client.admin.command("isMaster")
        after = time.time()
        if isinstance(reply.get("localTime"), dt.datetime):
            self.offset_s = as_utc(reply["localTime"]).timestamp() - (before + after) / 2
        self._synced_at = time.monotonic()

    def now_synced(self, client: MongoClient) -> dt.datetime:
        if self.stale:
            self.sync_with(client)
        return self.now()


class BatchQueue:
    """The batch side of queue ``name``. ``target`` is a URI, a ``MongoClient`` or a ``Database``."""

    def __init__(self, target: str | MongoClient | Database, *, name: str, db: str | None = None,
                 lease: float = 300.0, max_attempts: int = 5, backoff: Backoff | None = None,
                 codecs: Iterable[str] = ("json",), write_concern: int | str | None = None,
                 op_timeout_s: float = 30.0) -> None:
        if not 1 <= lease <= 86400:
            raise InvalidOption("lease must be between 1 and 86400 seconds")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidOption("max_attempts must be an int >= 1")
        self._owned: MongoClient | None = None
        if isinstance(target, str):
            self._owned = MongoClient(target, tz_aware=True, connect=False)
            database = self._owned[db] if db else self._owned.get_default_database("bucketq")
        elif isinstance(target, MongoClient):
            database = target[db] if db else target.get_default_database("bucketq")
        elif isinstance(target, Database):
            database = target if db is None else target.client[db]
        else:
            raise InvalidOption(f"BatchQueue needs a URI, a MongoClient or a Database, got {type(target).__name__}")
        wc = {"write_concern": WriteConcern(w=write_concern)} if write_concern is not None else {}
        self.name = name
        self.database = database
        self.buckets = database[name].with_options(**wc)
        self.quarantine = database[f"{name}.quarantine"].with_options(**wc)
        self.lease = float(lease)
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.codecs = frozenset(codecs)
        self.op_timeout_s = op_timeout_s
        self.owner = claims.owner_name()
        self._clock = SyncServerClock()

    def now(self) -> dt.datetime:
        return self._clock.now_synced(self.database.client)

    # -- claim ---------------------------------------------------------------------------------------------

    def claim(self, max_buckets: int) -> Batch | None:
        """Claim up to ``max_buckets`` due buckets under one new token; None when none is due."""
        if max_buckets < 1:
            raise InvalidOption("max_buckets must be at least 1")
        batch = Batch(claims.new_token(), self.now() + dt.timedelta(seconds=self.lease))
        while len(batch.buckets) < max_buckets:
            query, update, sort = claims.claim(self.now(), self.lease, batch.token, self.owner)
            # Not retried (as in the consumer): a claim whose reply was lost expires with its lease.
            doc = self.buckets.find_one_and_update(query, update, sort=sort, return_document=ReturnDocument.AFTER)
            if doc is None:
                break
            batch.lease_until = min(batch.lease_until, as_utc(doc["lease"]["until"]))
            reason = self._unreadable(doc)
            if reason is None and attempts(doc) > self.max_attempts:
                reason = (f"claimed {attempts(doc) - 1} times without a commit or release "
                          "(leases expired: the job died or hung)")
            if reason is not None:
                self._quarantine(doc, batch.token, reason)
                batch.quarantined.append(doc["_id"])
                continue
            last_attempt = attempts(doc) >= self.max_attempts
            if last_attempt and batch.buckets:  # the last attempt runs alone: give it back untouched
                self._fenced_write([UpdateOne(claims.fenced(doc["_id"], batch.token), claims.release(self.now()))])
                break
            batch.buckets.append(doc)
            if last_attempt:
                break
        return batch if batch.buckets or batch.quarantined else None

    def _unreadable(self, doc: dict[str, Any]) -> str | None:
        try:
            bucket = parse_bucket(doc)
        except MalformedBucket as exc:
            return str(exc)
        if bucket.codec not in self.codecs:
            return f"codec {bucket.codec!r} is not readable by this batch consumer ({', '.join(sorted(self.codecs))})"
        return None

    # -- after processing ----------------------------------------------------------------------------------

    def extend(self, batch: Batch) -> int:
        """Push the lease out by ``lease`` seconds; returns how many buckets are still held."""
        now = self.now()
        held = self._fenced_write([UpdateOne(claims.fenced(i, batch.token), claims.extend(now, self.lease))
                                   for i in batch.ids])
        batch.lease_until = now + dt.timedelta(seconds=self.lease)
        return held

    def commit(self, batch: Batch) -> int:
        """Delete the batch's buckets (fenced: a bucket whose lease was taken over is left alone). Returns how
        many were deleted by this call."""
        return self._fenced_write([DeleteOne(claims.fenced(i, batch.token)) for i in batch.ids])

    def release(self, batch: Batch, error: BaseException | str) -> dict[str, list[Any]]:
        """After a failed batch: buckets with attempts left are due again after the backoff, tries + 1;
        the others go to quarantine with ``error``. Returns the ids ``{"released": [...], "quarantined": [...]}``."""
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        now = self.now()
        out: dict[str, list[Any]] = {"released": [], "quarantined": []}
        ops = []
        for doc in batch.buckets:
            tried = attempts(doc)
            if tried >= self.max_attempts:
                self._quarantine(doc, batch.token, f"failed {tried} attempt(s) in a batch job; last error: {reason}")
                out["quarantined"].append(doc["_id"])
            else:
                due = now + dt.timedelta(seconds=max(0.0, self.backoff.delay(tried - 1)))
                ops.append(UpdateOne(claims.fenced(doc["_id"], batch.token),
                                     claims.release(now, due=due, count_claim=True)))
                out["released"].append(doc["_id"])
        self._fenced_write(ops)
        return out

    def _quarantine(self, doc: dict[str, Any], token: str, reason: str) -> None:
        """The copy first (idempotent by ``_id``), then the fenced delete: as the consumer does."""
        entry = quarantined_bucket(doc, reason=reason[:4000], at=self.now(), host=self.owner.rsplit(":", 1)[0],
                                   pid=os.getpid())
        entry["doc"].pop("lease", None)

        def copy() -> None:
            try:
                self.quarantine.insert_one(entry)
            except DuplicateKeyError:
                pass  # an earlier attempt got through

        self._retrying(copy)
        self._fenced_write([DeleteOne(claims.fenced(doc["_id"], token))])

    def _fenced_write(self, ops: list[Any]) -> int:
        """Run fenced per-bucket writes; returns how many matched. A retry after an ambiguous error may count
        less (a release cleared the token, a delete removed the bucket): nothing is applied twice."""
        if not ops:
            return 0
        result = self._retrying(lambda: self.buckets.bulk_write(ops, ordered=False))
        return result.deleted_count if isinstance(ops[0], DeleteOne) else result.matched_count

    def _retrying(self, op: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.op_timeout_s
        delay = RETRY_FIRST_S
        while True:
            try:
                return op()
            except PyMongoError as exc:
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(RETRY_MAX_S, delay * 2)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> BatchQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
