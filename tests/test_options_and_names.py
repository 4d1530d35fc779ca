"""Queue and database names, options and codecs: what is refused at construction (or push) with a clear error,
and that what is accepted works end to end on a real server."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import sys
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest
from bson import ObjectId

import bucketq
from bucketq.batch import BatchQueue
from bucketq.codecs import CodecUnavailable, codec_for, codec_named
from bucketq.core.format import QUEUE_SUFFIXES, Slot, bucket_document
from bucketq.memory import MemoryClient
from bucketq.options import MAX_DELAY_S, MAX_NAMESPACE_BYTES, SIDE_COLLECTION_SUFFIXES, QueueOptions
from tests.helpers import utc_now

LONGEST_SUFFIX = max(SIDE_COLLECTION_SUFFIXES, key=len)


def longest_name(db: str, char: str) -> str:
    """The longest queue name made of ``char`` whose longest namespace fits MongoDB's limit."""
    room = MAX_NAMESPACE_BYTES - len(f"{db}.{LONGEST_SUFFIX}".encode())
    return char * (room // len(char.encode()))


def uri_with(uri: str, *, db: str = "", query: str = "") -> str:
    """``uri`` with its database path replaced by ``db`` and ``query`` added to its options."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=f"/{db}", query="&".join(q for q in (parts.query, query) if q)))


async def round_trip(q: bucketq.Queue, payload: Any = "m") -> None:
    """Push, reserve and ack one message, then one of an ordered group (which uses ``Q.groups``), and count by
    state: the queue works."""
    for group in (None, "group"):
        message_id = await q.push(payload, group=group)
        message = await q.reserve(timeout=5)
        assert message is not None and (message.id, message.payload) == (message_id, payload)
        await message.ack(wait=True)
    assert (await q.stats())["ready"] == 0


# -- queue names ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    *(f"orders{suffix}" for suffix in SIDE_COLLECTION_SUFFIXES),  # another queue's side collections
    "a.b.dead", "x.", "a..b", ".x", ".", "ev\ud800", "\udc00", "system.x", "system", "a$b", "a\0b", "", 5, None,
    b"orders",
])
def test_bad_queue_names_are_invalid_option(mongo_uri, name):
    with pytest.raises(bucketq.InvalidOption, match="name"):
        bucketq.Queue(mongo_uri, name=name)


@pytest.mark.parametrize("char", ["a", "é", "€", "😀"])  # 1, 2, 3 and 4 UTF-8 bytes
def test_the_namespace_limit_counts_utf8_bytes(mongo_uri, db_name, char):
    name = longest_name(db_name, char)
    bucketq.Queue(mongo_uri, name=name, db=db_name)
    with pytest.raises(bucketq.InvalidOption, match="too long"):
        bucketq.Queue(mongo_uri, name=name + char, db=db_name)


@pytest.mark.parametrize("name", ["orders.deadline", "dead", "quarantine.x", "orders.dead.x", "a.b", "ünï cødé",
                                  "systems"])
async def test_names_that_collide_with_nothing_work(make_queue, sync_db, name):
    # (with a rate limit: its collection is made by the first ask)
    q = make_queue(name=name, bucket_max_wait=0.005, change_streams=False, rate_limit=bucketq.RateLimit(100))
    await round_trip(q)
    assert set(sync_db.list_collection_names()) == {name, *(name + s for s in QUEUE_SUFFIXES)}, \
        "the store and QUEUE_SUFFIXES disagree on the queue's collections"


async def test_the_longest_accepted_name_works(make_queue, db_name):
    q = make_queue(name=longest_name(db_name, "é"), bucket_max_wait=0.005, change_streams=False)
    await round_trip(q)


def test_the_database_chosen_by_the_uri_counts_in_the_namespace(mongo_uri, db_name):
    name = longest_name(db_name, "a")
    bucketq.Queue(uri_with(mongo_uri, db=db_name), name=name)
    with pytest.raises(bucketq.InvalidOption, match="too long"):
        bucketq.Queue(uri_with(mongo_uri, db=db_name + "x"), name=name)


async def test_the_database_of_an_async_database_counts_in_the_namespace(async_client, db_name):
    name = longest_name(db_name, "a")
    await bucketq.Queue(async_client[db_name], name=name).close()
    with pytest.raises(bucketq.InvalidOption, match="too long"):
        bucketq.Queue(async_client[db_name + "x"], name=name)


# -- database names ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("db", ["a b", "a.b", 5, "", b"db", *(f"a{c}b" for c in '/\\"$*<>:|?\0'), "x" * 64,
                                "é" * 32, "ev\ud800"])
def test_bad_database_names_are_invalid_option(mongo_uri, db):
    with pytest.raises(bucketq.InvalidOption, match="db|database"):
        bucketq.Queue(mongo_uri, name="events", db=db)


def test_a_bad_database_name_in_the_uri_is_invalid_option(mongo_uri):
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Queue(uri_with(mongo_uri, db="a*b"), name="events")


async def test_a_63_byte_database_name_works(mongo_uri, async_client):
    db = "bq_test_" + "é" * 27 + "x"  # 8 + 54 + 1 = 63 bytes
    q = bucketq.Queue(mongo_uri, name="events", db=db, bucket_max_wait=0.005, change_streams=False)
    try:
        await round_trip(q)
    finally:
        await q.close()
        await async_client.drop_database(db)


# -- options -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("w", [0, -1, True, False, "", "ev\ud800", 51, 1.0, {"w": 0}, [1]])
def test_unacknowledged_or_impossible_write_concerns_are_refused(w):
    with pytest.raises(bucketq.InvalidOption, match="write_concern"):
        QueueOptions(write_concern=w)


@pytest.mark.parametrize("w", [1, 50, "majority", "dc-east"])
def test_acknowledged_write_concerns_are_taken(w):
    assert QueueOptions(write_concern=w).write_concern == w


@pytest.mark.parametrize("w", [1, "majority"])
async def test_an_explicit_write_concern_is_applied(make_queue, w):
    q = make_queue(write_concern=w, bucket_max_wait=0.005, change_streams=False)
    assert q._store.buckets.write_concern.document == {"w": w}
    await round_trip(q)


def test_a_client_default_of_w0_is_refused_unless_overridden(mongo_uri):
    uri = uri_with(mongo_uri, query="w=0")
    with pytest.raises(bucketq.InvalidOption, match="unacknowledged"):
        bucketq.Queue(uri, name="events")
    assert bucketq.Queue(uri, name="events", write_concern=1)._store.buckets.write_concern.acknowledged


@pytest.mark.parametrize("options", [
    {"quarantine_retention": 1e300}, {"inbox_retention": 1e20}, {"quarantine_retention": 0},
    {"inbox_retention": float("inf")}, {"quarantine_retention": float("nan")}, {"inbox_retention": "7d"},
    {"retry_base": 1e300, "retry_max": 1e300}, {"retry_max": MAX_DELAY_S * 2}, {"retry_base": 2, "retry_max": 1},
    {"write_timeout": 1e300}, {"write_timeout": float("inf")}, {"write_timeout": 0},
    {"tombstone_retention": 30.0}, {"tombstone_retention": 10, "write_timeout": 20}, {"tombstone_retention": None},
    {"tombstone_retention": 1e300}, {"tombstone_retention": True}, {"tombstone_retention": float("nan")},
])
def test_out_of_range_times_are_refused(options):
    with pytest.raises(bucketq.InvalidOption, match="|".join(options)):
        QueueOptions(**options)


def test_tombstone_retention_defaults_to_ten_minutes_and_must_exceed_write_timeout():
    assert QueueOptions().tombstone_retention == 600.0
    assert QueueOptions(write_timeout=30, tombstone_retention=30.5).tombstone_retention == 30.5
    assert QueueOptions(write_timeout=900, tombstone_retention=MAX_DELAY_S).tombstone_retention == MAX_DELAY_S


@pytest.mark.backends("memory", "server")
async def test_options_bounded_by_the_lease_or_write_timeout_follow_it_unless_set(make_queue, backend):
    """A short lease or a long write_timeout never fails on an option the user did not set: state_flush_period
    and tombstone_retention follow them; one the user set out of bounds still fails, naming itself."""
    q = make_queue(lease=1.0, write_timeout=900)
    assert q.options.state_flush_period == pytest.approx(1 / 3)
    assert q.options.tombstone_retention == 1800.0
    await q.push("short lease")
    message = await q.reserve(timeout=5)
    assert message is not None and message.payload == "short lease"
    await message.ack(wait=True)
    assert QueueOptions().state_flush_period == 0.5  # the lease's third is more: the default stands
    with pytest.raises(bucketq.InvalidOption, match=r"state_flush_period must be between 0.01 s and a third of "
                                                     r"the lease \(0.333333 s\)"):
        QueueOptions(lease=1.0, state_flush_period=0.5)  # the default's number, but set: refused
    with pytest.raises(bucketq.InvalidOption, match="tombstone_retention must be more than write_timeout"):
        QueueOptions(write_timeout=900, tombstone_retention=600.0)
    batch = BatchQueue(MemoryClient(), name="events", op_timeout_s=900)
    assert batch.tombstone_retention == 1800.0


async def test_retention_none_keeps_quarantine_and_inbox_forever(make_queue, sync_db):
    q = make_queue(quarantine_retention=None, inbox_retention=None)
    assert (q.options.quarantine_retention, q.options.inbox_retention) == (None, None)
    await q.stats()  # set up (clock measured)
    ancient = dt.datetime(1971, 1, 1, tzinfo=dt.timezone.utc)
    sync_db["events.quarantine"].insert_one({"_id": "old", "kind": "message", "reason": "r", "at": ancient})
    sync_db["events.inbox"].insert_one({"_id": "key", "at": ancient})
    counts = await q.purge_expired()
    assert (counts["quarantined"], counts["inbox"]) == (0, 0)
    assert sync_db["events.quarantine"].count_documents({}) == sync_db["events.inbox"].count_documents({}) == 1


async def test_a_century_of_retention_and_backoff_works(make_queue, sync_db):
    """The largest accepted times overflow nothing: the purge runs and a nack schedules the retry a century on."""
    q = make_queue(quarantine_retention=MAX_DELAY_S, inbox_retention=MAX_DELAY_S, retry_base=MAX_DELAY_S,
                   retry_max=MAX_DELAY_S, retry_jitter=0, bucket_max_wait=0.005, change_streams=False)
    await q.push("m")
    message = await q.reserve(timeout=5)
    counts = await q.purge_expired()
    assert (counts["quarantined"], counts["inbox"]) == (0, 0)
    await message.nack(wait=True)
    assert (await q.stats())["scheduled"] == 1
    [retry] = [d for d in sync_db.events.find() if d.get("p")]
    assert retry["due"].year >= dt.datetime.now().year + 99


# -- codecs --------------------------------------------------------------------------------------------------

class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Mode(enum.StrEnum):
    FAST = "fast"


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("payload", [
    dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc), dt.datetime(2024, 1, 2), dt.date(2024, 1, 2), dt.time(1, 2),
    uuid.UUID(int=1), Color.RED, Point(1), decimal.Decimal("1.5"), orjson.Fragment(b"[1]"), {1, 2}, b"x",
    {"deep": [{"in": (1, uuid.uuid4())}]}, [collections.OrderedDict(c=Color.RED)], {"when": dt.date(2024, 1, 2)},
    {"a": [1.5, float("nan")]}, (float("-inf"),), {1: "non-str key"},
])
def test_json_refuses_what_it_cannot_give_back(payload):
    with pytest.raises((TypeError, ValueError)):
        bucketq.JsonCodec().dump(payload)


@pytest.mark.parametrize("payload, back", [
    ({"a": [1, 2.5, True, None, "x"], "b": {}}, {"a": [1, 2.5, True, None, "x"], "b": {}}),
    ((1, (2, None)), [1, [2, None]]),
    (collections.OrderedDict(k=Level.HIGH, m=Mode.FAST), {"k": 3, "m": "fast"}),  # int and str subclasses
    ({"k": [2**64 - 1, -(2**63), -0.0, 1e308]}, {"k": [2**64 - 1, -(2**63), -0.0, 1e308]}),
])
def test_json_takes_json_types_and_their_subclasses(payload, back):
    codec = bucketq.JsonCodec()
    got = codec.load(codec.dump(payload))
    assert got == back and type(got) is type(back)


async def test_a_refused_json_payload_fails_its_own_push_only(make_queue):
    q = make_queue(bucket_max_wait=0.005, change_streams=False)
    await q.__aenter__()  # set up, so that the pushes below share one bucket
    good = q.push_nowait({"id": uuid.UUID(int=7).hex})
    with pytest.raises(bucketq.EncodeError, match="UUID"):
        await q.push({"id": uuid.UUID(int=7)})
    message = await q.reserve(timeout=5)
    assert (message.id, message.payload) == (await good, {"id": uuid.UUID(int=7).hex})
    await message.ack()  # else the close waits drain_timeout (10 s) for it


@pytest.mark.parametrize("payload", [{(1, 2): 3}, {"a": [{(1,): "x"}]}, {"k": {((1, 2), 3): None}}])
def test_msgpack_refuses_dict_keys_it_cannot_decode(payload):
    with pytest.raises(ValueError, match="decode"):
        bucketq.MsgpackCodec().dump(payload)


def test_msgpack_takes_the_keys_it_decodes():
    codec = bucketq.MsgpackCodec()
    payload = {1: "int", None: "none", b"k": "bytes", 1.5: "float", "s": [(1, 2)]}
    assert codec.load(codec.dump(payload)) == {1: "int", None: "none", b"k": "bytes", 1.5: "float", "s": [[1, 2]]}


@pytest.fixture
def msgpack_missing(monkeypatch):
    """As if the msgpack extra were not installed: ``import msgpack`` raises ImportError."""
    monkeypatch.setitem(sys.modules, "msgpack", None)


def test_a_missing_or_unknown_codec_is_codec_unavailable(msgpack_missing):
    for name in ("msgpack", "rot13"):
        with pytest.raises(CodecUnavailable, match=name) as caught:
            codec_named(name)
        assert isinstance(caught.value, bucketq.MalformedBucket)
        with pytest.raises(CodecUnavailable):
            codec_for(name, bucketq.JsonCodec())
    with pytest.raises(CodecUnavailable, match="extra"):
        bucketq.MsgpackCodec()


def test_a_queue_with_a_missing_codec_is_invalid_option(mongo_uri, msgpack_missing):
    with pytest.raises(bucketq.InvalidOption, match="msgpack extra"):
        bucketq.Queue(mongo_uri, name="events", codec="msgpack")


async def test_a_bucket_naming_a_missing_codec_is_quarantined(make_queue, sync_db, msgpack_missing):
    past = utc_now() - dt.timedelta(seconds=5)
    doc = bucket_document(ObjectId(), [Slot(b"\x81\xa1k\x01")], codec="msgpack", created=past, due=past)
    sync_db.events.insert_one(doc)
    q = make_queue(bucket_max_wait=0.005, change_streams=False)
    good = await q.push("good")
    message = await q.reserve(timeout=5)
    assert (message.id, message.payload) == (good, "good")
    await message.ack(wait=True)
    [entry] = await q.quarantined()
    assert entry["kind"] == "bucket" and "msgpack extra" in entry["reason"]
