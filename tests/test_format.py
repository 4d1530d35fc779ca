"""Documents written by the library match docs/FORMAT.md: the field tables there are parsed and every
document of every kind (fresh, claimed, retry, dead letter, quarantine, inbox) is checked against them."""

from __future__ import annotations

import datetime as dt
import zlib

import pytest
from bson import Binary, ObjectId
from hypothesis import given
from hypothesis import strategies as st

from bucketq import Outgoing
from bucketq.core import claims
from bucketq.core.format import (
    Slot,
    as_utc,
    bucket_document,
    parse_bucket,
)
from bucketq.errors import MalformedBucket
from tests.format_checks import check, check_bucket, check_tombstone, matches, table
from tests.helpers import next_message, utc_now


def test_the_tables_parse():
    assert "p" in table("bucket-fields") and table("bucket-fields")["_id"] == ("objectId", True)


async def test_every_document_kind_matches_the_format(make_queue, sync_db):
    q = make_queue(bucket_max_wait=0.01, max_attempts=2, dedupe=True, lease=30)
    await q.push_many([{"i": i} for i in range(3)])
    await q.push({"h": True}, headers={"trace": "x"}, key="key-1")
    await q.push("later", delay=120)
    for doc in sync_db.events.find():
        check_bucket(doc)

    message = await q.reserve(timeout=2)
    claimed = sync_db.events.find_one({"lease": {"$ne": None}})
    check_bucket(claimed)
    await message.nack(delay=60, error="try later", wait=True)
    retry = sync_db.events.find_one({"o": {"$exists": True}})
    check_bucket(retry)
    assert retry["o"] == [message.id] and retry["t"] == [1]

    second = await q.reserve(timeout=2)
    await second.nack(delay=0, error="again", wait=True)
    keys = []
    for _ in range(3):  # the key's and the bucket's last, then second's retry
        m = await next_message(q)
        if m.id == second.id:
            await m.nack(error="for good", wait=True)  # its second attempt: dead
        else:
            await m.ack()
            keys.append(m.key)
    assert "key-1" in keys
    dead = list(sync_db["events.dead"].find())
    assert [d["_id"] for d in dead] == [second.id]
    for doc in dead:
        check(doc, "dead-fields")
    for doc in sync_db["events.inbox"].find():
        check(doc, "inbox-fields")
    await q.pause()
    await q.resume()
    control = {doc["_id"]: doc for doc in sync_db["events.control"].find()}
    assert sorted(control) == ["housekeeping", "layout", "pause"]  # the lease: taken by the consumer's first claim
    check(control["pause"], "control-fields")
    check(control["housekeeping"], "control-housekeeping-fields")
    assert control["housekeeping"]["owner"] == claims.owner_name()
    assert control["pause"]["paused"] is False and control["pause"]["by"]
    check(control["layout"], "control-layout-fields")
    tombstones = list(sync_db.events.find({"fin": {"$exists": True}}))
    assert tombstones, "finished buckets leave tombstones"
    for doc in tombstones:
        check_tombstone(doc)

    sync_db.events.insert_one({"v": 2, "due": utc_now()})
    sync_db.events.insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": utc_now(),
                               "due": utc_now(), "n": 1, "p": ["{bad"], "done": [], "c": 0,
                               "lease": None})
    assert await q.reserve(timeout=0.5) is None
    entries = list(sync_db["events.quarantine"].find())
    assert len(entries) == 2
    for doc in entries:
        check(doc, "quarantine-fields")

    await q.push_many(["served", "unserved"])
    held = await q.reserve(timeout=2)
    await held.ack()  # resolved: the drain need not wait out drain_timeout (10 s) for it
    await q.drain()  # releases the bucket, which has an unserved message: the release records its token
    released = sync_db.events.find_one({"released": {"$exists": True}})
    check_bucket(released)
    assert released["released"] == held._holding.held.token and released["lease"] is None


