"""CPU a consumed message costs on the consume path alone, with no I/O: ``reserve`` + ``ack`` and
``reserve_many(100)`` + ``ack_many`` of messages served from one claimed bucket of ``--messages`` on the in-memory
database (``bucketq.testing``), after its claim. What it leaves out, against the bench's consume: the claims and
flushes (the driver), the collector's walks of new buckets. It counts each payload's decoding, which a consumer does
as it serves a message of a bucket its queue's producer marked checked (docs/FORMAT.md).

    python -m bench.profiling.consume_path [--messages 20000] [--runs 7]

Prints the median and every run, in ns a message (``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import bucketq.testing

PAD = "x" * 100


async def per_message_ns(n: int, batch: int) -> float:
    """One bucket of ``n`` messages pushed and claimed (untimed, with its first message), then the rest served and
    acked one by one (``batch`` 1) or ``batch`` at a time with ``ack_many``: CPU ns a message."""
    async with bucketq.testing.queue("path", bucket_max_size=n, bucket_max_bytes=15_000_000, state_flush_period=60,
                                     lease=600) as q:
        await q.push_many([{"ts": 1.0, "i": i, "pad": PAD} for i in range(n)])
        await q.flush()
        first = await q.reserve(timeout=1.0)
        assert first is not None
        await first.ack()
        started = time.process_time()
        served = 1
        while served < n:
            if batch == 1:
                message = await q.reserve(timeout=1.0)
                assert message is not None
                await message.ack()
                served += 1
            else:
                messages = await q.reserve_many(batch, timeout=1.0)
                await q.ack_many(messages)
                served += len(messages)
        return (time.process_time() - started) / (n - 1) * 1e9


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="the claimed bucket's size")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    for label, batch in (("reserve + ack", 1), ("reserve_many(100) + ack_many", 100)):
        runs = [await per_message_ns(args.messages, batch) for _ in range(args.runs)]
        print(f"{label:30} median {statistics.median(runs):6.0f} ns a message; runs: "
              + ", ".join(f"{r:.0f}" for r in runs))


if __name__ == "__main__":
    asyncio.run(main())
