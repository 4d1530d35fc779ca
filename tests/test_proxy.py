"""The fault-injecting proxy (tests/proxy.py) over a real connection: a lost reply leaves the write applied
and the client with a network error, a lost request leaves it unapplied, a delayed command reaches the
server late, a lost command's retry can be held back, and with no rule armed the proxy is transparent."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import bson
import pytest
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, DuplicateKeyError, NetworkTimeout

from tests.proxy import OP_MSG, Framer, TcpProxy, command_name, parse_command

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def proxy(mongo_uri: str) -> Iterator[TcpProxy]:
    target = urlsplit(mongo_uri)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 27017) as p:
        yield p


@pytest.fixture
def via(proxy: TcpProxy, db_name: str) -> Iterator:
    """The test's database through the proxy (no automatic retries: the test sees each network error)."""
    client: MongoClient = MongoClient(proxy.uri, retryWrites=False, retryReads=False,
                                      serverSelectionTimeoutMS=5000)
    yield client[db_name]
    client.close()


def test_a_lost_insert_reply_raises_though_the_document_is_stored(proxy, via, sync_db):
    rule = proxy.lose_reply("insert", collection="c")
    with pytest.raises(ConnectionFailure):
        via.c.insert_one({"_id": 1})
    assert sync_db.c.find_one({"_id": 1}) == {"_id": 1}
    assert rule.hits == 1
    via.c.insert_one({"_id": 2})  # the rule is used up
    assert sync_db.c.count_documents({}) == 2


def test_a_lost_update_reply_raises_though_the_update_is_applied(proxy, via, sync_db):
    sync_db.c.insert_one({"_id": 1, "lease": {"token": "t"}, "x": 0})
    proxy.lose_reply("update", "delete", where=lambda cmd: "lease.token" in cmd.body["updates"][0]["q"])
    via.c.update_one({"_id": 1}, {"$set": {"y": 1}})  # not fenced: not matched
    with pytest.raises(ConnectionFailure):
        via.c.update_one({"_id": 1, "lease.token": "t"}, {"$inc": {"x": 1}})
    assert sync_db.c.find_one({"_id": 1})["x"] == 1


def test_a_lost_request_is_not_applied(proxy, via, sync_db):
    proxy.lose_request("delete")
    sync_db.c.insert_one({"_id": 1})
    with pytest.raises(ConnectionFailure):
        via.c.delete_one({"_id": 1})
    assert sync_db.c.count_documents({}) == 1


def test_a_delayed_command_reaches_the_server_late_even_after_the_client_gave_up(proxy, db_name, sync_db):
    impatient: MongoClient = MongoClient(proxy.uri, retryWrites=False, socketTimeoutMS=300,
                                         serverSelectionTimeoutMS=5000)
    try:
        proxy.delay("insert", seconds=3.0, collection="c")  # ten times the client's 300 ms: room for a slow box
        started = time.monotonic()
        with pytest.raises(NetworkTimeout):
            impatient[db_name].c.insert_one({"_id": 1})
        assert time.monotonic() - started < 2.5, "the client waited for the delayed insert"
        assert sync_db.c.count_documents({}) == 0  # held back in the proxy
        while sync_db.c.count_documents({}) == 0:
            assert time.monotonic() - started < 20, "the delayed insert never arrived"
            time.sleep(0.05)
        assert time.monotonic() - started >= 3.0
    finally:
        impatient.close()


def test_the_retry_of_a_lost_command_is_held_back_and_only_it(proxy, via, sync_db):
    rule = proxy.lose_reply("insert", retry_delay_s=3.0)  # long enough to tell from a slow box's round trip
    with pytest.raises(ConnectionFailure):
        via.c.insert_one({"_id": 1})
    started = time.monotonic()
    via.c.insert_one({"_id": 2})  # another insert: not held back
    assert time.monotonic() - started < 2.5, "another insert was held back with the retry"
    with pytest.raises(DuplicateKeyError):
        via.c.insert_one({"_id": 1})  # the retry: late, and the first attempt had been applied
    assert time.monotonic() - started >= 3.0
    assert (rule.hits, rule.retries_delayed) == (1, 1)


def test_with_no_rule_armed_or_none_matching_traffic_is_unchanged(proxy, via, sync_db):
    proxy.lose_reply("insert", collection="elsewhere")
    proxy.lose_reply("update", where=lambda cmd: False)
    big = "x" * 300_000  # spans many chunks, each way
    via.c.insert_many([{"_id": i, "p": big if i % 7 == 0 else i} for i in range(50)])
    via.c.update_many({}, {"$set": {"u": 1}})
    assert sorted(d["_id"] for d in via.c.find({"u": 1}, {"_id": 1})) == list(range(50))
    assert via.c.find_one({"_id": 7})["p"] == big
    proxy.disarm()
    via.c.delete_many({"_id": {"$lt": 10}})
    assert sync_db.c.count_documents({}) == 40
    assert proxy.cuts == 0


# -- the framing, without a server ----------------------------------------------------------------------

def _op_msg(request_id: int, body: dict, sequences: dict[str, list[dict]] | None = None) -> bytes:
    sections = b"\x00" + bson.encode(body)
    for name, docs in (sequences or {}).items():
        payload = name.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        sections += b"\x01" + (len(payload) + 4).to_bytes(4, "little") + payload
    rest = (0).to_bytes(4, "little") + sections
    return (16 + len(rest)).to_bytes(4, "little") + request_id.to_bytes(4, "little") + bytes(4) \
        + OP_MSG.to_bytes(4, "little") + rest


def test_commands_are_parsed_with_their_document_sequences_and_fingerprinted_by_target():
    message = _op_msg(7, {"insert": "events", "ordered": False, "$db": "d"}, {"documents": [{"_id": 1}, {"_id": 2}]})
    assert command_name(message) == "insert"
    command = parse_command(message)
    assert (command.name, command.collection, command.request_id) == ("insert", "events", 7)
    assert command.body["documents"] == [{"_id": 1}, {"_id": 2}]
    again = parse_command(_op_msg(9, {"insert": "events", "$db": "d", "lsid": 1},
                                  {"documents": [{"_id": 1}, {"_id": 2}]}))
    other = parse_command(_op_msg(9, {"insert": "events", "$db": "d"}, {"documents": [{"_id": 3}]}))
    assert command.fingerprint == again.fingerprint != other.fingerprint


def test_the_framer_returns_the_stream_unchanged_and_whole_messages_when_inspecting():
    rng = random.Random(5)
    messages = [_op_msg(i, {"ping": 1, "pad": "y" * rng.randint(0, 3000)}) for i in range(200)]
    stream = b"".join(messages)
    for _ in range(20):
        framer = Framer()
        out: list[tuple[bool, bytes]] = []
        pos = 0
        while pos < len(stream):
            size = rng.choice([1, 3, 7, 16, 100, 5000])
            out += framer.feed(stream[pos:pos + size], inspect=rng.random() < 0.5)
            pos += size
        assert b"".join(data for _, data in out) == stream
        whole = [data for is_whole, data in out if is_whole]
        assert whole and all(data in messages for data in whole)
