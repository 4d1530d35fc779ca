"""A batch consumer's attempt policy (``bucketq.batch.BatchQueue``), sans-I/O: which buckets a batch takes, which
go to quarantine and why, and what a failed batch releases with which backoff. Generators yield the next store
call (a ``BatchStep``) and take its reply back; the shell only carries them (``BatchQueue._batch_step``). Each
bucket is claimed by the claim step (``core.claim_step``), the async consumer's, which ``refusal`` answers for.

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
from bucketq.core.claim_step import Claimed
from bucketq.core.format import StoredBucket
from bucketq.core.sharding import key as shard_key


@dataclass(frozen=True)
class ClaimNext:
    """Claim one more bucket under the batch's token: the claim step (``claim_step.claim``, reading the pause
    when ``check_pause``); reply: its ``Claimed``."""

    check_pause: bool


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

    def refusal(self, bucket: StoredBucket, doc: dict[str, Any]) -> str | None:
        """Why a claimed bucket (``doc``, parsed as ``bucket``) must go to quarantine rather than into a batch, or
        None: the claim step's ``Open``, answered for a batch."""
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
        check_pause = True  # the first claim reads it: the others fill the batch it began
        while len(taken) < max_buckets:
            claimed: Claimed = yield ClaimNext(check_pause)
            check_pause = False
            if not claimed.taken or claimed.doc is None:
                break
            if claimed.held is None:  # sent to quarantine (no ordered group is claimed by a batch)
                if claimed.stored:
                    quarantined.append(claimed.doc["_id"])
                continue
            if claimed.held.ended:  # every message of it ended at the claim (cancelled), or its lease was lost
                continue
            doc = claimed.doc
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
