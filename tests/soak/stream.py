"""A soak stream: ``python -m tests.soak.stream URI DB RUN_DIR PROC``: pushes into the stream ``events`` (two
partitions), and the readers of two reader groups (``GROUPS``: two of ``audit``, one of ``index``) read and ack
all it holds, each group for itself. ``read`` says which position a reader was handed; ``commit_pos`` a group's
committed position per partition (``stats()``), every twenty messages or so and once at the end. A position is
written as one int, ``seq * SLOT_SPAN + slot`` (and as ``seq`` and ``slot``), so that positions of a partition
compare as numbers."""

from __future__ import annotations

import asyncio
import random
import sys

from pymongo.errors import PyMongoError

import bucketq
from bucketq import Position
from bucketq.options import STREAM_QUEUE_OPTIONS
from tests.soak import role

GROUPS = {"audit": 2, "index": 1}  # reader group -> its readers
PARTITIONS = 2
SLOT_SPAN = 1_000_000  # more than a bucket's slots
RETENTION_S = 180.0  # far behind the readers, and the stream's size levels off within the run


def as_int(position: Position) -> int:
    """A position as one int that orders positions of a partition."""
    return position.seq * SLOT_SPAN + position.slot


async def stream(ctx: role.Context) -> None:
    """Push into the stream and read it with the group's readers until stopped."""
    rng = random.Random(f"{ctx.args.seed}:{ctx.history.proc}")
    shared = {k: v for k, v in role.queue_options().items() if k in STREAM_QUEUE_OPTIONS}
    s = bucketq.Stream(ctx.client, name=role.STREAM, db=ctx.db_name, partitions=PARTITIONS,
                       retention_age=RETENTION_S, **shared)
    h = ctx.history
    readers = [asyncio.create_task(_read(ctx, s, group, i)) for group, count in GROUPS.items() for i in range(count)]
    n = 0
    try:
        while not await ctx.pause(rng.uniform(0.2, 0.8)):
            payloads = [{"p": h.proc, "n": n + i} for i in range(rng.randint(1, 5))]
            try:
                positions = await s.push_many(payloads)
            except (bucketq.BucketqError, PyMongoError) as exc:
                print(f"{h.proc}: stream push failed: {exc}", file=sys.stderr)
                continue
            n += len(payloads)
            for p in positions:
                h.op("push_ok", queue=s.name, id=str(p), kind="stream", partition=p.partition, position=as_int(p))
            if n // 20 != (n - len(payloads)) // 20:
                await _commits(ctx, s)
        await asyncio.gather(*readers)
        await _commits(ctx, s)
    finally:
        for r in readers:
            r.cancel()
        await s.close()


async def _read(ctx: role.Context, s: bucketq.Stream, group: str, i: int) -> None:
    h = ctx.history
    async with s.reader(group, start="beginning") as reader:
        while not ctx.stop.is_set():
            try:
                messages = await reader.read_many(20, timeout=0.5)
            except (bucketq.BucketqError, PyMongoError) as exc:  # a claim cut off by a cut or a restart: again
                print(f"{h.proc}: read failed: {exc}", file=sys.stderr)
                await ctx.pause(0.2)
                continue
            # Every read of the batch is written first: an ack that completes a bucket waits on the server (a
            # stall: seconds), and a read written after it could land after a commit that came later.
            for m in messages:
                h.op("read", stream=s.name, reader_group=group, partition=m.position.partition,
                     position=as_int(m.position), seq=m.position.seq, slot=m.position.slot, id=str(m.position),
                     reader=i)
            for m in messages:
                try:
                    await m.ack()
                except (bucketq.BucketqError, PyMongoError):
                    pass  # not acked: read again by the group


async def _commits(ctx: role.Context, s: bucketq.Stream) -> None:
    try:
        stats = await s.stats()
    except Exception as exc:  # a restart or a stall: the next one
        print(f"{ctx.history.proc}: stream stats failed: {exc}", file=sys.stderr)
        return
    for group in GROUPS:
        if group not in stats["groups"]:  # its readers have not joined yet
            continue
        for text in stats["groups"][group]["position"].split():
            p = Position.parse(text)
            ctx.history.op("commit_pos", stream=s.name, reader_group=group, partition=p.partition,
                           position=as_int(p))


def main() -> int:
    """The role's entry point."""
    return role.run(stream, role.parser(__doc__ or "").parse_args())


if __name__ == "__main__":
    sys.exit(main())
