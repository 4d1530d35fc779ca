"""A reader group's conversations (``bucketq.core.stream_read``), which the stream reader and the Spark batch both
carry, against a scripted store: a missing group is joined and a group of one position spread before it is used,
a claim stands only in the same epoch and behind the group's position, a complete bucket is finished at once (a
refused finish is a lost lease), and a hole at a batch's range start is waited on and then marked a gap."""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator
from typing import Any

import pytest

from bucketq.core import stream_read
from bucketq.core.conversation import carry
from bucketq.core.reader_groups import ReaderGroup
from bucketq.core.stream_format import Partition, Position
from bucketq.core.stream_gaps import HoleWatch
from bucketq.core.stream_held import HeldStreamBucket
from bucketq.core.stream_read import ReadStep
from bucketq.errors import LeaseLost

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
ONE = [Partition(0, 1)]
TWO = [Partition(0, 2), Partition(1, 2)]
GROUP = ReaderGroup("g", epoch=3, positions=(Position(5, 0),), expired=0)
CLAIM = {"_id": {"g": "g", "e": 3, "s": 5}, "done": []}


def _bucket(seq: int, size: int = 2) -> dict[str, Any]:
    return {"_id": seq, "v": 1, "n": size, "p": ["1"] * size, "enc": "json", "created": T0}


class Script:
    """A store whose replies to each kind of step are taken in turn from ``replies`` (a list per kind: the last
    one repeats); ``steps`` records each step given."""

    def __init__(self, **replies: list[Any]) -> None:
        self.replies = replies
        self.steps: list[ReadStep] = []

    def execute(self, step: ReadStep) -> Any:
        self.steps.append(step)
        queue = self.replies.get(type(step).__name__, [None])
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def run(self, conversation: Generator[ReadStep, Any, Any]) -> Any:
        return carry(conversation, self.execute)

    @property
    def kinds(self) -> list[str]:
        return [type(s).__name__ for s in self.steps]


def test_a_missing_group_is_joined_and_one_of_one_position_spread_before_it_is_used() -> None:
    spread = ReaderGroup("g", 3, (Position(5, 0, 0), Position(5, 0, 1)), 0)
    script = Script(ReadGroup=[None, GROUP, spread], StartPositions=[[Position(1, 0, 0), Position(1, 0, 1)]],
                    ReadClock=[T0])
    assert script.run(stream_read.current_group("g", TWO)) == spread
    assert script.kinds == ["ReadGroup", "StartPositions", "ReadClock", "UpsertGroup", "ReadGroup", "MoveGroup",
                            "ReadGroup"]


@pytest.mark.parametrize(("now", "bucket", "held", "kinds"), [
    (GROUP, _bucket(5), True, ["ReadGroup", "ReadBucket"]),
    (ReaderGroup("g", 4, (Position(5, 0),), 0), _bucket(5), False, ["ReadGroup"]),  # a reset since: another epoch
    (ReaderGroup("g", 3, (Position(6, 0),), 0), _bucket(5), False, ["ReadGroup"]),  # committed past it meanwhile
    (GROUP, None, False, ["ReadGroup", "ReadBucket"]),  # deleted by retention since the scan
], ids=["held", "reset", "committed past", "deleted"])
def test_a_claim_stands_only_in_the_same_epoch_behind_the_position(now: ReaderGroup, bucket: dict | None,
                                                                  held: bool, kinds: list[str]) -> None:
    script = Script(ReadGroup=[now], ReadBucket=[bucket])
    result = script.run(stream_read.after_claim("g", ONE, GROUP, ONE[0], 5, CLAIM, "token"))
    assert isinstance(result, HeldStreamBucket) == held
    assert script.kinds == kinds


@pytest.mark.parametrize("applied", [True, False])
def test_a_claim_of_a_bucket_with_every_slot_done_is_finished_at_once(applied: bool) -> None:
    claim = {**CLAIM, "done": [0, 1]}  # a reset into the bucket's last slot skipped both
    script = Script(ReadGroup=[GROUP], ReadBucket=[_bucket(5)], UpdateClaim=[applied], ReadWindow=[[{"_id": 5}]],
                    ReadClaims=[[{"s": 5, "fin": True}]], ReadClock=[T0])
    conversation = stream_read.after_claim("g", ONE, GROUP, ONE[0], 5, claim, "token")
    if not applied:
        with pytest.raises(LeaseLost):
            script.run(conversation)
        return
    assert script.run(conversation) is None
    assert script.kinds == ["ReadGroup", "ReadBucket", "UpdateClaim", "ReadGroup", "ReadWindow", "ReadClaims",
                            "ReadClock", "MoveGroup"]  # it held the group back: the commit moves past it
    move = script.steps[-1]
    assert isinstance(move, stream_read.MoveGroup) and move.update["$set"]["s"] == 6


def test_a_hole_at_a_batch_range_start_is_waited_on_then_marked_a_gap() -> None:
    """Sequence 5 is allocated (the counter is at 6) but missing: the batch waits until ``gap_wait`` passed since it
    first saw the hole, marks it, and reads from 5 on once the marker is there."""
    script = Script(ReadGroup=[GROUP], ReadWindow=[[{"_id": 6}], [{"_id": 6}], [{"_id": 6}], [{"_id": 5}, {"_id": 6}]],
                    ReadCounter=[(6, 1)], ReadMonotonic=[0.0, 10.0, 35.0])
    group, end = script.run(stream_read.uncommitted("g", ONE, ONE[0], 1, 100, HoleWatch(35.0)))
    assert (group, end) == (GROUP, Position(7, 0))
    marks = [s for s in script.steps if isinstance(s, stream_read.MarkGap)]
    assert script.kinds.count("WaitForHole") == 2 and [m.seq for m in marks] == [5]
