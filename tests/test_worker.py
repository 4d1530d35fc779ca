"""``Worker`` and retry control in handlers: a chosen retry delay, giving up without further tries, a
handler resolving its own message, a per-handler time limit, batch handlers failing part of a batch."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

import bucketq

QUICK = {"bucket_max_wait": 0.005, "change_streams": False, "poll_interval": 0.02, "drain_timeout": 0}


async def _run(worker: bucketq.Worker, seconds: float) -> None:
    """Run ``worker`` for ``seconds``, then stop it gracefully."""
    task = asyncio.ensure_future(worker.run())
    await asyncio.sleep(seconds)
    worker.stop()
    await asyncio.wait_for(task, 10)


async def test_a_handler_raising_retry_picks_the_delay_and_the_reason_is_kept(make_queue):
    q = make_queue(**QUICK, max_attempts=2, retry_base=30)
    await q.push("flaky")
    seen: list[tuple[int, float]] = []

    async def handler(message: bucketq.Message) -> None:
        seen.append((message.tries, time.monotonic()))
        raise bucketq.Retry("upstream busy", delay=0.3)

    await _run(bucketq.Worker(q, handler, handle_signals=False), 1.5)
    assert [tries for tries, _ in seen] == [0, 1], "retried once, after 0.3 s rather than the 30 s backoff"
    assert 0.25 <= seen[1][1] - seen[0][1] < 1.2
    (dead,) = await q.dead_letters()
    assert "upstream busy" in dead["error"] and dead["tries"] == 2


async def test_a_handler_raising_reject_dead_letters_at_once(make_queue):
    q = make_queue(**QUICK, max_attempts=5)
    await q.push({"bad": True})
    calls = 0

    async def handler(message: bucketq.Message) -> None:
        nonlocal calls
        calls += 1
        raise bucketq.Reject("schema version 0 is not supported")

    await _run(bucketq.Worker(q, handler, handle_signals=False), 0.8)
    assert calls == 1, "rejected messages are not tried again"
    (dead,) = await q.dead_letters()
    assert dead["error"] == "Reject: schema version 0 is not supported" and dead["tries"] == 1


async def test_a_message_dead_lettered_by_its_handler_is_not_tried_again(make_queue):
    q = make_queue(**QUICK, max_attempts=5)
    await q.push("poison")
    message = await q.reserve(timeout=5)
    await message.dead_letter(error=ValueError("cannot parse"), wait=True)
    assert await q.reserve(timeout=0.3) is None
    (dead,) = await q.dead_letters()
    assert dead["_id"] == message.id and dead["error"] == "ValueError: cannot parse"
    with pytest.raises(bucketq.LeaseLost):  # the bucket is finished: nothing of it is held any more
        await message.ack()


async def test_a_hung_handler_is_cut_off_and_its_message_retried_with_the_reason(make_queue):
    q = make_queue(**QUICK, max_attempts=2, retry_base=0.05, retry_max=0.05)
    await q.push("slow")
    started: list[int] = []

    async def handler(message: bucketq.Message) -> None:
        started.append(message.tries)
        await asyncio.sleep(3600)  # hangs

    worker = bucketq.Worker(q, handler, handle_signals=False, handler_timeout=0.2)
    await _run(worker, 1.5)
    assert started == [0, 1]
    (dead,) = await q.dead_letters()
    assert "HandlerTimeout" in dead["error"] and "0.2 s" in dead["error"]
    assert worker.failed == 2


async def test_a_batch_handler_fails_part_of_its_batch_with_retry_and_reject(make_queue):
    q = make_queue(**QUICK, max_attempts=3)
    await q.push_many([{"i": i} for i in range(6)])
    calls: list[list[tuple[int, int]]] = []

    async def handler(batch: list[bucketq.Message]) -> dict[str, BaseException]:
        calls.append([(m.payload["i"], m.tries) for m in batch])
        failures: dict[str, BaseException] = {}
        for m in batch:
            if m.payload["i"] == 1 and m.tries == 0:
                failures[m.id] = bucketq.Retry("later", delay=0)
            elif m.payload["i"] == 2:
                failures[m.id] = bucketq.Reject("never")
        return failures

    await _run(bucketq.Worker(q, handler, batch_size=10, handle_signals=False), 1.0)
    assert calls[0] == [(i, 0) for i in range(6)], "one batch from the bucket held"
    assert [(1, 1)] in calls
    (dead,) = await q.dead_letters()
    assert orjson.loads(dead["p"]) == {"i": 2} and dead["error"] == "Reject: never" and dead["tries"] == 1


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5"])
def test_a_bad_handler_timeout_is_invalid_option(make_queue, bad):
    async def handler(message: bucketq.Message) -> None: ...

    with pytest.raises(bucketq.InvalidOption):
        bucketq.Worker(make_queue(), handler, handler_timeout=bad)
