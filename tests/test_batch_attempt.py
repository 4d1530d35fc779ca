"""Property test of the batch consumer's attempt policy (``bucketq.core.batch_attempt``, each claim made by the
claim step, ``core.claim_step``): batches are claimed, committed, failed or abandoned (their leases expire) in any
order, against a model of the queue's buckets and their claim counts. A bucket on its last attempt is in a batch
alone, none is taken past its last attempt, a failed batch releases each bucket with attempts left after the backoff
and quarantines the others, unreadable buckets go to quarantine at once, and no bucket is lost or counted twice."""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator
from typing import Any

import bson
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bucketq.core import claim_step
from bucketq.core.backoff import Backoff
from bucketq.core.batch_attempt import (
    AttemptPolicy,
    BatchStep,
    ClaimNext,
    GiveBack,
    Quarantine,
    ReleaseWithBackoff,
    attempts,
)
from bucketq.core.claim_step import Claimer, ClaimStep, Opened
from bucketq.core.conversation import carry
from bucketq.core.format import Slot, bucket_document, parse_bucket
from bucketq.core.held import Policy
from bucketq.core.priorities import DEFAULT_FAIRNESS, Turns
from bucketq.core.sharding import Rotation
from tests.helpers import examples

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
POLICY = AttemptPolicy(max_attempts=3, backoff=Backoff(base=1.0, factor=2.0, maximum=60.0, jitter=0.0),
                       codecs={"json"})
CLAIMER = Claimer("batch-host:1", Policy(lease=60.0, max_attempts=3, granularity=1.0), ordered=False)


class BatchAttemptMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[Any, dict[str, Any]] = {}  # claimable, by _id, in claim order
        self.held: list[dict[str, Any]] | None = None  # the batch being processed
        self.lost_leases: set[Any] = set()  # held buckets whose lease passed on: fenced writes refused
        self.quarantined: dict[Any, str] = {}
        self.finished: set[Any] = set()
        self.released_due: dict[Any, dt.datetime] = {}
        self.pushed = 0

    # -- the store, as ``BatchQueue._batch_step`` drives it ---------------------------------------------------

    def run(self, conversation: Generator[BatchStep, Any, Any]) -> Any:
        return carry(conversation, self.execute)

    def execute(self, step: BatchStep | ClaimStep) -> Any:
        match step:
            case ClaimNext(check_pause):  # the claim step, as the batch queue carries it
                return carry(claim_step.claim(CLAIMER, Rotation(), Turns(DEFAULT_FAIRNESS), token="batch",
                                              check_pause=check_pause), self.execute)
            case claim_step.ReadPause():
                return False
            case claim_step.ReadClock():
                return T0, T0
            case claim_step.ReadPartitions():
                return 1
            case claim_step.Claim():
                if not self.waiting:
                    return None, None
                doc = self.waiting.pop(next(iter(self.waiting)))
                doc["c"] = doc.get("c", 0) + 1
                return doc, None
            case claim_step.Open(bucket, doc):
                refusal = POLICY.refusal(bucket, doc)
                return Opened() if refusal is None else refusal
            case claim_step.Hold():
                return None
            case Quarantine(doc, reason) | claim_step.Quarantine(doc, _, reason):
                if doc["_id"] in self.lost_leases:
                    return False
                assert doc["_id"] not in self.quarantined and doc["_id"] not in self.finished
                self.quarantined[doc["_id"]] = reason
                return True
            case GiveBack(doc):
                doc["c"] -= 1
                self.waiting[doc["_id"]] = doc
                return [doc["_id"]]
            case ReleaseWithBackoff(due):
                released = []
                for ref, at in due:
                    if ref["_id"] in self.lost_leases:
                        continue
                    doc = next(d for d in self.held or [] if d["_id"] == ref["_id"])
                    self.waiting[doc["_id"]] = doc  # c stays: the claim counts, tries + 1
                    self.released_due[doc["_id"]] = at
                    released.append(doc["_id"])
                return released
        raise AssertionError(f"unknown step {step!r}")

    # -- rules -------------------------------------------------------------------------------------------------

    @rule(codec=st.sampled_from(["json", "json", "json", "pickle"]), tries=st.integers(0, 4))
    def push(self, codec: str, tries: int) -> None:
        doc = bucket_document(bson.ObjectId(), [Slot('"m"', tries=tries)], codec=codec, created=T0, due=T0)
        self.waiting[doc["_id"]] = doc
        self.pushed += 1

    @precondition(lambda self: self.held is None)
    @rule(max_buckets=st.integers(1, 4))
    def claim(self, max_buckets: int) -> None:
        before = {i: attempts(d) + 1 for i, d in self.waiting.items()}
        self.lost_leases = set()
        taken, quarantined = self.run(POLICY.fill(max_buckets))
        assert len(taken) <= max_buckets
        for doc in taken:
            assert attempts(doc) <= POLICY.max_attempts, "taken past its last attempt"
            assert parse_bucket(doc).codec in POLICY.codecs
        if any(attempts(doc) == POLICY.max_attempts for doc in taken):
            assert len(taken) == 1, "a bucket on its last attempt shares its batch"
        for bucket_id in quarantined:
            reason = self.quarantined[bucket_id]
            assert before[bucket_id] > POLICY.max_attempts or "codec" in reason, reason
        self.held = taken

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def lease_passes_on(self, data: st.DataObject) -> None:
        """One held bucket's lease expired and someone else claimed it: this batch's writes to it are refused."""
        assert self.held is not None
        doc = data.draw(st.sampled_from(self.held))
        if doc["_id"] not in self.lost_leases:
            self.lost_leases.add(doc["_id"])
            self.waiting[doc["_id"]] = {**doc}  # claimable again, its claim counted

    @precondition(lambda self: self.held is not None)
    @rule()
    def commit(self) -> None:
        assert self.held is not None
        self.finished |= {d["_id"] for d in self.held if d["_id"] not in self.lost_leases}
        self.held = None

    @precondition(lambda self: self.held is not None)
    @rule()
    def fail(self) -> None:
        assert self.held is not None
        now = T0
        out = self.run(POLICY.fail(self.held, "boom", now))
        for doc in self.held:
            bucket_id, tried = doc["_id"], attempts(doc)
            if bucket_id in self.lost_leases:
                assert bucket_id not in out["released"] and bucket_id not in out["quarantined"]
            elif tried >= POLICY.max_attempts:
                assert bucket_id in out["quarantined"] and "boom" in self.quarantined[bucket_id]
            else:
                assert bucket_id in out["released"]
                assert self.released_due[bucket_id] == now + dt.timedelta(seconds=POLICY.backoff.delay(tried - 1))
        if out["quarantined"]:
            assert len(self.held) == 1, "a bucket that used up its attempts took others to quarantine with it"
        self.held = None

    @precondition(lambda self: self.held is not None)
    @rule()
    def job_dies(self) -> None:
        """The job dies with the batch: its leases expire, each claim counted."""
        assert self.held is not None
        for doc in self.held:
            if doc["_id"] not in self.lost_leases:
                self.waiting[doc["_id"]] = doc
        self.held = None

    @invariant()
    def every_bucket_is_somewhere_once(self) -> None:
        held = {d["_id"] for d in self.held or [] if d["_id"] not in self.lost_leases}
        places = [set(self.waiting), held, set(self.quarantined), self.finished]
        assert sum(len(p) for p in places) == self.pushed
        assert len(set().union(*places)) == self.pushed


BatchAttemptMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)
TestBatchAttempt = BatchAttemptMachine.TestCase