async def test_bson_documents_match_the_format(make_queue, sync_db):
    """The bson codec's buckets, retry buckets and dead letters hold documents in ``p``; a ``p`` entry of the wrong
    kind for its bucket's codec (text in a bson bucket, a document in a json one) makes the bucket malformed."""
    q = make_queue(codec="bson", bucket_max_wait=0.01, max_attempts=2)
    payloads = [{"i": i, "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc), "tags": ["a"]}
                for i in range(3)]
    await q.push_many(payloads)
    (doc,) = sync_db.events.find()
    check_bucket(doc)
    assert doc["enc"] == "bson" and [as_stored(p) for p in doc["p"]] == payloads

    first = await q.reserve(timeout=2)
    assert first.payload == payloads[0]
    first.payload["i"] = "changed"  # the consumer's copy: the retry stores what was pushed
    await first.nack(delay=0, error="again", wait=True)
    retry = sync_db.events.find_one({"o": {"$exists": True}})
    check_bucket(retry)
    assert retry["enc"] == "bson" and as_stored(retry["p"][0]) == payloads[0]
    for _ in range(3):  # the bucket's other two, then first's retry
        m = await next_message(q)
        await (m.nack(error="for good", wait=True) if m.id == first.id else m.ack())
    (dead,) = sync_db["events.dead"].find()
    check(dead, "dead-fields")
    assert dead["enc"] == "bson" and as_stored(dead["p"]) == payloads[0]

    now = utc_now()
    for enc, entry in (("bson", '{"i": 1}'), ("json", {"i": 1})):
        sync_db.events.insert_one({"_id": ObjectId(), "v": 1, "enc": enc, "created": now, "due": now, "n": 1,
                                   "p": [entry], "done": [], "c": 0, "lease": None})
    assert await q.reserve(timeout=0.5) is None
    entries = {e["doc"]["enc"]: e for e in sync_db["events.quarantine"].find()}
    for entry in entries.values():
        check(entry, "quarantine-fields")
    assert "must be a document (codec bson)" in entries["bson"]["reason"]
    assert "must be a string or binary" in entries["json"]["reason"]


def as_stored(payload: dict) -> dict:
    """A payload as the test's client reads it (naive UTC dates) made comparable to the aware ones pushed."""
    return {k: as_utc(v) if isinstance(v, dt.datetime) else v for k, v in payload.items()}


async def test_skip_mode_message_quarantine_entry_matches(make_queue, sync_db):
    q = make_queue(malformed="skip")
    sync_db.events.insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": utc_now(),
                               "due": utc_now(), "n": 2, "p": ["{bad", "1"], "done": [],
                               "c": 0, "lease": None})
    message = await q.reserve(timeout=1)
    assert message.payload == 1
    await message.ack()
    await q.drain()
    (entry,) = list(sync_db["events.quarantine"].find())
    check(entry, "quarantine-fields")
    assert entry["kind"] == "message"


async def test_group_documents_match_the_format(make_queue, sync_db):
    """Group buckets fresh, claimed, waiting for their group and released by a nack; the group's document in
    ``Q.groups``; a dead letter of a group."""
    q, other = make_queue(bucket_max_size=2, bucket_max_wait=0.01, max_attempts=2), make_queue()
    await q.push_many([Outgoing(i, group="g") for i in range(4)])
    places = [d["s"] for d in sync_db.events.find({"g": "g"}).sort("s", 1)]
    assert len(places) == 2 and places[0] < places[1]
    first = await q.reserve(timeout=2)
    assert await other.reserve(timeout=0.3) is None  # claims the second bucket, which waits for the group
    for doc in sync_db.events.find():
        check_bucket(doc)
    assert sync_db.events.find_one({"w": True})["_id"] != first._holding.held.bucket.id
    lock, counter = sync_db["events.groups"].find_one({"_id": "g"}), sync_db["events.groups"].find_one({"_id": 0})
    check(lock, "group-lock-fields")
    check(counter, "group-counter-fields")
    assert lock["token"] == first._holding.held.token and as_utc(lock["until"]) == first._holding.held.lease_until
    assert counter["seq"] == places[1]
    await first.nack(delay=0, error="later", wait=True)
    nacked = sync_db.events.find_one({"_id": first._holding.held.bucket.id})
    check_bucket(nacked)
    assert nacked["t"] == [1, 0] and "w" not in nacked
    again = await q.reserve(timeout=2)
    await again.nack(error="for good", wait=True)
    (dead,) = list(sync_db["events.dead"].find())
    check(dead, "dead-fields")
    assert dead["g"] == "g"
    lock = sync_db["events.groups"].find_one({"_id": "g"})
    check(lock, "group-lock-fields")
    assert lock["token"] == again._holding.held.token  # slot 1 is next
    await (await q.reserve(timeout=2)).ack(wait=True)
    assert sync_db["events.groups"].find_one({"_id": "g"}) is None, "a free group leaves no document"


