"""A batch consumer's attempt policy (``bucketq.batch.BatchQueue``), sans-I/O: which buckets a batch takes, which
go to quarantine and why, and what a failed batch releases with which backoff. Generators yield the next store
call (a ``BatchStep``) and take its reply back; the shell only carries them (``BatchQueue._converse``).

Attempts of a bucket: ``max(t) + c`` counting the current claim (a message's tries are ``t[slot] + c - 1``). A
bucket on its last attempt is claimed alone, so a poisoned bucket cannot take good ones to quarantine with it;
one claimed past its last attempt (leases expired: the job died or hung) goes to quarantine at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Generator
from dataclasses import dataclass
from typing import Any

from bucketq.core.backoff import Backoff
from bucketq.core.format import parse_bucket
from bucketq.core.sharding import key as shard_key
from bucketq.errors import MalformedBucket


@dataclass(frozen=True)
class ClaimNext:
    """Claim one more bucket under the batch's token; reply: (the bucket, None), (None, None) when none is due,
    or (the bucket, why it must go to quarantine) (``QueueStore.claim``)."""


@dataclass(frozen=True)
class Quarantine:
    """Copy ``doc`` to quarantine with ``reason`` and finish it, fenced; reply: whether it was (False: the lease
    was lost, nothing copied)."""

    doc: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class GiveBack:
    """Release ``doc`` untouched (no try added), fenced; reply: not used."""

    doc: dict[str, Any]


@dataclass(frozen=True)
class ReleaseWithBackoff:
    """Release the buckets of ``due`` (shard key, due again at) with a try added, fenced; reply: the ``_id``s
    released."""

    due: list[tuple[dict[str, Any], dt.datetime]]


BatchStep = ClaimNext | Quarantine | GiveBack | ReleaseWithBackoff


def attempts(doc: dict[str, Any]) -> int:
    """Attempts at the bucket's messages, the current claim included."""
    return max((t or 0 for t in doc.get("t") or []), default=0) + int(doc.get("c") or 0)


@dataclass(frozen=True)
class AttemptPolicy:
    """``max_attempts`` per bucket, the ``backoff`` between them, the ``codecs`` the batch job reads."""

    max_attempts: int
    backoff: Backoff
    codecs: Collection[str]

    def refusal(self, doc: dict[str, Any]) -> str | None:
        """Why a claimed bucket must go to quarantine rather than into a batch, or None."""
        try:
            bucket = parse_bucket(doc)
        except MalformedBucket as exc:
            return str(exc)
        if bucket.codec not in self.codecs:
            return f"codec {bucket.codec!r} is not readable by this batch consumer ({', '.join(sorted(self.codecs))})"
        if attempts(doc) > self.max_attempts:
            return (f"claimed {attempts(doc) - 1} times without a commit or release "
                    "(leases expired: the job died or hung)")
        return None

    def fill(self, max_buckets: int) -> Generator[BatchStep, Any, tuple[list[dict[str, Any]], list[Any]]]:
        """Claim up to ``max_buckets`` buckets; returns those taken and the ``_id``s sent to quarantine."""
        taken: list[dict[str, Any]] = []
        quarantined: list[Any] = []
        while len(taken) < max_buckets:
            doc, reason = yield ClaimNext()
            if doc is None:
                break
            reason = reason or self.refusal(doc)
            if reason is not None:
                if (yield Quarantine(doc, reason)):
                    quarantined.append(doc["_id"])
                continue
            last_attempt = attempts(doc) >= self.max_attempts
            if last_attempt and taken:  # the last attempt runs alone: give it back untouched
                yield GiveBack(doc)
                break
            taken.append(doc)
            if last_attempt:
                break
        return taken, quarantined

    def fail(self, docs: list[dict[str, Any]], reason: str,
             now: dt.datetime) -> Generator[BatchStep, Any, dict[str, list[Any]]]:
        """After a failed batch of ``docs``: buckets with attempts left are due again after the backoff, tries + 1;
        the others go to quarantine with ``reason``. Returns the ``_id``s ``{"released": [...], "quarantined":
        [...]}`` (a bucket whose lease was lost is in neither)."""
        out: dict[str, list[Any]] = {"released": [], "quarantined": []}
        due: list[tuple[dict[str, Any], dt.datetime]] = []
        for doc in docs:
            tried = attempts(doc)
            if tried >= self.max_attempts:
                if (yield Quarantine(doc, f"failed {tried} attempt(s) in a batch job; last error: {reason}")):
                    out["quarantined"].append(doc["_id"])
            else:
                due.append((shard_key(doc), now + dt.timedelta(seconds=max(0.0, self.backoff.delay(tried - 1)))))
        out["released"] = yield ReleaseWithBackoff(due)
        return out
