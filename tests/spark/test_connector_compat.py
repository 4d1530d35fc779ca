"""The pinned pyspark and mongo-spark-connector read and write a real MongoDB-wire server.

Pins: pyspark (pyproject's ``spark`` extra, Scala 2.13), connector ``mongo-spark-connector_2.13`` 10.5.0 and
driver 5.1.4 (``spark/jars/pom.xml``), on ``spark.jars``. Reads use an explicit schema, an aggregation
pipeline and a partitioner that needs no ``$collStats`` (the test server has none).
"""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path

import pytest
from bson import ObjectId

from bucketq_spark import (
    CONNECTOR_VERSION,
    MONGODB_DRIVER_VERSION,
    PAGINATE_INTO_PARTITIONS,
    PYSPARK_VERSION,
    SINGLE_PARTITION,
)

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent.parent
N = 300
UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)

SCHEMA = (
    "_id STRING, i LONG, kind STRING, tags ARRAY<STRING>, meta STRUCT<src: STRING, n: LONG>, "
    "at TIMESTAMP, payload STRING"
)


def _pyproject_pin() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    pins = [req.split("==", 1)[1].strip() for req in extra if req.replace(" ", "").lower().startswith("pyspark==")]
    assert pins, f"pyproject's spark extra pins no pyspark: {extra}"
    return pins[0]


@pytest.fixture
def docs(sync_db) -> list[dict]:
    rows = [
        {
            "_id": ObjectId(),
            "i": i,
            "kind": "a" if i % 2 else "b",
            "tags": [f"t{i % 3}", f"u{i}"],
            "meta": {"src": "x", "n": i * 2},
            "at": T0 + dt.timedelta(seconds=i),
            "payload": json.dumps({"k": i, "v": f"s{i}"}),
        }
        for i in range(N)
    ]
    sync_db.src.insert_many(rows)
    return rows


def _read(spark, uri: str, db: str, coll: str, *, partitioner: str = SINGLE_PARTITION, pipeline=None, **opts):
    reader = (
        spark.read.format("mongodb")
        .schema(SCHEMA)
        .option("connection.uri", uri)
        .option("database", db)
        .option("collection", coll)
        .option("partitioner", partitioner)
    )
    if pipeline is not None:
        reader = reader.option("aggregation.pipeline", json.dumps(pipeline))
    return reader.options(**opts).load()


def _write(df, uri: str, db: str, coll: str, **opts) -> None:
    (
        df.write.format("mongodb")
        .mode("append")
        .option("connection.uri", uri)
        .option("database", db)
        .option("collection", coll)
        .option("operationType", "replace")
        .option("idFieldList", "_id")
        .option("upsertDocument", "true")
        .options(**opts)
        .save()
    )


def test_versions_are_the_pins(spark) -> None:
    import pyspark

    assert pyspark.__version__ == PYSPARK_VERSION == _pyproject_pin()
    assert spark.version == PYSPARK_VERSION
    assert spark.sparkContext._jvm.scala.util.Properties.versionNumberString().startswith("2.13.")
    jars = {Path(p).name for p in spark.sparkContext.getConf().get("spark.jars").split(",")}
    assert jars == {
        f"mongo-spark-connector_2.13-{CONNECTOR_VERSION}.jar",
        f"mongodb-driver-sync-{MONGODB_DRIVER_VERSION}.jar",
        f"mongodb-driver-core-{MONGODB_DRIVER_VERSION}.jar",
        f"bson-{MONGODB_DRIVER_VERSION}.jar",
        f"bson-record-codec-{MONGODB_DRIVER_VERSION}.jar",
    }


