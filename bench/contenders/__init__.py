"""The contenders, each started as worker processes of its own (see bench/worker.py for the protocol)."""

from __future__ import annotations

import json
import sys

from bench.contenders import keuss

ALL = ("bucketq", "keuss", "naive", "floor")
QUEUE_SCENARIOS = frozenset({"push", "consume", "end_to_end", "latency"})
SCENARIOS = {
    # consume_batch: reserve_many, for batch handlers; stream_push: push to a bucketq.Stream; push_many:
    # the same pushes as push, by push_many calls of ``window`` messages; idle: what consumers waiting
    # on an empty queue cost, stream_idle: what readers waiting on a stream with nothing new cost
    "bucketq": QUEUE_SCENARIOS | {"consume_batch", "stream_push", "push_many", "idle", "stream_idle"},
    "keuss": QUEUE_SCENARIOS,
    "naive": QUEUE_SCENARIOS,
    # latency: one insert's round trip; push_many and consume_batch: its push and consume again, in turn with
    # bucketq's rounds of those cells, so that the CPU goals pair each round with the floor's beside it
    "floor": frozenset({"push", "push_many", "consume", "consume_batch", "latency", "encode", "decode"}),
}
_PYTHON_MODULES = {
    "bucketq": "bench.contenders.bucketq_c",
    "naive": "bench.contenders.naive",
    "floor": "bench.contenders.floor",
}


def command(contender: str, spec: dict) -> tuple[list[str], dict[str, str] | None]:
    """argv (and environment, None to inherit) of one worker of this contender."""
    if contender == "keuss":
        return keuss.command(spec)
    return [sys.executable, "-m", _PYTHON_MODULES[contender], json.dumps(spec)], None
