"""The two carriers of a sans-I/O conversation (``bucketq.core.conversation``: ``carry``, the batch queue's, and
``carry_async``, the async consumer's) over one conversation, an ordered group's turn (``core.group_turn``): for
any replies and any step that fails, both take the same steps and end the same way. An error is thrown in at the
step that raised it, so a turn whose release to wait fails still gives the group's lock back before the error
goes on."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from bson import ObjectId
from hypothesis import given
from hypothesis import strategies as st

from bucketq.core import group_turn
from bucketq.core.conversation import carry, carry_async
from bucketq.core.format import Slot, bucket_document, parse_bucket
from bucketq.core.group_turn import GroupStep, Turn

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
LEASE = T0 + dt.timedelta(seconds=30)
BUCKET = parse_bucket({**bucket_document(ObjectId(), [Slot('"m"')], codec="json", created=T0, due=T0, group="g"),
                       "s": 2})  # the group's second bucket
OTHER = {"_id": ObjectId(), "pt": 0, "w": T0}  # an earlier live bucket of the group, waiting for a hand-off


class StoreDown(Exception):
    """What the store raises at the failing step."""


class Script:
    """A store that answers each kind of step as told and raises ``StoreDown`` at step ``fail_at`` (counted from
    0; None: none fails); ``steps`` records every step it was given."""

    def __init__(self, replies: dict[type, Any], fail_at: int | None) -> None:
        self.replies = replies
        self.fail_at = fail_at
        self.steps: list[str] = []

    def execute(self, step: GroupStep) -> Any:
        self.steps.append(type(step).__name__)
        if len(self.steps) - 1 == self.fail_at:
            raise StoreDown(type(step).__name__)
        return self.replies.get(type(step))

    async def execute_async(self, step: GroupStep) -> Any:
        return self.execute(step)


def _turn() -> Any:
    return group_turn.take_turn(BUCKET, "token", T0, LEASE, T0, waited=False)


def _run(carrier: Callable[[Script], Any], replies: dict[type, Any], fail_at: int | None) -> tuple[list[str], Any]:
    """The steps one carrier took and how the turn ended: its result, or the error that came out."""
    script = Script(replies, fail_at)
    try:
        outcome: Any = carrier(script)
    except StoreDown as exc:
        outcome = ("raised", str(exc))
    return script.steps, outcome


def _sync(script: Script) -> Turn:
    return carry(_turn(), script.execute)


def _async(script: Script) -> Turn:
    return asyncio.run(carry_async(_turn(), script.execute_async))


replies = st.fixed_dictionaries({
    group_turn.LockGroup: st.booleans(),
    group_turn.ReadEarliestLive: st.sampled_from([None, OTHER, {"_id": BUCKET.id, "pt": 0}]),
    group_turn.ReadLock: st.sampled_from([None, {"_id": "g", "token": "else", "until": LEASE}]),
})


@given(replies=replies, fail_at=st.one_of(st.none(), st.integers(0, 7)))
def test_both_carriers_take_the_same_steps_and_end_the_same_way(replies: dict[type, Any], fail_at: int | None) -> None:
    assert _run(_sync, replies, fail_at) == _run(_async, replies, fail_at)


# (the step that fails, the steps taken, how the turn ends), the lock taken and an earlier bucket live
FAILURES = [
    (None, ["LockGroup", "ReadEarliestLive", "ReleaseToWait", "Unlock", "ReadEarliestLive", "Wake"],
     Turn(serve=False, claim_instead={"pt": 0, "_id": OTHER["_id"]})),
    # an error before the release leaves the lock to expire with the bucket's lease, as a crash would
    (1, ["LockGroup", "ReadEarliestLive"], ("raised", "ReadEarliestLive")),
    # the release fails: the lock is given back all the same, then the error goes on
    (2, ["LockGroup", "ReadEarliestLive", "ReleaseToWait", "Unlock"], ("raised", "ReleaseToWait")),
    (3, ["LockGroup", "ReadEarliestLive", "ReleaseToWait", "Unlock"], ("raised", "Unlock")),
    (5, ["LockGroup", "ReadEarliestLive", "ReleaseToWait", "Unlock", "ReadEarliestLive", "Wake"], ("raised", "Wake")),
]


@pytest.mark.parametrize("carrier", [_sync, _async], ids=["carry", "carry_async"])
@pytest.mark.parametrize(("fail_at", "steps", "outcome"), FAILURES)
def test_a_failed_step_is_thrown_into_the_turn_which_gives_its_lock_back(
        carrier: Callable[[Script], Any], fail_at: int | None, steps: list[str], outcome: Any) -> None:
    taken = {group_turn.LockGroup: True, group_turn.ReadEarliestLive: OTHER}
    assert _run(carrier, taken, fail_at) == (steps, outcome)