@pytest.mark.parametrize("partitioner", [PAGINATE_INTO_PARTITIONS, SINGLE_PARTITION], ids=["paginate", "single"])
def test_read_pipeline_with_explicit_schema(spark, mongo_uri, db_name, docs, partitioner) -> None:
    df = _read(
        spark, mongo_uri, db_name, "src",
        partitioner=partitioner,
        pipeline=[{"$match": {"kind": "a"}}],
        **{"partitioner.options.max.number.of.partitions": "3"},
    )
    expected = [d for d in docs if d["kind"] == "a"]
    rows = sorted(df.collect(), key=lambda r: r.i)

    assert len(rows) == len(expected) == N // 2
    if partitioner == SINGLE_PARTITION:
        assert df.rdd.getNumPartitions() == 1
    else:
        assert df.rdd.getNumPartitions() > 1
    for row, doc in zip(rows, expected, strict=True):
        assert row.i == doc["i"]
        assert row._id == str(doc["_id"])  # an ObjectId read as STRING is its 24-hex-digit form
        assert row.kind == "a"
        assert row.tags == doc["tags"]
        assert (row.meta.src, row.meta.n) == ("x", doc["i"] * 2)
        # collect() gives naive datetimes in the Python process's local zone: compare instants.
        assert row.at.astimezone(UTC) == doc["at"]
        assert row.payload == doc["payload"]


def test_posexplode_and_from_json(spark, mongo_uri, db_name, docs) -> None:
    from pyspark.sql import functions as F

    df = _read(spark, mongo_uri, db_name, "src")

    exploded = df.select("i", F.posexplode("tags").alias("pos", "tag"))
    assert exploded.count() == 2 * N
    assert sorted(tuple(r) for r in exploded.where("i = 7").collect()) == [(7, 0, "t1"), (7, 1, "u7")]

    parsed = df.select("i", F.from_json("payload", "k LONG, v STRING").alias("p"))
    assert parsed.where(F.col("p.k") == F.col("i")).where(F.col("p.v") == F.concat(F.lit("s"), F.col("i"))).count() == N


def test_write_replace_by_id_is_idempotent(spark, mongo_uri, db_name, sync_db, docs) -> None:
    from pyspark.sql import functions as F

    out = _read(spark, mongo_uri, db_name, "src").select(F.col("i").alias("_id"), "kind", "tags", "meta", "at")
    _write(out, mongo_uri, db_name, "dst")
    _write(out, mongo_uri, db_name, "dst")  # the same rows again: replaced, not duplicated

    assert sync_db.dst.count_documents({}) == N
    got = {d["_id"]: d for d in sync_db.dst.find()}
    for doc in docs:
        assert got[doc["i"]] == {
            "_id": doc["i"],
            "kind": doc["kind"],
            "tags": doc["tags"],
            "meta": doc["meta"],
            "at": doc["at"].replace(tzinfo=None),  # pymongo returns naive UTC
        }

    _write(out.where("_id < 10").withColumn("kind", F.lit("z")), mongo_uri, db_name, "dst")
    assert sync_db.dst.count_documents({}) == N
    assert sync_db.dst.count_documents({"kind": "z"}) == 10
    assert sorted(d["_id"] for d in sync_db.dst.find({"kind": "z"})) == list(range(10))


def test_write_objectid_back(spark, mongo_uri, db_name, sync_db, docs) -> None:
    """A STRING ``_id`` is written as a string; extended JSON plus ``convertJson`` writes an ObjectId."""
    from pyspark.sql import functions as F

    df = _read(spark, mongo_uri, db_name, "src").select("_id", "i")
    as_oid = df.withColumn("_id", F.to_json(F.struct(F.col("_id").alias("$oid"))))
    for _ in range(2):
        _write(as_oid, mongo_uri, db_name, "oids", convertJson="objectOrArrayOnly")
    _write(df.where("i = 0"), mongo_uri, db_name, "strs")

    assert sync_db.oids.count_documents({}) == N
    assert {d["_id"]: d["i"] for d in sync_db.oids.find()} == {d["_id"]: d["i"] for d in docs}
    assert sync_db.strs.find_one() == {"_id": str(docs[0]["_id"]), "i": 0}


def test_string_id_filter_does_not_match_objectid(spark, mongo_uri, db_name, docs) -> None:
    """Spark pushes ``_id == '<hex>'`` down as a string match, which no ObjectId equals: filter in the pipeline."""
    hex_id = str(docs[5]["_id"])
    df = _read(spark, mongo_uri, db_name, "src")
    assert df.where(df._id == hex_id).count() == 0

    matched = _read(spark, mongo_uri, db_name, "src", pipeline=[{"$match": {"_id": {"$oid": hex_id}}}])
    assert [(r._id, r.i) for r in matched.collect()] == [(hex_id, 5)]
