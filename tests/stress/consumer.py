"""A consumer process of the stress harness:
``python -m tests.stress.consumer URI DB QUEUE --log PATH [--dedupe] [--kill-point P --kill-after N] [--drain]
[--clock-file PATH]``.

It handles messages in batches of up to ``--batch`` (the first ``reserve`` waits, the rest take what is
at hand). The handler's side effect is one document in the collection ``processed`` per batch,
``{_id, pid, at, m: [{w, g, s, mid, tries, at, lease, problem}, ...]}`` (``at``: this host's real wall clock
when the batch, or the message, was served; ``lease``: how many seconds this consumer then believed it still
held the message's bucket, by its own clock), inserted with a client-made id (so a retry after a cut connection
stores it once); then the batch is acked. With ``--dedupe`` every message must come with its dedupe key,
without it with none (see ``common``). Entry ``i`` of batch document ``B`` is
the record ``B:i``. The log tells the harness which side effects were *committed*, that is, followed by an
``ack()`` that returned:

    ack R...      the records R were handled and their ``ack()`` returned
    acked T R...  the same, with the real time T after the acks returned (ordered groups: the end of handling)
    lost R...     ``ack()`` raised LeaseLost: another consumer will deliver the message again
    err R E       ``ack()`` raised something else (then the message was nacked)
    leaselost P B the library warned that process P lost its lease on bucket B and its unflushed state
                  (acks included) was refused: those messages will be delivered again (a lease can run
                  out under a live consumer while the server restarts)

``--kill-point`` makes the process SIGKILL itself during its ``--kill-after``-th batch:

    after_claim  messages reserved (their bucket claimed, under lease), nothing handled
    before_ack   side effects of the batch written, no ack: the batch will be delivered again
    mid_batch    half of the batch acked, the other half not
    after_ack    the whole batch acked, before the next state flush: acks not yet stored in the bucket

SIGUSR1 steps this process's wall clock, ``time.time()``, by the seconds written in ``--clock-file``
(cumulatively): an NTP step or an operator's ``date -s`` on this host. Its monotonic clock goes on, and
the harness's own times (``at``) keep reading the real clock.

SIGTERM stops the loop after the current batch and closes the queue (flush, release held buckets).
With ``--drain`` the process exits 0 once the queue is empty, 3 if it is not empty by ``--deadline``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from bson import ObjectId
from pymongo import AsyncMongoClient
from pymongo.errors import BulkWriteError, PyMongoError

import bucketq
from tests.stress.common import STOP_S, LineLog, check_payload, die, queue_options

KILL_POINTS = ("after_claim", "before_ack", "mid_batch", "after_ack")
DUPLICATE_KEY = 11000
REAL_TIME = time.time  # the wall clock as it is, whatever a clock step does to ``time.time``


async def insert_records(collection, records: list[dict], deadline_s: float = 120.0) -> None:
    """Insert records with their own ids until stored; an id already there was stored by an earlier try."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            await collection.insert_many(records, ordered=False)
            return
        except BulkWriteError as exc:
            others = [e for e in exc.details.get("writeErrors", []) if e.get("code") != DUPLICATE_KEY]
            if not others and not exc.details.get("writeConcernErrors"):
                return
            if time.monotonic() > deadline:
                raise
        except PyMongoError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def lease_left(message: bucketq.Message) -> float:
    """Seconds this consumer believes it still holds the message's bucket, by the latest reading of its clock (as
    it decides to serve). The harness's one look inside the library (``Message._holding``, ``Consumer._clock``):
    the accounting needs it to tell two consumers holding a bucket at once from a redelivery after a lease ran
    out."""
    held = message._holding.held
    return (held.lease_until - message._consumer._clock.latest()).total_seconds()