async def test_priority_documents_match_the_format(make_queue, sync_db):
    """A bucket with a level (``pr``), its retry bucket, its dead letter and a quarantined message of it."""
    q = make_queue(bucket_max_wait=0.01, max_attempts=1, malformed="skip")
    await q.push_many(["a", "b"], priority=4)
    message = await q.reserve(timeout=2)
    (claimed,) = list(sync_db.events.find())
    check_bucket(claimed)
    assert claimed["pr"] == 4
    await message.nack(error="dead", wait=True)
    (dead,) = list(sync_db["events.dead"].find())
    check(dead, "dead-fields")
    assert dead["pr"] == 4
    await (await q.reserve(timeout=2)).ack(wait=True)
    now = utc_now()
    sync_db.events.insert_one({"_id": ObjectId(), "v": 1, "enc": "json", "created": now, "due": now, "n": 2,
                               "p": ["{bad", "1"], "done": [], "c": 0, "lease": None, "pr": 2})
    served = await q.reserve(timeout=2)
    assert served.payload == 1
    await served.ack()
    await q.drain()
    (entry,) = list(sync_db["events.quarantine"].find())
    check(entry, "quarantine-fields")
    assert entry["pr"] == 2


async def test_schedule_documents_match_the_format(make_queue, sync_db):
    """A schedule's state document in ``Q.control`` and the bucket of a tick, with its ``_id``, ``pt`` and key."""
    from bucketq import Schedule
    from bucketq.core.schedule import tick_bucket_id

    start = dt.datetime(2026, 1, 5, 9, 0, 30, tzinfo=dt.timezone.utc)
    await make_queue(partitions=3).push("set up with 3 partitions")
    schedule = Schedule(make_queue(), "* * * * *", {"job": 1}, name="report")  # adopts the queue's count
    await schedule.run_once(now=start)
    (tick,) = await schedule.run_once(now=start + dt.timedelta(minutes=1))
    state = sync_db["events.control"].find_one({"_id": "schedule:report"})
    check(state, "control-schedule-fields")
    assert as_utc(state["tick"]) == tick and state["sent"] is True
    bucket = sync_db.events.find_one({"_id": tick_bucket_id("events", "report", tick)})
    check_bucket(bucket)
    assert bucket["_id"].generation_time == tick
    assert bucket["pt"] == zlib.crc32(b"report") % 3 and bucket["k"] == ["schedule:report@2026-01-05T09:01:00+00:00"]
    assert as_utc(bucket["due"]) == tick


@pytest.mark.parametrize("value, expression, ok", [
    ([1, 2], "array of int", True), ([True], "array of int", False), (None, "null or object", True),
    (["a", b"b"], "array of string or binData", True), ([1.5], "array of int", False),
])
def test_the_type_checker_itself(value, expression, ok):
    assert matches(value, expression) is ok


@pytest.mark.parametrize("partitions", [1, 2])
async def test_stream_documents_match_the_format(queue_target, db_name, sync_db, partitions):
    import bucketq
    from bucketq.core.stream_format import COUNTER_ID, LAYOUT_ID

    v2 = partitions > 1  # version 2: each table with what docs/FORMAT.md's Partitions changes
    counter_id = f"{COUNTER_ID}.0" if v2 else COUNTER_ID
    async with bucketq.Stream(queue_target, name="log", db=db_name, gap_wait=0.1, poll_interval=0.01,
                              partitions=partitions) as stream:
        await stream.ready()  # opened: the stream's partitions known
        stream.store._next_part = 0  # the writes below go to partitions 0, 1, then 0 again
        await stream.push_many([{"i": 1}, "two"])
        await stream.push({"h": True}, headers={"trace": "x"}, key="k-1")
        sync_db["log.seq"].update_one({"_id": counter_id}, {"$inc": {"last": 1}})  # a producer killed: a hole
        if v2:
            stream.store._next_part = 0
        await stream.push(b"\x00".decode())
        reader = stream.reader("audit", start="beginning")
        first = await reader.read_many(2, timeout=2)
        await first[0].ack()
        await reader.flush()
        for message in first[1:]:
            await message.ack()
        while batch := await reader.read_many(10, timeout=0.5):
            for message in batch[:-1]:
                await message.ack()
        await reader.flush()
        await stream.reset("replay", at=utc_now())
        await stream.apply_retention()
    partitioned = ("stream-partitioned-bucket-fields",) if v2 else ()
    buckets = list(sync_db["log"].find({"gap": {"$exists": False}}))
    assert len(buckets) == 3
    for doc in buckets:
        check(doc, "stream-bucket-fields", *partitioned)
        assert doc["n"] == len(doc["p"]) and all(len(doc[f]) == doc["n"] for f in "hk" if f in doc)
        assert doc["v"] == (2 if v2 else 1) and (not v2 or doc["_id"] == f"{doc['pt']}/{doc['s']}")
    (gap,) = list(sync_db["log"].find({"gap": {"$exists": True}}))
    check(gap, "stream-gap-fields", *partitioned)
    assert gap["_id"] == ("0/2" if v2 else 3)
    counters = list(sync_db["log.seq"].find({"_id": {"$ne": LAYOUT_ID}}))
    assert len(counters) == partitions
    for counter in counters:
        check(counter, "stream-seq-fields")
    if v2:
        check(sync_db["log.seq"].find_one({"_id": LAYOUT_ID}), "stream-layout-fields")
    groups = list(sync_db["log.positions"].find())
    assert {g["_id"] for g in groups} == {"audit", "replay"}
    for doc in groups:
        check(doc, "stream-group-fields", *(("stream-partitioned-group-fields",) if v2 else ()))
    claims = list(sync_db["log.claims"].find())
    assert claims and any(not c["fin"] for c in claims)  # the last bucket: its last message unacked
    for doc in claims:
        check(doc, "stream-claim-fields", *(("stream-partitioned-claim-fields",) if v2 else ()))
        check(doc["lease"], "lease-fields")
        # a string: the test server's H2 backend loses track of document-valued _ids (core.stream_claims)
        where = f"{doc['pt']}/{doc['s']}" if v2 else str(doc["s"])
        assert doc["_id"] == f"{doc['e']}:{where}:{doc['g']}"


