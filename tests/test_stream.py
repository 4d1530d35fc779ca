"""Streams: positions, reader groups sharing work, replay, retention, lag, and the faults that would
break them: a lost insert reply, a producer killed between allocating a sequence and inserting its bucket,
buckets landing out of order, an insert landing after its sequence was marked a gap, a reader killed holding a
bucket, a lease lost to another reader, a lost reply on a claim's finish."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import bucketq
from bucketq import Position
from bucketq.core.stream_format import COUNTER_ID
from tests.helpers import no_background_housekeeping, read_all, read_together, utc_now

pytestmark = pytest.mark.backends("memory", "server")


async def test_positions_increase_and_a_group_reads_everything_in_order(make_stream):
    stream = make_stream(bucket_max_size=4)
    first = await stream.push_many(range(10))
    second = await stream.push_many(range(10, 13))
    positions = first + second
    assert positions == sorted(positions) and len(set(positions)) == 13
    assert positions[0] == Position(1, 0) and positions[4] == Position(2, 0)
    async with stream.reader("audit", start="beginning") as reader:
        got = await read_all(reader, want=13)
    assert [m.payload for m in got] == list(range(13))
    assert [m.position for m in got] == positions
    stats = await stream.stats()
    assert stats["groups"]["audit"]["lag_messages"] == 0 and stats["groups"]["audit"]["lag_s"] == 0.0
    assert stats["groups"]["audit"]["position"] == str(Position(positions[-1].seq + 1, 0))


async def test_read_many_takes_what_is_available_across_buckets(make_stream):
    # 4 messages in 2 buckets used to come out as two batches of 2, and the README's single read showed half
    stream = make_stream(bucket_max_size=2)
    positions = await stream.push_many(["1:0", "1:1", "2:0", "2:1"])
    assert {p.seq for p in positions} == {1, 2}
    async with stream.reader("g", start="beginning") as reader:
        batch = await reader.read_many(100, timeout=1)
        assert [m.payload for m in batch] == ["1:0", "1:1", "2:0", "2:1"]
        assert await reader.read(timeout=0.1) is None
        for message in batch:
            await message.ack()
    async with stream.reader("h", start="beginning") as reader:  # n bounds it: a third bucket's worth is left
        assert [m.payload for m in await reader.read_many(3, timeout=1)] == ["1:0", "1:1", "2:0"]
        assert [m.payload for m in await reader.read_many(100, timeout=1)] == ["2:1"]
        with pytest.raises(bucketq.InvalidOption):
            await reader.read_many(0)
    assert (await stream.stats())["groups"]["g"]["lag_messages"] == 0


async def test_groups_are_independent_and_a_new_group_at_the_end_reads_only_what_follows(make_stream):
    stream = make_stream()
    await stream.push_many(["a", "b"])
    audit = stream.reader("audit", start="beginning")
    search = stream.reader("search", start="beginning")
    late = stream.reader("late", start="end")
    assert [m.payload for m in await read_all(audit, want=2)] == ["a", "b"]
    assert await late.read(timeout=0.1) is None  # joins the group at the end
    await stream.push("c")
    assert [m.payload for m in await read_all(search, want=3)] == ["a", "b", "c"]
    assert [m.payload for m in await read_all(audit, want=1)] == ["c"]
    assert [m.payload for m in await read_all(late, want=1)] == ["c"]
    assert {g.name for g in await stream.groups()} == {"audit", "search", "late"}


async def test_readers_of_one_group_share_the_messages_each_read_once(make_stream):
    stream = make_stream(bucket_max_size=5)
    for start in range(0, 200, 10):
        await stream.push_many(range(start, start + 10))
    readers = [stream.reader("workers", start="beginning") for _ in range(3)]
    got = await read_together(readers, 200, n=3)
    assert sorted(m.payload for m in got) == list(range(200))
    assert len({m._reader for m in got}) >= 2  # the work was shared
    assert (await stream.stats())["groups"]["workers"]["lag_messages"] == 0


async def test_lag_counts_unacked_messages_and_their_age(make_stream):
    stream = make_stream()
    await stream.push_many(range(5))
    reader = stream.reader("g", start="beginning")
    messages = await reader.read_many(2, timeout=1)
    await messages[0].ack()
    await reader.flush()
    await asyncio.sleep(0.05)
    lag = (await stream.stats())["groups"]["g"]
    assert lag["lag_messages"] == 4 and lag["lag_s"] >= 0.05


async def test_reset_replays_from_a_position_a_time_or_the_beginning_and_skips_to_the_end(make_stream):
    stream = make_stream()
    await stream.push_many(["a", "b", "c"])
    # ``created`` comes from the stream's estimate of the server's clock, ``middle`` from ours: a margin wider
    # than the estimate's error (half a clock sync's round trip, which a loaded machine stretches)
    await asyncio.sleep(0.25)
    middle = utc_now()
    await asyncio.sleep(0.25)
    positions = await stream.push_many(["d", "e"])
    reader = stream.reader("g", start="beginning")
    assert len(await read_all(reader, want=5)) == 5
    assert await stream.reset("g", positions[1]) == positions[1]
    assert [m.payload for m in await read_all(reader, want=1)] == ["e"]
    await stream.reset("g", at=middle)
    assert [m.payload for m in await read_all(reader, want=2)] == ["d", "e"]
    await stream.reset("g", "beginning")
    assert [m.payload for m in await read_all(reader, want=5)] == ["a", "b", "c", "d", "e"]
    await stream.reset("g", "beginning")
    await stream.reset("g", "end")
    await stream.push("f")
    assert [m.payload for m in await read_all(reader, want=1)] == ["f"]
    with pytest.raises(bucketq.InvalidOption):
        await stream.reset("g")
    with pytest.raises(bucketq.InvalidOption):
        await stream.reset("g", "nowhere")


async def test_a_reset_while_a_reader_holds_a_bucket_replays_it_whole(make_stream):
    stream = make_stream()
    await stream.push_many(["a", "b"])
    reader = stream.reader("g", start="beginning")
    first = await reader.read(timeout=1)
    await first.ack()  # written to the claim of the old epoch: counts for nothing after the reset
    await reader.flush()
    await stream.reset("g", "beginning")
    payloads = [m.payload for m in await read_all(reader)]
    assert payloads[-2:] == ["a", "b"]  # "b" may come first from the bucket held before the reset
    assert (await stream.stats())["groups"]["g"] == {"position": "2:0", "lag_messages": 0, "lag_s": 0.0,
                                                     "expired": 0}


async def test_retention_by_messages_deletes_the_oldest_and_a_group_behind_counts_what_it_lost(make_stream, sync_db):
    stream = make_stream(bucket_max_size=2, retention_messages=4)
    await no_background_housekeeping(stream)
    slow = stream.reader("slow", start="beginning")
    await slow.read(timeout=0)  # joins the group at the beginning
    for i in range(0, 10, 2):
        await stream.push_many([i, i + 1])
    result = await stream.apply_retention()
    assert result == {"floor": 4, "deleted": 3}
    assert sync_db["ev"].count_documents({}) == 2
    stats = await stream.stats()
    assert stats["floor"] == 4 and stats["groups"]["slow"]["expired"] == 6
    assert [m.payload for m in await read_all(slow, want=4)] == [6, 7, 8, 9]
    fresh = stream.reader("fresh", start="beginning")
    assert [m.payload for m in await read_all(fresh, want=4)] == [6, 7, 8, 9]


async def test_retention_by_age_keeps_young_buckets(make_stream):
    stream = make_stream(retention_age=0.2)
    await no_background_housekeeping(stream)
    await stream.push("old")
    await asyncio.sleep(0.3)
    await stream.push("young")
    assert (await stream.apply_retention())["deleted"] == 1
    assert [m.payload for m in await read_all(stream.reader("g", start="beginning"), want=1)] == ["young"]


async def test_a_reader_that_dies_holding_a_bucket_leaves_only_its_unwritten_acks_to_read_again(make_stream):
    stream = make_stream(lease=1, state_flush_period=0.05)
    await stream.push_many(range(6))
    dying = stream.reader("g", start="beginning")
    messages = await dying.read_many(6, timeout=1)
    for message in messages[:2]:
        await message.ack()
    await dying.flush()  # acks of 0 and 1 written
    await messages[2].ack()  # not written: this reader dies before its next flush
    dying._flusher.cancel()  # killed: no more writes from it
    other = stream.reader("g")
    assert await other.read(timeout=0.3) is None  # the dead reader's lease still holds the bucket
    got = await read_all(other, want=4)
    assert [m.payload for m in got] == [2, 3, 4, 5]  # 2 again: its ack was in the window; 0 and 1 never


async def test_a_reader_whose_lease_passed_to_another_cannot_finish_the_bucket(make_stream):
    stream = make_stream(lease=1, state_flush_period=0.3)
    await stream.push_many(["a", "b"])
    slow = stream.reader("g", start="beginning")
    held = await slow.read_many(2, timeout=1)
    slow._flusher.cancel()  # stalled: its lease is not extended
    await asyncio.sleep(1.1)
    fast = stream.reader("g")
    assert [m.payload for m in await read_all(fast, want=2)] == ["a", "b"]
    await held[0].ack()
    with pytest.raises(bucketq.LeaseLost):
        await held[1].ack()
    assert (await stream.stats())["groups"]["g"]["lag_messages"] == 0


async def test_a_reader_hands_out_no_more_of_a_bucket_once_its_lease_may_have_run_out(make_stream):
    # The soak saw a reader hand out slots of a bucket after its group had committed past it: its lease had run out
    # (flushes failing through a server stall), another reader of the group had claimed, read and finished it.
    stream = make_stream(lease=30, state_flush_period=10, bucket_max_size=4)  # no flush extends the lease
    await stream.push_many(["a", "b"])
    slow = stream.reader("g", start="beginning")
    assert [m.payload for m in await slow.read_many(1, timeout=1)] == ["a"]  # "b" is held, not handed out yet
    clock = stream.clock
    clock._anchor(clock._server_s + 31, clock._mono_s, clock._error_s)  # the server's clock passes the lease's end
    fast = stream.reader("g")
    assert [m.payload for m in await read_all(fast, want=2)] == ["a", "b"]
    assert (await stream.stats())["groups"]["g"]["position"] == "2:0"
    assert await slow.read_many(10, timeout=0) == []  # not "b" again, behind the committed position
    assert await slow.flush() == [Position(1, 0)]  # dropped as a lost lease


async def test_a_finished_claim_with_a_document_id_from_an_earlier_build_settles_its_bucket(make_stream, sync_db):
    # Claims were keyed {g, e, s} before their _id became a string: such a claim still counts, found by its fields,
    # and retention deletes it once behind the group.
    stream = make_stream(bucket_max_size=2)
    assert [p.seq for p in await stream.push_many(["a", "b"])] == [1, 1]
    await stream.flush()
    assert [p.seq for p in await stream.push_many(["c"])] == [2]
    await stream.reset("g", "beginning")
    (group,) = await stream.groups()
    old = {"g": "g", "e": group.epoch, "s": 1}
    sync_db["ev.claims"].insert_one({"_id": old, **old, "fin": True, "done": [0, 1], "by": "old",
                                     "lease": {"token": "old", "owner": "host:1", "until": utc_now()}})
    async with stream.reader("g") as reader:
        assert [m.payload for m in await read_all(reader, want=1)] == ["c"]
    assert (await stream.stats())["groups"]["g"]["position"] == "3:0"
    await stream.apply_retention()
    assert sync_db["ev.claims"].count_documents({"_id": old}) == 0


async def test_the_cli_view_of_group_names_refuses_bad_names(make_stream):
    stream = make_stream()
    for bad in ("", "a\0b", 3):
        with pytest.raises(bucketq.InvalidOption):
            stream.reader(bad)


# -- faults injected on the in-memory database --------------------------------------------------------------

async def test_a_lost_insert_reply_stores_the_bucket_once(make_stream, memory_db):
    stream = make_stream(target=memory_db)
    lost = memory_db.faults.lose_reply("insert_many", collection="ev")
    positions = await stream.push_many(["a", "b"])
    assert lost.hits == 1 and positions == [Position(1, 0), Position(1, 1)]
    assert memory_db.sync["ev"].count_documents({}) == 1
    assert [m.payload for m in await read_all(stream.reader("g", start="beginning"), want=2)] == ["a", "b"]


async def test_a_connection_cut_under_a_read_is_retried_not_raised(make_stream, memory_db):
    # As the queue's consumer does: a transient error of a look (here the claim's request lost on its way, then the
    # scan's reply) is looked at again within the read's timeout, not raised to the caller as AutoReconnect.
    stream = make_stream(target=memory_db)
    await stream.push_many(["a", "b"])
    cut = memory_db.faults.refuse("find_one_and_update", "findAndModify", collection="ev.claims")
    lost = memory_db.faults.lose_reply("find", collection="ev", times=1)
    async with stream.reader("g", start="beginning") as reader:
        got = await reader.read_many(10, timeout=30)
        assert [m.payload for m in got] == ["a", "b"]
    assert cut.hits == 1 and lost.hits == 1


async def test_a_producer_killed_between_allocation_and_insert_stalls_readers_only_for_gap_wait(make_stream,
                                                                                               memory_db):
    stream = make_stream(target=memory_db, gap_wait=0.5)
    await stream.push("a")
    memory_db.sync["ev.seq"].update_one({"_id": COUNTER_ID}, {"$inc": {"last": 1}})  # sequence 2: never written
    await stream.push("c")
    reader = stream.reader("g", start="beginning")
    got = await read_all(reader, timeout=1.0)
    assert [m.payload for m in got] == ["a", "c"]
    gap = memory_db.sync["ev"].find_one({"_id": 2})
    assert gap["gap"] is True
    assert (await stream.stats())["groups"]["g"]["position"] == "4:0"


async def test_buckets_landing_out_of_order_never_let_the_group_commit_past_the_missing_one(make_stream,
                                                                                            memory_db):
    stream = make_stream(target=memory_db, gap_wait=30)
    landed = asyncio.Event()
    memory_db.faults.delay("insert_many", collection="ev", until=landed)
    early = asyncio.ensure_future(stream.push("first"))  # sequence 1, held back on its way
    while memory_db.sync["ev.seq"].find_one({"_id": COUNTER_ID}) is None:
        await asyncio.sleep(0.01)
    await stream.push("second")  # sequence 2 lands first
    reader = stream.reader("g", start="beginning")
    got = await read_all(reader, timeout=0.3)
    assert [m.payload for m in got] == ["second"]
    assert memory_db.sync["ev.positions"].find_one({"_id": "g"})["s"] == 1  # not past the missing sequence 1
    landed.set()
    assert await early == Position(1, 0)
    assert [m.payload for m in await read_all(reader, want=1)] == ["first"]
    assert memory_db.sync["ev.positions"].find_one({"_id": "g"})["s"] == 3


async def test_an_insert_landing_after_its_sequence_was_marked_a_gap_is_refused(make_stream, memory_db):
    stream = make_stream(target=memory_db, gap_wait=0.2)
    landed = asyncio.Event()
    memory_db.faults.delay("insert_many", collection="ev", until=landed)
    late = asyncio.ensure_future(stream.push("late"))
    while memory_db.sync["ev.seq"].find_one({"_id": COUNTER_ID}) is None:
        await asyncio.sleep(0.01)
    await stream.push("next")
    reader = stream.reader("g", start="beginning")
    assert [m.payload for m in await read_all(reader, timeout=0.6)] == ["next"]
    assert memory_db.sync["ev"].find_one({"_id": 1})["gap"] is True
    landed.set()
    with pytest.raises(bucketq.WriteFailed):
        await late  # never stored: the push says so, and no reader ever sees it
    assert memory_db.sync["ev"].find_one({"_id": 1})["gap"] is True
    assert await read_all(stream.reader("other", start="beginning")) != []
    assert [m.payload for m in await read_all(stream.reader("fresh", start="beginning"), want=1)] == ["next"]


async def test_a_lost_reply_on_the_finish_of_a_bucket_counts_as_applied(make_stream, memory_db):
    stream = make_stream(target=memory_db)
    await stream.push_many(["a", "b"])
    reader = stream.reader("g", start="beginning")
    messages = await reader.read_many(2, timeout=1)
    lost = memory_db.faults.lose_reply("update_one", collection="ev.claims",
                                       where=lambda op: "$set" in op.update and op.update["$set"].get("fin"))
    for message in messages:
        await message.ack()
    assert lost.hits == 1
    assert await reader.read(timeout=0.2) is None
    assert (await stream.stats())["groups"]["g"]["position"] == "2:0"


async def test_a_reader_whose_scan_is_overtaken_by_a_commit_and_retention_does_not_read_the_bucket_again(
        make_stream, memory_db):
    # The late reader reads the group's position, then (held back here) its claims: meanwhile the other reader
    # finishes bucket 1, the group commits past it, and retention deletes that final claim behind the position.
    # The late reader's upsert then makes a fresh claim on bucket 1; without reading the position again it would
    # deliver "a" and "b" a second time (the stress run saw a whole bucket read twice).
    stream = make_stream(target=memory_db, bucket_max_size=2)
    await stream.push_many(["a", "b"])
    await stream.push_many(["c", "d"])
    first = stream.reader("g", start="beginning")
    late = stream.reader("g", start="beginning")
    gate = asyncio.Event()
    held = memory_db.faults.delay("find", collection="ev.claims", until=gate)
    scanning = asyncio.ensure_future(late.read_many(10, timeout=1))
    while held.hits == 0:
        await asyncio.sleep(0.01)
    got = await first.read_many(2, timeout=1)
    for message in got:
        await message.ack()
    assert [m.payload for m in got] == ["a", "b"]
    assert memory_db.sync["ev.positions"].find_one({"_id": "g"})["s"] == 2
    await stream.apply_retention()
    assert memory_db.sync["ev.claims"].count_documents({"s": 1}) == 0
    gate.set()
    assert [m.payload for m in await scanning] == ["c", "d"]


async def test_options_are_validated(make_stream):
    for bad in ({"gap_wait": 0}, {"retention_messages": 0}, {"retention_age": "1d"}, {"lease": 0},
                {"delay": 1}):
        with pytest.raises(bucketq.InvalidOption):
            make_stream(**bad)
    with pytest.raises(bucketq.InvalidOption):
        await make_stream().push_many([bucketq.Outgoing("x", delay=5)])
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Stream("mongodb://localhost", name="q.positions")


async def test_a_closed_reader_hands_its_buckets_back_at_once(make_stream):
    stream = make_stream(lease=60)
    await stream.push_many(range(5))
    first = stream.reader("g", start="beginning")
    messages = await first.read_many(2, timeout=1)
    await messages[0].ack()
    await first.close()  # no waiting for the 60 s lease: the other three and the unacked one go to the next
    second = stream.reader("g")
    assert [m.payload for m in await read_all(second, want=4)] == [1, 2, 3, 4]


async def test_a_stream_is_not_a_queue_and_a_deleted_group_starts_over(make_stream, queue_target, db_name):
    stream = make_stream()
    await stream.push_many(["a", "b"])
    assert len(await read_all(stream.reader("g", start="beginning"), want=2)) == 2
    assert await bucketq.list_queues(queue_target, db=db_name) == []
    assert await stream.delete_group("g") is True
    assert await stream.delete_group("g") is False
    assert await stream.groups() == []
    assert [m.payload for m in await read_all(stream.reader("g", start="beginning"), want=2)] == ["a", "b"]


async def test_retention_keeps_a_young_gap_marker_so_a_late_insert_is_still_refused(make_stream, memory_db):
    stream = make_stream(target=memory_db, gap_wait=0.2, retention_messages=1)
    await no_background_housekeeping(stream)
    landed = asyncio.Event()
    memory_db.faults.delay("insert_many", collection="ev", until=landed)
    late = asyncio.ensure_future(stream.push("late"))
    while memory_db.sync["ev.seq"].find_one({"_id": COUNTER_ID}) is None:
        await asyncio.sleep(0.01)
    try:
        await stream.push("next")
        await stream.push("last")
        got = await read_all(stream.reader("g", start="beginning"), timeout=0.6)
        assert [m.payload for m in got] == ["next", "last"]
        assert await stream.apply_retention() == {"floor": 3, "deleted": 1}  # "next"; the gap below is kept
    finally:
        landed.set()
    with pytest.raises(bucketq.WriteFailed):
        await late
    old = utc_now() - dt.timedelta(hours=1)
    memory_db.sync["ev"].update_one({"_id": 1}, {"$set": {"created": old}})  # older than tombstone_retention
    assert await stream.apply_retention() == {"floor": 3, "deleted": 1}
    assert memory_db.sync["ev"].find_one({"_id": 1}) is None