class ClockStepper:
    """Steps ``time.time`` by the seconds read from ``path`` on each call to ``step`` (a signal handler)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset_s = 0.0

    def step(self) -> None:
        with open(self.path) as f:
            self.offset_s += float(f.read())
        offset = self.offset_s
        time.time = lambda: REAL_TIME() + offset
        print(f"consumer {os.getpid()}: wall clock stepped to {offset:+.1f} s", file=sys.stderr, flush=True)


class LeaseLossRecorder(logging.Handler):
    """Writes the library's "lease on bucket B lost" warnings to the log, for the harness's account."""

    def __init__(self, log: LineLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("lease on bucket") and record.args:
            self.log.write(f"leaselost {os.getpid()} {record.args[0]}")


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("db")
    parser.add_argument("queue")
    parser.add_argument("--log", required=True)
    parser.add_argument("--dedupe", action="store_true")
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--kill-point", choices=KILL_POINTS)
    parser.add_argument("--kill-after", type=int, default=1, help="die during this batch (1 = the first)")
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument("--clock-file", help="SIGUSR1 steps the wall clock by the seconds written in this file")
    args = parser.parse_args()

    log = LineLog(args.log)
    logging.getLogger("bucketq").addHandler(LeaseLossRecorder(log))
    client: AsyncMongoClient = AsyncMongoClient(args.uri, tz_aware=True, serverSelectionTimeoutMS=60_000)
    q = bucketq.Queue(client, name=args.queue, db=args.db,
                      **queue_options(dedupe=args.dedupe, bucket_max_size=100, bucket_max_wait=0.05))
    processed = client[args.db]["processed"]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if args.clock_file:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, ClockStepper(args.clock_file).step)
    pid = os.getpid()
    batches = 0
    errors = 0
    deadline = time.monotonic() + args.deadline
    rc = 0

    async def reserve(timeout: float) -> tuple[bucketq.Message, float, float] | None:
        """A message, the real time it was served at, and the lease this consumer believed it had left."""
        nonlocal errors
        try:
            message = await q.reserve(timeout=timeout)
            return None if message is None else (message, REAL_TIME(), lease_left(message))
        except PyMongoError as exc:  # a claim cut off by a connection cut or a server restart: try again
            errors += 1
            print(f"consumer {pid}: reserve failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            await asyncio.sleep(0.2)
            return None

    async def ack(messages: list[bucketq.Message], ids: list[str]) -> None:
        results = await asyncio.gather(*(m.ack() for m in messages), return_exceptions=True)
        acked = [i for i, r in zip(ids, results, strict=True) if r is None]
        lost = [i for i, r in zip(ids, results, strict=True) if isinstance(r, bucketq.LeaseLost)]
        failed = [(m, i, r) for m, i, r in zip(messages, ids, results, strict=True)
                  if r is not None and not isinstance(r, bucketq.LeaseLost)]
        if acked:
            log.write("ack " + " ".join(acked))
            log.write(f"acked {REAL_TIME():.6f} " + " ".join(acked))
        if lost:
            log.write("lost " + " ".join(lost))
        for message, record, error in failed:
            log.write(f"err {record} {type(error).__name__}")
            try:
                await message.nack(delay=0, error=error)
            except bucketq.BucketqError:
                pass

    try:
        while not stop.is_set():
            first = await reserve(0.5)
            if first is None:
                if args.drain:
                    try:
                        stats = await q.stats()
                    except PyMongoError:
                        continue
                    if stats["buckets"] == 0:
                        break
                    if time.monotonic() > deadline:
                        print(f"drain: queue not empty by the deadline: {stats}", file=sys.stderr)
                        rc = 3
                        break
                continue
            served = [first]
            while len(served) < args.batch and (m := await reserve(0)) is not None:
                served.append(m)
            batch = [m for m, _, _ in served]
            batches += 1
            dying = args.kill_point if batches == args.kill_after else None
            if dying == "after_claim":
                die()
            entries = []
            for m, at, lease in served:
                problem = check_payload(m.payload, m.key, args.payload_bytes, keyed=args.dedupe)
                p = m.payload if isinstance(m.payload, dict) else {}
                entries.append({"w": p.get("w"), "g": p.get("g"), "s": p.get("s"), "mid": m.id, "tries": m.tries,
                                "at": at, "lease": lease, "problem": problem})
            record = {"_id": ObjectId(), "pid": pid, "at": served[0][1], "m": entries}
            await insert_records(processed, [record])
            ids = [f"{record['_id']}:{i}" for i in range(len(batch))]
            if dying == "before_ack":
                die()
            if dying == "mid_batch":
                half = max(1, len(batch) // 2)
                await ack(batch[:half], ids[:half])
                die()
            await ack(batch, ids)
            if dying == "after_ack":
                die()
        await asyncio.wait_for(q.close(), STOP_S)
    finally:
        log.close()
        await client.close()
    if errors:
        print(f"consumer {pid}: {errors} reserve errors (retried)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