async def test_rate_limit_windows_match_the_format(make_queue, sync_db):
    import bucketq

    limit = bucketq.RateLimit(3, per=3600)
    await make_queue(bucket_max_wait=0.01).push_many(list(range(5)))
    q = make_queue(rate_limit=limit)
    while (m := await q.reserve(timeout=0)) is not None:
        await m.ack()
    (window,) = sync_db["events.rate"].find()
    check(window, "rate-fields")
    assert window["_id"].replace(tzinfo=None) == limit.window(q._clock.now()).replace(tzinfo=None)
    assert window["n"] >= limit.limit
    layout = sync_db["events.control"].find_one({"_id": "layout"})
    check(layout, "control-layout-fields")
    check(layout["rate_limit"], "control-rate-limit-fields")
    assert layout["rate_limit"] == {"limit": 3, "per": 3600.0}


NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("stored", [b"{}", Binary(b"{}", 128)])
def test_a_payload_is_stored_as_a_string_or_binary(stored):
    """Strings and binaries of any subtype (``Binary`` is a ``bytes``) parse; anything else is a malformed bucket."""
    doc = bucket_document(ObjectId(), [Slot('"a"'), Slot("{}")], codec="json", created=NOW, due=NOW)
    doc["p"][1] = stored
    assert parse_bucket(doc).payloads[1] == stored
    for bad in (1, None, ["{}"]):
        doc["p"][1] = bad
        with pytest.raises(MalformedBucket, match="every payload in p must be a string or binary"):
            parse_bucket(doc)


# A slot as a producer's open bucket holds it: a plain message's stored payload itself, or a Slot (with a key, a
# try, or no field set at all); each is paired with the Slot that writes the same message.
_STORED = st.one_of(st.text(max_size=8), st.binary(max_size=8))
_SLOTS = st.lists(st.one_of(
    _STORED.map(lambda stored: (stored, Slot(stored))),
    st.tuples(_STORED, st.one_of(st.none(), st.text(min_size=1, max_size=4)), st.integers(0, 3)).map(
        lambda fields: (Slot(fields[0], key=fields[1], tries=fields[2]),) * 2),
), max_size=6)


@given(slots=_SLOTS, group=st.sampled_from([None, "g"]))
def test_a_plain_slot_writes_what_its_slot_would(slots, group):
    """The producer's common push keeps its stored payload as the slot, no tuple: a bucket of such slots, alone or
    mixed with Slots, is the document the same messages as Slots make (no per-slot array for plain messages; a
    group bucket's ``t`` all the same)."""
    bucket_id = ObjectId()
    as_held = bucket_document(bucket_id, [held for held, _ in slots], codec="json", created=NOW, due=NOW, group=group)
    assert as_held == bucket_document(bucket_id, [slot for _, slot in slots], codec="json", created=NOW, due=NOW,
                                      group=group)
    assert list(as_held) == list(bucket_document(bucket_id, [slot for _, slot in slots], codec="json", created=NOW,
                                                 due=NOW, group=group))  # the fields in the same order too
