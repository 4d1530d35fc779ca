"""Bad input on every public entry point, driven by hypothesis.

Every bad value must end in a clear error, a ``bucketq.BucketqError`` subclass, or in quarantine, and no other
message may be lost: the examples push a good *sentinel* message into the same bucket as the bad input
(or next to the corrupted bucket) and check that it is delivered.

Library bugs found this way each have a minimal ``xfail(strict=True)`` test (``test_bug_*``); the hypothesis
properties leave exactly those inputs out (the ``_bug_*`` predicates). When a bug is fixed, its strict xfail
turns into a failure: delete the marker, and the predicate so that the property covers those inputs again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import enum
import math
import uuid
from typing import Any

import msgpack
import orjson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from pymongo.errors import PyMongoError

import bucketq
from bucketq.core.format import MAX_BUCKET_BYTES, Slot, bucket_document
from bucketq.options import QueueOptions
from tests.helpers import examples, utc_now

pytestmark = pytest.mark.timeout(600)

UTC = dt.timezone.utc
SETTINGS = settings(max_examples=examples(60), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])
FEW = settings(SETTINGS, max_examples=examples(25))
SENTINEL = {"sentinel": True}
# datetime's range ends in year 9999: delays past about 2.5e11 s cannot be a due time at all.
MAX_REPRESENTABLE_DELAY_S = 2.0e11


# -- helpers -------------------------------------------------------------------------------------------------

def new_queue(adb: Any, **options: Any) -> bucketq.Queue:
    """A queue of its own (a fresh collection) on the test's database, quick to write and to poll."""
    options = {"bucket_max_wait": 0.005, "change_streams": False, "poll_interval": 0.01, "drain_timeout": 0,
               **options}
    return bucketq.Queue(adb, name=f"q_{uuid.uuid4().hex[:12]}", **options)


async def ready_queue(adb: Any, **options: Any) -> bucketq.Queue:
    """``new_queue``, set up (clock measured, indexes made: entering it does that), so that a ``push_nowait``
    followed by a ``push`` puts both messages in one bucket: nothing in between yields to the event loop."""
    q = new_queue(adb, **options)
    await q.__aenter__()
    return q


async def deliver_all(q: bucketq.Queue, adb: Any, *, timeout_s: float = 15.0) -> list[bucketq.Message]:
    """Reserve and ack until the bucket collection is empty. Any error that is not a BucketqError fails."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    got: list[bucketq.Message] = []
    while True:
        message = await q.reserve(timeout=0.02)
        if message is not None:
            got.append(message)
            await message.ack()
            continue
        if await adb[q.name].count_documents({"fin": {"$exists": False}}) == 0:
            return got
        assert loop.time() < deadline, f"the queue was not emptied: {await adb[q.name].find().to_list(None)}"


async def deliver_ids(q: bucketq.Queue, ids: set[str], *, timeout_s: float = 15.0) -> dict[str, Any]:
    """Reserve and ack until every id in ``ids`` was delivered; returns payloads by id (others too)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    got: dict[str, Any] = {}
    while not ids <= set(got):
        assert loop.time() < deadline, f"never delivered: {ids - set(got)}"
        message = await q.reserve(timeout=0.05)
        if message is not None:
            got[message.id] = message
            await message.ack()
    return got


