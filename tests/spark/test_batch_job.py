"""The Spark batch cycle on local[2] against the test server: claim -> read -> process -> write -> commit,
release on failure, no duplicates after a crash between write and commit, quarantine of a poisoned bucket and
of single payloads that do not parse with the job's schema."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import defaultdict

import pytest
from bson import ObjectId

from bucketq import InvalidOption
from bucketq.core import claims
from bucketq.core.backoff import Backoff

pytestmark = pytest.mark.spark

SCHEMA = "account STRING, amount DOUBLE, seq LONG, ts DOUBLE"
NO_WAIT = Backoff(base=0.0, maximum=0.0, jitter=0.0)


def _events(start: int, n: int, poison_at: int | None = None) -> list[dict]:
    return [{"account": "poison" if i == poison_at else f"acct-{i % 7}", "amount": i / 4, "seq": i, "ts": 1.7e9 + i}
            for i in range(start, start + n)]


async def _push(make_queue, events: list[dict], size: int = 50) -> None:
    q = make_queue(bucket_max_size=size, bucket_max_wait=0.02)
    await q.push_many(events)
    await q.close()


def _rows(df):
    from pyspark.sql import functions as F

    return df.select("bucket_id", "slot", "message_id", "tries", F.col("payload.account").alias("account"),
                     F.col("payload.amount").alias("amount"), F.col("payload.seq").alias("seq"))


def _job(spark, mongo_uri, db_name, sink, process=_rows, **kw):
    from bucketq_spark.job import BatchJob

    kw.setdefault("backoff", NO_WAIT)
    return BatchJob(spark, mongo_uri, db_name, "events", payload_schema=SCHEMA, process=process, sink=sink, **kw)


def _assert_exactly_once(df, expected_seqs) -> None:
    rows = df.collect()
    assert len(rows) == len({r.message_id for r in rows}) == len(expected_seqs)
    assert sorted(r.seq for r in rows) == sorted(expected_seqs)


async def test_example_job_full_cycle(spark, make_queue, mongo_uri, db_name, sync_db, tmp_path) -> None:
    from jobs.account_totals import run_example_job

    events = _events(0, 600)
    await _push(make_queue, events)
    seen = []

    result = run_example_job(mongo_uri, db_name, "events", tmp_path / "totals", spark=spark, max_buckets=8,
                             progress=seen.append)

    assert (result["batches"], result["buckets"], result["rows"], result["committed"]) == (2, 12, 600, 12)
    assert result["errors"] == [] and result["quarantined"] == 0
    assert set(result["seconds"]) == {"session", "claim", "read", "process", "write", "commit", "rollup", "total"}
    expected = defaultdict(lambda: [0, 0.0])
    for e in events:
        expected[e["account"]][0] += 1
        expected[e["account"]][1] += e["amount"]
    assert [(a["account"], a["count"]) for a in result["accounts"]] == [(k, v[0]) for k, v in sorted(expected.items())]
    assert all(a["amount"] == pytest.approx(expected[a["account"]][1]) for a in result["accounts"])
    assert sync_db.events.count_documents(claims.LIVE) == 0
    assert len(list((tmp_path / "totals").glob("bucket_id=*"))) == 12
    done_steps = {(e["batch"], e["step"]) for e in seen if e["state"] == "done"}
    assert {(1, s) for s in ("claim", "read", "process", "write", "commit")} <= done_steps


async def test_mongo_sink_rewrite_keeps_one_copy(spark, make_queue, mongo_uri, db_name, sync_db) -> None:
    from bucketq_spark.sinks import MongoSink

    await _push(make_queue, _events(0, 200))
    sink = MongoSink(mongo_uri, db_name, "out")
    with _job(spark, mongo_uri, db_name, sink) as job:
        batch = job.claim()
        messages, n = job.read(batch)
        out, _ = job.process(messages)
        job.write(batch, out)
        job.write(batch, out)  # as a re-run after a crash would
        assert job.commit(batch) == 4

    assert n == 200 and sync_db.out.count_documents({}) == 200
    doc = sync_db.out.find_one({"seq": 7})
    assert doc["_id"] == doc["message_id"] == f"{doc['bucket_id']}:{doc['slot']}" and doc["tries"] == 0
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_failure_in_process_releases_then_retry_succeeds(spark, make_queue, mongo_uri, db_name, sync_db,
                                                               tmp_path) -> None:
    from bucketq_spark.sinks import ParquetSink

    await _push(make_queue, _events(0, 200))
    calls = []

    def flaky(df):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient trouble")
        return _rows(df)

    sink = ParquetSink(str(tmp_path / "rows"))
    with _job(spark, mongo_uri, db_name, sink, process=flaky) as job:
        failed = job.run_once()
        assert failed.error == "RuntimeError: transient trouble" and failed.committed == 0
        assert len(failed.released) == 4 and failed.quarantined == []
        assert all(d["lease"] is None and d["c"] == 1 for d in sync_db.events.find())

        retried = job.run()
    assert [(r.error, r.buckets, r.rows, r.committed) for r in retried] == [(None, 4, 200, 4)]
    df = sink.read(spark)
    _assert_exactly_once(df, range(200))
    assert {r.tries for r in df.select("tries").distinct().collect()} == {1}  # one failed attempt before
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_crash_between_write_and_commit_leaves_no_duplicates(spark, make_queue, mongo_uri, db_name, sync_db,
                                                                  tmp_path) -> None:
    from bucketq_spark.sinks import ParquetSink

    await _push(make_queue, _events(0, 300))  # 6 buckets
    sink = ParquetSink(str(tmp_path / "rows"))
    with _job(spark, mongo_uri, db_name, sink, max_buckets=4, lease=1.0) as crashed:
        batch = crashed.claim()
        messages, _ = crashed.read(batch)
        out, _ = crashed.process(messages)
        crashed.write(batch, out)  # ... and the job dies before its commit
        crashed_ids = {str(i) for i in batch.ids}
    assert sink.read(spark).count() == 200
    await _push(make_queue, _events(300, 100))  # 2 more buckets: the re-run mixes old and new ones
    time.sleep(1.3)  # the lease runs out

    with _job(spark, mongo_uri, db_name, sink, max_buckets=8) as rerun:
        results = rerun.run()
    assert [(r.error, r.buckets, r.rows) for r in results] == [(None, 8, 400)]
    assert results[0].token != batch.token
    df = sink.read(spark)
    _assert_exactly_once(df, range(400))
    retried = {r.bucket_id for r in df.where("tries = 1").select("bucket_id").distinct().collect()}
    assert retried == crashed_ids
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_poisoned_bucket_ends_in_quarantine(spark, make_queue, mongo_uri, db_name, sync_db, tmp_path) -> None:
    from pyspark.sql import functions as F

    from bucketq_spark.sinks import ParquetSink

    await _push(make_queue, _events(0, 200, poison_at=123))  # 4 buckets, the third holds the poison

    def strict(df):
        rows = _rows(df)
        # fails inside Spark's execution, as a bad record would
        return rows.withColumn("account", F.when(F.col("account") == "poison", F.raise_error(F.lit("poisoned")))
                               .otherwise(F.col("account")))

    sink = ParquetSink(str(tmp_path / "rows"))
    with _job(spark, mongo_uri, db_name, sink, process=strict, max_attempts=2) as job:
        results = job.run()

    # attempt 1: all four together, failed; attempt 2 (the last): each bucket alone
    assert [len(r.released) for r in results] == [4, 0, 0, 0, 0]
    assert sum(r.committed for r in results) == 3 and sum(len(r.quarantined) for r in results) == 1
    entries = list(sync_db["events.quarantine"].find())
    assert len(entries) == 1 and "poisoned" in entries[0]["reason"] and "failed 2 attempt(s)" in entries[0]["reason"]
    assert entries[0]["doc"]["p"][23].find('"seq":123') >= 0
    _assert_exactly_once(sink.read(spark), [i for i in range(200) if not 100 <= i < 150])
    assert sync_db.events.count_documents(claims.LIVE) == 0


def test_readbench(spark, mongo_uri, db_name, sync_db) -> None:
    from bench.spark_read import time_read_paths

    out = time_read_paths(spark, mongo_uri, db_name, 2000, bucket_size=500, repeats=1)
    assert out["bucketq"]["docs"] == 4 and out["naive"]["docs"] == 2000
    assert out["bucketq"]["partitions"] == out["naive"]["partitions"] == spark.sparkContext.defaultParallelism
    assert out["bucketq"]["rows"] == out["naive"]["rows"] == 2000
    assert out["bucketq"]["rows_per_s"] > 0 and out["naive"]["rows_per_s"] > 0 and out["speedup"] > 0
    assert out["bucketq"]["spark_cpu_s"] > 0 and out["median_speedup"] > 0
    assert "readbench" not in sync_db.list_collection_names()


def test_readbench_fails_when_the_layouts_decode_different_rows(spark, mongo_uri, db_name, sync_db,
                                                                monkeypatch) -> None:
    """The bench checks that both layouts decode the same rows: a naive payload that differs fails it."""
    import bench.spark_read as readbench

    fill_flat = readbench._fill_flat

    def one_payload_off(uri, db, collection, payloads):
        fill_flat(uri, db, collection, [*payloads[:-1], {**payloads[-1], "pad": "changed"}])

    monkeypatch.setattr(readbench, "_fill_flat", one_payload_off)
    with pytest.raises(AssertionError, match="decoded rows the other layout lacks"):
        readbench.time_read_paths(spark, mongo_uri, db_name, 300, bucket_size=100, repeats=1)


def test_partitions_follow_documents_and_bytes() -> None:
    from bucketq_spark.reader import PAGINATE_INTO_PARTITIONS, SINGLE_PARTITION, ReadOptions

    read = ReadOptions()
    assert read.partition_count(20, 2) == 2 and read.partition_count(1, 2) == 1 and read.partition_count(None, 2) == 2
    assert read.partition_count(100, 2, 100 << 20) == 4  # one per 32 MiB: a test-server reply stays under 48 MB
    assert read.partition_count(3, 2, 1 << 30) == 3  # never more partitions than documents
    assert read.partition_count(2, 2) == 1 and read.partition_count(4, 8) == 3  # fewer: see the loop below
    assert ReadOptions(partitions=1).partition_count(100, 2, 1 << 30) == 1  # an explicit count wins
    assert read.reader_options(1, 2)["partitioner"] == SINGLE_PARTITION
    assert read.reader_options(100, 2, 100 << 20) == {
        "partitioner": PAGINATE_INTO_PARTITIONS, "partitioner.options.max.number.of.partitions": "4"}
    for docs in range(2, 10):  # asked for as many, the connector's paginating partitioner makes one per document
        options = read.reader_options(docs, 8)  # and warns: "Inefficient partitioning" on every local run
        assert options["partitioner"] == SINGLE_PARTITION or \
            int(options["partitioner.options.max.number.of.partitions"]) < docs, options
    for bad in ({"partitions": 0}, {"partition_bytes": 0}):
        with pytest.raises(InvalidOption, match=next(iter(bad))):
            ReadOptions(**bad)


async def test_a_batch_larger_than_a_server_reply_is_read_whole(spark, make_queue, mongo_uri, db_name,
                                                                 sync_db) -> None:
    """~105 MB of buckets. The test server answers a partition's aggregate in one reply, and the Java driver
    takes at most 48 MB in one: two partitions (the default parallelism) fail the read ("reply message length
    ... is greater than the maximum"), so the job sizes them by the batch's bytes (four here)."""
    from pyspark.sql import functions as F

    from bucketq_spark.reader import ReadOptions

    pad = "x" * 1000
    await _push(make_queue, [{"account": "a", "amount": 1.0, "seq": i, "ts": float(i), "pad": pad}
                             for i in range(100_000)], size=1000)
    with _job(spark, mongo_uri, db_name, sink=None, max_buckets=100) as job:
        batch = job.claim()
        assert batch is not None and len(batch) == 100
        size = sum(len(p) for doc in batch.buckets for p in doc["p"])
        assert size > 100 << 20
        assert ReadOptions().partition_count(len(batch), spark.sparkContext.defaultParallelism, size) == 4
        seqs = sum(json.loads(p)["seq"] for doc in batch.buckets for p in doc["p"])
        messages, rows = job.read(batch)
        try:
            assert rows == batch.messages > 90_000 and messages.where("malformed").count() == 0
            assert messages.select(F.sum("payload.seq")).first()[0] == seqs
        finally:
            messages.unpersist()
        assert job.commit(batch) == 100


async def test_malformed_payload_goes_to_quarantine_raw_and_the_rest_to_the_sink(spark, make_queue, mongo_uri,
                                                                                 db_name, sync_db, tmp_path) -> None:
    from bucketq_spark.sinks import ParquetSink

    events = _events(0, 200)
    events[77]["amount"] = "12,50 EUR"  # valid JSON, but not a DOUBLE: from_json alone would give amount = null
    await _push(make_queue, events)  # 4 buckets; the second holds seq 77 at slot 27
    stored = {d["_id"]: d["p"] for d in sync_db.events.find()}
    sink = ParquetSink(str(tmp_path / "rows"))

    with _job(spark, mongo_uri, db_name, sink) as job:
        results = job.run()

    entries = list(sync_db["events.quarantine"].find())
    assert len(entries) == 1, "the malformed payload vanished"
    entry = entries[0]
    bucket_id, slot = entry["origin"]["bucket"], entry["origin"]["slot"]
    assert (entry["_id"], entry["kind"], entry["enc"], slot) == (f"{bucket_id}:{slot}", "message", "json", 27)
    assert entry["p"] == stored[bucket_id][slot] and '"12,50 EUR"' in entry["p"]  # the raw text, as stored
    assert "payload_schema" in entry["reason"] and "amount:double" in entry["reason"]
    assert entry["pid"] == os.getpid() and entry["host"] and isinstance(entry["at"], dt.datetime)
    _assert_exactly_once(sink.read(spark), [i for i in range(200) if i != 77])
    assert [(r.error, r.buckets, r.rows, r.malformed, r.committed) for r in results] == [(None, 4, 200, 1, 4)]
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_malformed_fail_fails_the_batch_until_its_bucket_is_quarantined_whole(spark, make_queue, mongo_uri,
                                                                                    db_name, sync_db,
                                                                                    tmp_path) -> None:
    from bucketq_spark.sinks import ParquetSink

    events = _events(0, 50)
    events[3]["seq"] = 3.5  # not a LONG
    await _push(make_queue, events)
    sink = ParquetSink(str(tmp_path / "rows"))

    with _job(spark, mongo_uri, db_name, sink, malformed="fail", max_attempts=2) as job:
        results = job.run()

    assert [(len(r.released), len(r.quarantined), r.committed) for r in results] == [(1, 0, 0), (0, 1, 0)]
    assert all(r.error.startswith("MalformedPayloads: 1 of 50 payload(s) do not parse with payload_schema")
               for r in results)
    (entry,) = sync_db["events.quarantine"].find()
    assert entry["kind"] == "bucket" and '"seq":3.5' in entry["doc"]["p"][3] and "MalformedPayloads" in entry["reason"]
    assert not (tmp_path / "rows").exists() and sync_db.events.count_documents(claims.LIVE) == 0


def test_reader_flags_exactly_the_payloads_that_do_not_parse(spark, mongo_uri, db_name, sync_db) -> None:
    from bucketq_spark.reader import read_messages

    verdicts = {  # payload -> malformed?
        '{"account":"a","amount":1.5,"seq":1,"ts":2.0}': False,
        "{}": False,  # missing fields read as null
        '{"account":"a","extra":[1]}': False,  # extra fields are ignored
        '{"account":"a","amount":"x"}': True, '{"seq":1.5}': True, '{"amount":true}': True,
        "{bad": True, "42": True, '"text"': True, "null": True, '[{"account":"b"}]': True, "": True,
    }
    payloads = list(verdicts)
    now = dt.datetime.now(dt.timezone.utc)
    sync_db.events.insert_many([
        {"_id": ObjectId(), "v": 1, "enc": "json", "created": now, "due": now, "n": len(payloads) + 1,
         "p": [*payloads, "{also bad}"], "done": [len(payloads)], "c": 1, "lease": None},
        {"_id": ObjectId(), **claims.finish(now, "t", 0)},  # a tombstone: not read
    ])

    df = read_messages(spark, mongo_uri, db_name, "events", SCHEMA)
    rows = sorted(df.select("slot", "malformed", "payload").collect())

    assert [(payloads[r.slot], r.malformed) for r in rows] == list(verdicts.items())  # the done slot skipped
    assert df.schema["payload"].dataType.fieldNames() == ["account", "amount", "seq", "ts"]
    assert rows[0].payload.asDict() == {"account": "a", "amount": 1.5, "seq": 1, "ts": 2.0}


@pytest.mark.parametrize("codec", ["json", "bson"])
async def test_reader_columns_are_what_the_asyncio_consumer_hands_out(spark, make_queue, mongo_uri, db_name,
                                                                       codec) -> None:
    """Each message's id, tries, enqueued time, key and headers as Spark reads them from the buckets the asyncio
    consumer holds, and as its messages give them: first deliveries, and retries (their bucket has each message's
    origin id, tries and enqueued time: o, t and e)."""
    from pyspark.sql import functions as F

    from bucketq import Outgoing
    from bucketq_spark.reader import read_messages

    events = _events(0, 20)
    # drain_timeout=0: the messages stay served to the end, and the close at teardown need not wait 10 s for them
    q = make_queue(bucket_max_size=8, bucket_max_wait=0.02, codec=codec, drain_timeout=0)
    await q.push_many([Outgoing(e, key=f"k{e['seq']}", headers={"n": e["seq"], "who": "test"}) if e["seq"] % 3 else e
                       for e in events])
    for message in await q.reserve_many(5, timeout=5):
        await message.nack(0, wait=True)  # into a retry bucket
    handed_out = {}
    while len(handed_out) < len(events):
        batch = await q.reserve_many(len(events), timeout=5)
        assert batch, f"{len(handed_out)} of {len(events)} messages handed out, then none within 5 s"
        for m in batch:
            handed_out[m.id] = (m.tries, round(m.enqueued_at.timestamp() * 1000), m.key, m.headers, m.payload["seq"])
    assert sorted(tries for tries, *_ in handed_out.values()) == [0] * 15 + [1] * 5

    rows = read_messages(spark, mongo_uri, db_name, "events", SCHEMA, codec=codec).select(
        "message_id", "tries", F.unix_millis("enqueued_at").alias("ms"), "key", "headers", "payload.seq",
    ).collect()
    assert {r.message_id: (r.tries, r.ms, r.key, json.loads(r.headers) if r.headers else {}, r.seq)
            for r in rows} == handed_out


def test_reader_decodes_each_payload_once_even_under_a_filter_on_malformed(spark, mongo_uri, db_name) -> None:
    from pyspark.sql import functions as F

    from bucketq_spark.reader import read_messages

    messages = read_messages(spark, mongo_uri, db_name, "events", SCHEMA)
    for query in (messages, messages.where("NOT malformed").select(F.col("payload.amount") * 2, "payload.account")):
        plan = query._jdf.queryExecution().optimizedPlan().toString()
        assert plan.count("from_json(") == 1, plan


@pytest.mark.parametrize("bad", [{"payload_schema": "ARRAY<STRING>"}, {"payload_schema": "account STRNG"},
                                 {"json_options": {"MODE": "FAILFAST"}}, {"malformed": "skip"}])
def test_batch_job_rejects_options_that_would_hide_malformed_payloads(spark, mongo_uri, db_name, tmp_path,
                                                                      bad) -> None:
    from bucketq_spark.job import BatchJob
    from bucketq_spark.sinks import ParquetSink

    kw = {"payload_schema": SCHEMA, "process": _rows, "sink": ParquetSink(str(tmp_path)), **bad}
    with pytest.raises(InvalidOption):
        BatchJob(spark, mongo_uri, db_name, "events", **kw)


def test_bson_reader_maps_documents_and_its_json_path_flags_exactly_the_payloads_that_do_not_fit(
        spark, mongo_uri, db_name, sync_db) -> None:
    """``bson`` buckets: the connector maps payload fields to columns, or fails the read on a value it cannot
    convert; read as JSON text instead, each payload that does not fit is flagged alone. Buckets of another
    codec are left to their own read, and the two reads union."""
    from bucketq_spark.job import CONNECTOR_DATA_ERROR
    from bucketq_spark.reader import read_messages

    good = {"account": "a", "amount": 1.5, "seq": 1, "ts": 2.0}
    now = dt.datetime.now(dt.timezone.utc)

    def bucket(payloads, enc="bson", done=()):
        return {"_id": ObjectId(), "v": 1, "enc": enc, "created": now, "due": now, "n": len(payloads),
                "p": payloads, "done": list(done), "c": 1, "lease": None}

    clean = bucket([good, {"account": "b", "amount": 2, "seq": 2}, {"seq": 99}], done=[2])  # an int32 amount
    sync_db.events.insert_many([clean, bucket(['{"seq": 3}'], enc="json")])
    df = read_messages(spark, mongo_uri, db_name, "events", SCHEMA, codec="bson")
    rows = sorted(df.collect())
    assert [(r.slot, r.payload.asDict(), r.malformed) for r in rows] == [
        (0, good, False), (1, {"account": "b", "amount": 2.0, "seq": 2, "ts": None}, False)]
    assert df.schema == read_messages(spark, mongo_uri, db_name, "events", SCHEMA).schema
    both = read_messages(spark, mongo_uri, db_name, "events", SCHEMA).unionByName(df)
    assert sorted(r.payload.seq for r in both.collect()) == [1, 2, 3]

    verdicts = [  # (payload, malformed?) of one bucket
        (good, False), ({}, False), ({"account": "a", "extra": [1]}, False),
        ({"account": "a", "amount": "x"}, True), ({"amount": True}, True), ({"seq": [1]}, True), ("text", True),
        ({"account": "b", "amount": 2, "seq": 2}, False),
    ]  # (a null entry would hide the bucket: Spark's IsNotNull(p), pushed down, matches no array holding a null)
    flagged = bucket([p for p, _ in verdicts])
    sync_db.events.insert_one(flagged)
    with pytest.raises(Exception, match=CONNECTOR_DATA_ERROR):
        read_messages(spark, mongo_uri, db_name, "events", SCHEMA, codec="bson").collect()
    as_json = read_messages(spark, mongo_uri, db_name, "events", SCHEMA, codec="bson", as_json=True)
    rows = {(r.bucket_id, r.slot): r for r in as_json.collect()}
    assert [rows[str(flagged["_id"]), i].malformed for i in range(len(verdicts))] == [m for _, m in verdicts]
    assert rows[str(flagged["_id"]), 0].payload.asDict() == good == rows[str(clean["_id"]), 0].payload.asDict()
    assert len(rows) == len(verdicts) + 2, "the done slot and the json bucket are not read"


async def test_bson_batch_job_quarantines_what_does_not_fit_and_the_other_codecs_buckets(
        spark, make_queue, mongo_uri, db_name, sync_db, tmp_path) -> None:
    from bucketq_spark.sinks import ParquetSink

    events = _events(0, 120)
    events[77]["amount"] = "12,50 EUR"  # not a DOUBLE: the connector would fail the read
    q = make_queue(bucket_max_size=50, bucket_max_wait=0.02, codec="bson")
    await q.push_many(events)
    await q.close()
    await _push(make_queue, _events(500, 3))  # a json bucket in the same queue
    sink = ParquetSink(str(tmp_path / "rows"))

    with _job(spark, mongo_uri, db_name, sink, codec="bson") as job:
        results = job.run()

    entries = {e["kind"]: e for e in sync_db["events.quarantine"].find()}
    assert sorted(entries) == ["bucket", "message"]
    assert entries["message"]["enc"] == "bson" and entries["message"]["p"] == events[77]  # the document, as stored
    assert entries["bucket"]["doc"]["enc"] == "json" and "codec 'json'" in entries["bucket"]["reason"]
    _assert_exactly_once(sink.read(spark), [i for i in range(120) if i != 77])
    assert sum(r.malformed for r in results) == 1 and sync_db.events.count_documents(claims.LIVE) == 0