def normalize(value: Any) -> Any:
    """What a codec gives back: tuples become lists, subclasses of built-in types become the type itself."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {normalize(k): normalize(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN and types must match (True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _unencodable_text(value: Any) -> bool:
    """Text with lone surrogates: it cannot be sent to the server, so filters refuse it with InvalidOption."""
    return isinstance(value, str) and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)


# -- payloads of every JSON and BSON type ---------------------------------------------------------------------

class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int


SURROGATES = st.sampled_from(["\ud800", "a\udfff", "\udc00b", "ok\ud83d"])
# Trees of values every codec can take (64-bit ints, finite floats, valid text); one odd value is then put
# in, or not, so that the odd value alone decides whether the push is refused.
CLEAN_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                          st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
CLEAN_TREES = st.recursive(
    CLEAN_SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.tuples(children, children),
                               st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=10,
)
# Odd values by kind, each kind about as likely as the others (rather than each of thirty values).
ODD_SCALARS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.one_of(SURROGATES, st.sampled_from([2**64 - 1, 2**64, -(2**63) - 1, 10**30])),
    st.one_of(st.datetimes(timezones=st.none() | st.just(UTC)), st.dates(), st.times(), st.uuids(),
              st.just(Color.RED), st.builds(Point, st.integers())),
    st.one_of(st.builds(ObjectId), st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
              st.builds(Decimal128, st.sampled_from(["1.5", "NaN", "-0"])), st.builds(Regex, st.sampled_from(["a.*"])),
              st.builds(Code, st.text(max_size=5)), st.builds(Timestamp, st.integers(0, 2**31), st.integers(0, 5)),
              st.builds(MinKey), st.builds(MaxKey)),
    st.one_of(st.binary(max_size=10), st.builds(bytearray, st.binary(max_size=4)),
              st.builds(Binary, st.binary(max_size=4), st.sampled_from([0, 4, 5, 128])),
              st.builds(memoryview, st.binary(max_size=4))),
    st.one_of(st.decimals(allow_nan=True), st.complex_numbers(max_magnitude=10),
              st.frozensets(st.integers(), max_size=2), st.sets(st.integers(), max_size=2), st.builds(object),
              st.just(Ellipsis), st.just(print)),
)
ODD_KEYS = st.one_of(SURROGATES, st.integers(-3, 3), st.none(), st.booleans(), st.floats(allow_nan=False),
                     st.tuples(st.integers(0, 2), st.integers(0, 2)))  # bson.Code is unhashable: no key


class ListSubclass(list):
    pass


@st.composite
def payloads(draw: Any) -> Any:
    tree = draw(CLEAN_TREES)
    how = draw(st.sampled_from(["clean", "alone", "in a list", "in a dict", "as a key", "in a dict subclass",
                                "in a list subclass"]))
    if how == "clean":
        return tree
    if how == "as a key":
        return {draw(ODD_KEYS): tree}
    odd = draw(ODD_SCALARS)
    if how == "alone":
        return odd
    if how == "in a list":
        return [tree, odd]
    if how == "in a dict":
        return {"tree": tree, "odd": odd}
    inner = collections.OrderedDict(odd=odd) if how == "in a dict subclass" else ListSubclass([odd])
    return draw(st.sampled_from([inner, [tree, inner], {"tree": tree, "inner": inner}]))


PAYLOADS = payloads()


@pytest.mark.parametrize("codec", ["json", "msgpack"])
@SETTINGS
@given(payload=PAYLOADS)
async def test_any_payload_is_refused_with_a_clear_error_or_delivered_intact(adb, payload, codec):
    q = await ready_queue(adb, codec=codec, malformed="skip")
    try:
        sentinel = q.push_nowait(SENTINEL)  # buffered first: the bad payload would share its bucket
        try:
            message_id = await q.push(payload)
        except (bucketq.EncodeError, bucketq.PayloadTooLarge):
            message_id = None
        # A refused push raises before the sentinel's bucket is written: wait for that write, or the collection
        # may still look empty to deliver_all.
        sentinel_id = await sentinel
        got = {m.id: m.payload for m in await deliver_all(q, adb)}
        assert got.pop(sentinel_id) == SENTINEL
        if message_id is not None:
            assert same(got.pop(message_id), normalize(payload)), "the payload came back changed"
        assert got == {}
        assert await q.quarantined() == []
    finally:
        await q.close()


CONTAINERS = [dict, collections.OrderedDict, lambda **kw: collections.defaultdict(int, **kw), list, ListSubclass,
              tuple]


@settings(SETTINGS, max_examples=examples(200))
@given(value=st.sampled_from([float("nan"), float("inf"), float("-inf"), 1.5]),
       wrappers=st.lists(st.sampled_from(range(len(CONTAINERS))), max_size=4))
def test_json_codec_never_turns_a_non_finite_float_into_null(value, wrappers):
    """orjson writes NaN and infinity as null; the json codec must refuse them wherever they are."""
    payload: Any = value
    for index in wrappers:
        make = CONTAINERS[index]
        payload = make(x=payload) if index < 3 else make([payload])
    codec = bucketq.JsonCodec()
    try:
        stored = codec.dump(payload)
    except ValueError:
        assert not math.isfinite(value)
        return
    assert math.isfinite(value) and "null" not in stored and same(codec.load(stored), normalize(payload))


def nested(depth: int, kind: str) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def depth_of(value: Any, kind: str) -> int | None:
    depth = 0
    while True:
        if value == 0 and not isinstance(value, (list, dict)):
            return depth
        if kind == "list" and isinstance(value, list) and len(value) == 1:
            value = value[0]
        elif kind == "dict" and isinstance(value, dict) and list(value) == ["k"]:
            value = value["k"]
        else:
            return None
        depth += 1


@FEW
@given(depth=st.integers(0, 5000), kind=st.sampled_from(["list", "dict"]),
       codec=st.sampled_from(["json", "msgpack"]))
async def test_deeply_nested_payload_is_refused_clearly_or_delivered_intact(adb, depth, kind, codec):
    q = await ready_queue(adb, codec=codec, malformed="skip")
    try:
        sentinel = q.push_nowait(SENTINEL)
        try:
            message_id = await q.push(nested(depth, kind))
        except bucketq.EncodeError:
            message_id = None
        # A refused push raises before the sentinel's bucket is written: wait for that write, or the collection
        # may still look empty to deliver_all.
        sentinel_id = await sentinel
        got = {m.id: m.payload for m in await deliver_all(q, adb)}
        assert got.pop(sentinel_id) == SENTINEL
        if message_id is not None:
            assert depth_of(got.pop(message_id), kind) == depth
        assert got == {} and await q.quarantined() == []
    finally:
        await q.close()


@FEW
@given(size=st.integers(3500, 4200), key_size=st.none() | st.integers(0, 400),
       header_size=st.none() | st.integers(0, 400), codec=st.sampled_from(["json", "msgpack"]))
async def test_payloads_around_the_bucket_size_limit(adb, size, key_size, header_size, codec):
    """Near ``bucket_max_bytes`` a payload, with its key and headers, is stored whole or refused."""
    q = new_queue(adb, codec=codec, bucket_max_bytes=4096, max_buffered_bytes=16384)
    payload = "x" * size if codec == "json" else b"x" * size
    key = None if key_size is None else "k" * key_size
    headers = None if header_size is None else {"h": "v" * header_size}
    try:
        try:
            message_id = await q.push(payload, key=key, headers=headers)
        except bucketq.PayloadTooLarge:
            message_id = None
        got = await deliver_all(q, adb)
        if message_id is None:
            assert got == []
        else:
            [message] = got
            assert (message.id, message.payload, message.key, message.headers) == \
                (message_id, payload, key, headers or {})
    finally:
        await q.close()


async def test_a_payload_over_16_mib_is_refused_and_push_many_pushes_none_of_its_batch(adb):
    q = new_queue(adb)
    try:
        with pytest.raises(bucketq.PayloadTooLarge):
            await q.push("x" * (17 * 1024 * 1024))
        with pytest.raises(bucketq.PayloadTooLarge, match="payload 1"):
            await q.push_many(["small", "x" * (17 * 1024 * 1024), "small"])
        with pytest.raises(bucketq.EncodeError, match="payload 2"):
            await q.push_many(["small", "small", {1, 2}])
        assert await deliver_all(q, adb) == []
    finally:
        await q.close()


async def test_the_largest_payload_a_bucket_can_hold_is_stored_and_retried(adb):
    """A payload filling ``bucket_max_bytes`` at its maximum still leaves room for the consumer's state and
    for the retry bucket of a nack (origin id, enqueue time, tries)."""
    q = new_queue(adb, bucket_max_bytes=MAX_BUCKET_BYTES, max_buffered_bytes=MAX_BUCKET_BYTES)
    try:
        size = MAX_BUCKET_BYTES - 256 - 100
        for attempt in range(size, 0, -16):
            try:
                message_id = await q.push("x" * attempt, key="k", headers={"h": 1})
                break
            except bucketq.PayloadTooLarge:
                continue
        assert MAX_BUCKET_BYTES - attempt < 1024, "a payload close to the limit should fit"
        message = await q.reserve(timeout=10)
        assert message.id == message_id and len(message.payload) == attempt
        await message.nack(delay=0, wait=True)
        again = await q.reserve(timeout=10)
        assert again.id == message_id and again.tries == 1 and len(again.payload) == attempt
        await again.ack(wait=True)
    finally:
        await q.close()


# -- the other arguments of push ------------------------------------------------------------------------------

HEADER_KEYS = st.one_of(st.text(max_size=5), st.sampled_from(["a\0b", "$x", "a.b", ""]), st.integers(0, 2))
HEADERS = st.one_of(
    st.none(),
    st.dictionaries(HEADER_KEYS, st.one_of(st.none(), st.integers(), st.text(max_size=5), SURROGATES,
                                           st.builds(object), st.integers(min_value=2**64), st.binary(max_size=3)),
                    max_size=3),
    st.integers(), st.lists(st.integers(), max_size=2), st.text(max_size=3),
)
KEYS_ARG = st.one_of(st.none(), st.text(max_size=10), SURROGATES, st.integers(), st.binary(max_size=3),
                     st.just("k" * 5000), st.just(""))
DELAYS = st.one_of(st.none(), st.floats(), st.integers(-10, 10**20), st.booleans(), st.text(max_size=3),
                   st.timedeltas(), st.just(dt.timedelta.max), st.just(dt.timedelta(0)))
ATS = st.one_of(st.none(), st.datetimes(), st.datetimes(timezones=st.just(UTC)), st.text(max_size=3),
                st.just(dt.datetime.max.replace(tzinfo=UTC)), st.just(dt.datetime.min.replace(tzinfo=UTC)))


@SETTINGS
@given(key=KEYS_ARG, headers=HEADERS, delay=DELAYS, at=ATS, entry=st.sampled_from(["push", "push_nowait",
                                                                                     "push_many"]))
async def test_push_arguments_are_refused_clearly_or_taken(adb, key, headers, delay, at, entry):
    q = await ready_queue(adb)
    try:
        sentinel = q.push_nowait(SENTINEL)
        message_id = None
        try:
            if entry == "push":
                message_id = await q.push({"n": 1}, key=key, headers=headers, delay=delay, at=at)
            elif entry == "push_nowait":
                message_id = await q.push_nowait({"n": 1}, key=key, headers=headers, delay=delay, at=at)
            else:
                [message_id] = await q.push_many([{"n": 1}], headers=headers, delay=delay)
                key = at = None
        except bucketq.BucketqError:
            pass
        immediate = message_id is not None and not delay and (at is None or at <= utc_now())
        wanted = {await sentinel} | ({message_id} if immediate else set())
        got = await deliver_ids(q, wanted)
        assert got[await sentinel].payload == SENTINEL
        if message_id in got:
            message = got[message_id]
            assert (message.payload, message.key, message.headers) == ({"n": 1}, key, dict(headers or {}))
    finally:
        await q.close()


# -- options and the Queue constructor -----------------------------------------------------------------------

OPTION_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 70_000), st.integers(-(2**70), 2**70), st.floats(),
    st.floats(min_value=0.01, max_value=100), st.text(max_size=6), st.lists(st.integers(), max_size=2),
    st.sampled_from(["quarantine", "skip", "majority", "json"]),
)


@SETTINGS
@given(name=st.sampled_from(sorted(QueueOptions.__dataclass_fields__) + ["no_such_option"]), value=OPTION_VALUES)
async def test_every_option_is_refused_with_invalid_option_or_works(adb, name, value):
    try:
        q = new_queue(adb, **{name: value})
    except bucketq.InvalidOption:
        return

    async def cycle() -> None:
        sentinel = q.push_nowait(SENTINEL)
        other = q.push_nowait("other")
        await q.flush()
        await sentinel
        await other
        first = await q.reserve(timeout=5)
        second = await q.reserve(timeout=5)
        assert first is not None and second is not None
        assert sorted([repr(first.payload), repr(second.payload)]) == sorted([repr(SENTINEL), repr("other")])
        await first.ack()
        await second.nack()  # the queue's own backoff
        await q.stats()

    try:
        await asyncio.wait_for(cycle(), 30)
    except bucketq.WriteFailed:
        assert name in ("write_concern", "write_timeout")  # e.g. w=5 on a server without five members
    finally:
        await asyncio.wait_for(q.close(), 30)


NAMES = st.one_of(st.text(max_size=12), SURROGATES, st.integers(), st.none(),
                  st.sampled_from(["", "$x", "a\0b", "system.x", "system", ".x", "x.", "a..b", "a" * 101, "a.b",
                                   "x" * 100, "ünï cødé", "q.dead", "q.quarantine", "q.inbox", "q.deadline",
                                   "é" * 120]))
DB_NAMES = st.one_of(st.text(alphabet="abc_-1", min_size=1, max_size=8).map(lambda s: f"bq_bad_{s}"),
                     st.sampled_from(["a b", "a.b", "a/b", "a$b", 'a"b', "a\0b", "a*b", "", "x" * 70, "é" * 32]),
                     st.integers(0, 9))


@FEW
@given(name=NAMES, db=DB_NAMES, codec=st.one_of(st.sampled_from(["json", "msgpack", "yaml", ""]), st.integers()))
async def test_queue_names_and_codecs_are_refused_with_invalid_option_or_work(async_client, name, db, codec):
    try:
        q = bucketq.Queue(async_client, name=name, db=db, codec=codec, bucket_max_wait=0.005,
                          change_streams=False)
    except bucketq.InvalidOption:
        return
    try:
        await q.push(SENTINEL)
        message = await q.reserve(timeout=5)
        assert message is not None and message.payload == SENTINEL
        await message.ack(wait=True)
    finally:
        await q.close()
        await async_client.drop_database(db)


@pytest.mark.parametrize("target", [5, None, "http://example.com", "mongodb://", "mongodb://h:99999999/",
                                    b"mongodb://localhost", object()])
def test_bad_targets_are_refused_with_invalid_option(target):
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Queue(target, name="events")


def test_worker_options_are_validated(make_queue):
    q = make_queue(drain_timeout=0)

    async def handler(message: bucketq.Message) -> None: ...

    for kwargs in ({"concurrency": 0}, {"concurrency": 2000}, {"concurrency": 1.5}, {"batch_size": 0},
                   {"batch_size": "10"}):
        with pytest.raises(bucketq.InvalidOption):
            bucketq.Worker(q, handler, **kwargs)
    for handler_, kwargs in (("tasks:handle", {}), (handler, {"threads": 2}), (lambda m: None, {"threads": 0})):
        with pytest.raises(bucketq.InvalidOption):  # not a function; threads for an async one; no thread at all
            bucketq.Worker(q, handler_, **kwargs)


# -- consuming: timeouts, nack, ack ---------------------------------------------------------------------------

TIMEOUTS = st.one_of(st.floats(allow_nan=False, min_value=-5, max_value=1), st.integers(-5, 1),
                     st.sampled_from([float("-inf"), 0, -0.0, float("nan")]))


@SETTINGS
@given(timeout=TIMEOUTS, entry=st.sampled_from(["reserve", "pop", "consume"]))
async def test_consume_timeouts(adb, timeout, entry):
    """With a message ready any timeout gets it; on an empty queue the call returns within the timeout."""

    q = new_queue(adb)
    try:
        await q.push("ready")

        async def once() -> Any:
            if entry == "reserve":
                return await q.reserve(timeout=timeout)
            if entry == "pop":
                return await q.pop(timeout=timeout)
            async for message in q.consume(idle_timeout=timeout):
                return message
            return None

        if timeout != timeout:  # NaN: refused, not a wait that never ends
            with pytest.raises(bucketq.InvalidOption):
                await asyncio.wait_for(once(), 3)
            return
        first = await asyncio.wait_for(once(), 10)
        if first is not None:
            assert first.payload == "ready"
            if entry != "pop":
                await first.ack()
        empty = await asyncio.wait_for(once(), max(0.0, timeout) + 3)
        assert empty is None
    finally:
        await q.close()


@SETTINGS
@given(delay=st.one_of(st.none(), st.floats(), st.integers(-10, 10**20), st.text(max_size=2),
                       st.timedeltas()),
       error=st.one_of(st.none(), st.text(max_size=10), SURROGATES, st.builds(ValueError, st.text(max_size=5)),
                       st.integers(), st.builds(object)))
async def test_nack_arguments_are_refused_clearly_or_taken(adb, delay, error):
    q = new_queue(adb, max_attempts=3)
    try:
        await q.push("m")
        message = await q.reserve(timeout=5)
        try:
            retry_in = await message.nack(delay=delay, error=error, wait=True)
        except bucketq.BucketqError:
            await message.ack()  # still ours to resolve
            return
        # taken: the message's first try of three, so it comes back after a delay of its own, never lost
        assert isinstance(retry_in, float) and 0 <= retry_in <= 100 * 365 * 86400
        stats = await q.stats()
        assert stats["ready"] + stats["scheduled"] == 1 and stats["dead"] == 0
    finally:
        await q.close()


async def test_resolving_twice_is_already_resolved(make_queue):
    q = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    await q.push_many([1, 2])
    first = await q.reserve(timeout=5)
    second = await q.reserve(timeout=5)
    await first.ack()
    with pytest.raises(bucketq.AlreadyResolved):
        await first.nack()
    await second.nack(delay=0)
    with pytest.raises(bucketq.AlreadyResolved):
        await second.ack()


async def test_a_closed_queue_refuses_with_queue_closed(make_queue):
    q = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    await q.push(0)
    await q.reserve(timeout=5)
    await q.close()
    with pytest.raises(bucketq.QueueClosed):
        await q.push(1)
    with pytest.raises(bucketq.QueueClosed):
        q.push_nowait(1)
    with pytest.raises(bucketq.QueueClosed):
        await q.reserve(timeout=0.1)


# -- dead letters, quarantine, peek ---------------------------------------------------------------------------

@SETTINGS
@given(method=st.sampled_from(["dead_letters", "quarantined", "requeue_dead", "purge_dead", "requeue_quarantined",
                               "purge_quarantined"]),
       older_than=st.none() | st.floats(min_value=-1e6, max_value=1e8) | st.integers(-5, 10**8),
       error_contains=st.none() | st.text(max_size=6) | st.sampled_from([".*", "(", "[a-", "\\", "$where", "ok\ud800"]),
       ids=st.none() | st.lists(st.one_of(st.text(max_size=4), st.builds(ObjectId), st.integers()), max_size=3),
       limit=st.integers(0, 10))
async def test_dead_letter_and_quarantine_filters(adb, method, older_than, error_contains, ids, limit):
    q = new_queue(adb, max_attempts=1)
    try:
        await q.push({"dies": True})
        await (await q.reserve(timeout=5)).nack(error="boom (.*) [", wait=True)
        kwargs: dict[str, Any] = {"older_than": older_than, "error_contains": error_contains}
        if method in ("dead_letters", "quarantined"):
            kwargs["limit"] = limit
        else:
            kwargs["ids"] = ids
        if _unencodable_text(error_contains):
            with pytest.raises(bucketq.InvalidOption, match="error_contains"):
                await getattr(q, method)(**kwargs)
        else:
            result = await getattr(q, method)(**kwargs)
            assert isinstance(result, (list, int))
    finally:
        await q.close()


@FEW
@given(n=st.integers(1, 20))
async def test_peek_returns_at_most_n(adb, n):
    q = new_queue(adb)
    try:
        await q.push_many(range(5))
        assert len(await q.peek(n)) == min(n, 5)
    finally:
        await q.close()


# -- hand-corrupted bucket documents --------------------------------------------------------------------------

WRONG = st.sampled_from([None, "x", "", 1, -1, 0, 2, 1.5, True, [], {}, [None], ["x"], [0, 0], [1, 2, 3], [-1],
                         {"a": 1}, Int64(2**62), b"\xff", "\ud7ff", dt.datetime(2000, 1, 1, tzinfo=UTC)])
BAD_PAYLOADS = st.sampled_from(["{broken", "", "[1,", "\x00", '"fine"', "NaN", "1e99999", b"\xff\xfe", b"\xc1",
                                b'"bytes json"', 5, None, ["x"], {"p": 1}, Binary(b'"ok"', 5), "\ud7ff"])
FIELDS = ["_id", "v", "enc", "created", "n", "p", "done", "c", "lease", "h", "k", "t", "o", "e"]
MUTATIONS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FIELDS), WRONG),
    st.tuples(st.just("set"), st.just("c"), WRONG),  # the one field the claim itself updates
    st.tuples(st.just("drop"), st.sampled_from(FIELDS), st.none()),
    st.tuples(st.just("payload"), st.integers(0, 5), BAD_PAYLOADS),
    st.tuples(st.just("slot"), st.sampled_from(["h", "k", "t", "o", "e", "done"]), st.tuples(st.integers(0, 5),
                                                                                          WRONG)),
    st.tuples(st.just("enc"), st.just("enc"), st.sampled_from(["json", "msgpack", "rot13", "JSON"])),
)
SLOTS = st.lists(st.builds(
    lambda i, h, k, t: (i, h, k, t),
    st.integers(0, 10**6), st.none() | st.just({"trace": "t"}), st.none() | st.text(max_size=3), st.integers(0, 2),
), min_size=1, max_size=5)


def corrupted_bucket(slots: list, mutations: list, codec: str) -> dict:
    now = utc_now() - dt.timedelta(seconds=5)
    encode = (lambda v: orjson.dumps(v).decode()) if codec == "json" else (lambda v: msgpack.packb(v))
    doc = bucket_document(ObjectId(), [Slot(encode({"i": i}), headers=h, key=k, tries=t, origin=f"o:{i}",
                                            enqueued_at=now) for i, h, k, t in slots], codec=codec, created=now,
                          due=now)
    for kind, field, value in mutations:
        if kind == "set" or kind == "enc":
            doc[field] = value
        elif kind == "drop":
            doc.pop(field, None)
        elif kind == "payload" and isinstance(doc.get("p"), list) and doc["p"]:
            doc["p"][field % len(doc["p"])] = value
        elif kind == "slot" and isinstance(doc.get(field), list) and doc[field]:
            index, wrong = value
            doc[field][index % len(doc[field])] = wrong
        elif kind == "slot" and field == "done":
            doc["done"] = [value[0]]
    return doc


def decodable(payloads: Any) -> list[Any]:
    """Every value any slot of ``p`` decodes to, with either codec."""
    out = []
    for stored in payloads if isinstance(payloads, list) else []:
        for load in (orjson.loads, lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False)):
            try:
                out.append(normalize(load(stored)))
            except Exception:
                pass
    return out


@SETTINGS
@given(slots=SLOTS, mutations=st.lists(MUTATIONS, min_size=1, max_size=3),
       codec=st.sampled_from(["json", "msgpack"]), malformed=st.sampled_from(["quarantine", "skip"]))
async def test_corrupted_bucket_goes_to_quarantine_and_no_other_message_is_lost(adb, slots, mutations, codec,
                                                                               malformed):
    doc = corrupted_bucket(slots, mutations, codec)
    q = new_queue(adb, malformed=malformed, max_attempts=3)
    try:
        try:
            await adb[q.name].insert_one(doc)
        except PyMongoError:
            reject()  # not even storable (an array _id, say): nobody can write it, nobody reads it
        good = await q.push(SENTINEL)
        got = await deliver_all(q, adb)
        assert [m.payload for m in got if m.id == good] == [SENTINEL], "the good message was not delivered once"
        others = [m for m in got if m.id != good]
        possible = decodable(doc.get("p"))
        assert all(any(same(normalize(m.payload), p) for p in possible) for m in others), \
            "a corrupted bucket delivered a payload that none of its slots holds"
        quarantined = await q.quarantined()
        whole = [e for e in quarantined if e["kind"] == "bucket"]
        assert len(whole) <= 1 and all(e["reason"] for e in quarantined)
        if whole:
            assert others == [], "a bucket was both quarantined and delivered"
    finally:
        await q.close()


# -- the bugs, one minimal repro each (xfail until fixed) -----------------------------------------------------

def _raw_bucket(**fields: Any) -> dict:
    past = utc_now() - dt.timedelta(seconds=5)
    doc = {"_id": ObjectId(), "v": 1, "enc": "json", "created": past, "due": past, "n": 1, "p": ['"bad"'],
           "done": [], "c": 0, "lease": None}
    doc.update(fields)
    return doc


async def test_bug_1_bucket_with_non_numeric_claim_count_is_quarantined_not_blocking(make_queue, sync_db):
    sync_db.events.insert_one(_raw_bucket(c="x"))
    q = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    await q.push("good")
    message = await q.reserve(timeout=2)  # today: OperationFailure "Cannot apply $inc to a value of non-numeric type"
    assert message is not None and message.payload == "good"
    await message.ack(wait=True)
    assert [e["kind"] for e in await q.quarantined()] == ["bucket"]


async def test_bug_2_unencodable_key_is_an_encode_error(make_queue):
    q = make_queue(drain_timeout=0)
    with pytest.raises(bucketq.EncodeError):
        await q.push(1, key="\ud800")


@pytest.mark.parametrize("delay", [float("inf"), 1e20, dt.timedelta.max])
async def test_bug_3_push_delay_out_of_range_is_invalid_option(make_queue, delay):
    q = make_queue(drain_timeout=0)
    with pytest.raises(bucketq.InvalidOption):
        await q.push(1, delay=delay)


@pytest.mark.parametrize("delay", [float("inf"), 1e300, "1"])
async def test_bug_3_nack_delay_out_of_range_is_invalid_option(make_queue, delay):
    q = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    await q.push(1)
    message = await q.reserve(timeout=5)
    with pytest.raises(bucketq.InvalidOption):
        await message.nack(delay=delay)


@pytest.mark.parametrize("entry", ["reserve", "consume"])
async def test_bug_4_nan_timeout_is_invalid_option_not_a_hang(make_queue, entry):
    q = make_queue(change_streams=False, drain_timeout=0)

    async def call() -> Any:
        if entry == "reserve":
            return await q.reserve(timeout=float("nan"))
        return [m async for m in q.consume(idle_timeout=float("nan"))]

    with pytest.raises(bucketq.InvalidOption):
        await asyncio.wait_for(call(), 3)


@pytest.mark.parametrize("options", [{"quarantine_retention": 1e300}, {"inbox_retention": 1e20},
                                     {"retry_base": 1e300, "retry_max": 1e300}])
async def test_bug_5_out_of_range_times_are_refused_or_work(make_queue, options):
    try:
        q = make_queue(bucket_max_wait=0.005, **options, drain_timeout=0)
    except bucketq.InvalidOption:
        return
    await q.push(1)
    message = await q.reserve(timeout=5)  # retention 1e300: OverflowError in the housekeeping purge
    retry_in = await message.nack(wait=True)  # backoff 1e300: OverflowError, and the message stays unresolved
    assert retry_in is not None and 0 <= retry_in <= 100 * 365 * 86400  # taken: a delay within a century
    assert await q.purge_expired() == {"quarantined": 0, "inbox": 0, "tombstones": 0}
    stats = await q.stats()
    assert stats["ready"] + stats["scheduled"] == 1 and stats["in_flight"] == 0


@pytest.mark.parametrize("w", [-1, True, "", 0])
def test_bug_5_bad_write_concern_is_invalid_option(mongo_uri, w):
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Queue(mongo_uri, name="events", write_concern=w)


@pytest.mark.parametrize("kwargs", [{"db": "a b"}, {"db": "a.b"}, {"db": 5}, {"name": "ev\ud800"}])
def test_bug_6_bad_names_are_invalid_option(mongo_uri, kwargs):
    with pytest.raises(bucketq.InvalidOption):
        bucketq.Queue(mongo_uri, **{"name": "events", **kwargs})


@pytest.mark.parametrize("call", [
    lambda q: q.dead_letters(older_than=float("nan")), lambda q: q.purge_dead(older_than=float("inf")),
    lambda q: q.quarantined(error_contains="\ud800"), lambda q: q.requeue_dead(ids="abc"),
    lambda q: q.dead_letters(older_than="5"), lambda q: q.purge_quarantined(older_than=-1),
    lambda q: q.requeue_quarantined(older_than=1e300), lambda q: q.dead_letters(error_contains=b"timeout"),
    lambda q: q.purge_dead(error_contains=5), lambda q: q.requeue_quarantined(ids=ObjectId()),
])
async def test_bug_7_bad_filters_are_invalid_option(make_queue, call):
    q = make_queue(drain_timeout=0)
    with pytest.raises(bucketq.InvalidOption):
        await call(q)


async def test_bug_7_good_filters_still_select(make_queue):
    """The checks refuse only bad values: tuples of ids, ages as timedelta or 0, and text filters still select."""
    consumer = make_queue(max_attempts=1, bucket_max_wait=0.005, drain_timeout=0)
    await consumer.push_many([1, 2])
    for error in ("TimeoutError: slow", "KeyError: 'ü'"):
        message = await consumer.reserve(timeout=5)
        await message.nack(error=error)
    await consumer.close()  # its dead letters are written
    q = make_queue(drain_timeout=0)
    ids = [d["_id"] for d in await q.dead_letters()]
    assert len(ids) == 2
    assert [d["error"] for d in await q.dead_letters(error_contains="KEYERROR: 'Ü'")] == ["KeyError: 'ü'"]
    assert len(await q.dead_letters(older_than=0, error_contains="")) == 2
    assert await q.dead_letters(older_than=dt.timedelta(days=1)) == []
    assert await q.purge_dead(ids=(ids[0],)) == 1
    assert [d["_id"] for d in await q.dead_letters()] == ids[1:]


@pytest.mark.parametrize("payload", [dt.datetime(2024, 1, 2, tzinfo=UTC), uuid.UUID(int=1), Point(1), Color.RED])
async def test_bug_8_json_codec_refuses_what_it_cannot_give_back(make_queue, payload):
    q = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    try:
        await q.push(payload)
    except bucketq.EncodeError:
        return
    message = await q.reserve(timeout=5)
    assert message.payload == payload, f"pushed {payload!r}, got {message.payload!r}"


async def test_bug_9_peek_zero_is_empty(make_queue):
    q = make_queue(drain_timeout=0)
    await q.push_many([1, 2])
    assert await q.peek(0) == []


async def test_bug_11_msgpack_refuses_payloads_it_cannot_decode(make_queue):
    q = make_queue(codec="msgpack", bucket_max_wait=0.005, drain_timeout=0)
    await q.__aenter__()  # set up, so that the two pushes below share one bucket
    sentinel = q.push_nowait("good")
    try:
        await q.push({(1, 2): 3})
    except bucketq.EncodeError:
        pass
    await sentinel
    message = await q.reserve(timeout=5)
    assert message is not None and message.payload == "good"  # today: both are in quarantine


@pytest.mark.parametrize("entry", ["push", "reserve"])
async def test_bug_12_closed_unused_queue_raises_queue_closed(make_queue, entry):
    q = make_queue(drain_timeout=0)
    await q.close()
    with pytest.raises(bucketq.QueueClosed):
        await (q.push(1) if entry == "push" else q.reserve(timeout=0.1))


@pytest.mark.parametrize("payload", [collections.OrderedDict(a=float("nan")), [ListSubclass([float("inf")])],
                                     {"a": collections.defaultdict(int, b=float("-inf"))}])
def test_bug_14_json_refuses_non_finite_floats_inside_subclasses(payload):
    with pytest.raises(ValueError):
        bucketq.JsonCodec().dump(payload)  # push() turns this ValueError into EncodeError
