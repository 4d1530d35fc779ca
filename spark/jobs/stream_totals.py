"""Example job: count and sum of ``amount`` per account over a bucketq stream, read by a reader group in batches.

    spark-submit --master spark://host:7077 --jars <the five jars, comma-separated> spark/jobs/stream_totals.py \
        --uri mongodb://... --db demo --stream events --group spark-totals --sink stream_totals

Each batch is the group's uncommitted range (``bucketq_spark.stream.run_group_batch``): its messages' ``account``
and ``amount`` go to the MongoDB collection ``--sink``, one document per message keyed by its position, then the
group commits. A batch killed before its commit is read again and rewrites the same documents. Batches run until
the group has nothing uncommitted; then the totals per account are read from the sink and printed, one
``account<TAB>count<TAB>amount`` line each, as ``account_totals`` prints them. Events as in ``account_totals``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from bucketq_spark.session import build_session, describe_executors, executor_ids
from bucketq_spark.sinks import MongoSink
from bucketq_spark.status_line import StatusLine
from bucketq_spark.stream import run_group_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EVENT_SCHEMA = "account STRING, amount DOUBLE, seq LONG, ts DOUBLE"


def account_rows(messages: DataFrame) -> DataFrame:
    """process(): one row per message that parsed, keyed by its position."""
    return messages.where("NOT malformed").select("position", "payload.account", "payload.amount")


def sink_totals(uri: str, db: str, sink: str) -> list[dict[str, Any]]:
    client: MongoClient = MongoClient(uri)
    try:
        pipeline = [{"$group": {"_id": "$account", "count": {"$sum": 1}, "amount": {"$sum": "$amount"}}},
                    {"$sort": {"_id": 1}}]
        return [{"account": row["_id"], "count": row["count"], "amount": row["amount"]}
                for row in client[db][sink].aggregate(pipeline)]
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--stream", default="events")
    parser.add_argument("--group", default="spark-totals")
    parser.add_argument("--sink", required=True, help="MongoDB collection for one document per message")
    args = parser.parse_args(argv)
    spark = build_session(app_name="bucketq-stream-example")
    try:
        sink = MongoSink(args.uri, args.db, args.sink, id_columns=("position",))
        batches = rows = 0
        status = StatusLine()
        while True:
            batch = run_group_batch(spark, args.uri, args.db, args.stream, args.group, EVENT_SCHEMA, account_rows,
                                    sink)
            if not batch["rows"] and not batch["committed"]:
                break
            batches, rows = batches + 1, rows + batch["rows"]
            status.show(f"batch {batches}: positions {batch['start']} to {batch['end']}, {batch['rows']} rows")
        status.end()
        print(f"{batches} batch(es), {rows} rows of stream {args.stream!r} for group {args.group!r}")
        print(f"master {spark.sparkContext.master}, executors: {describe_executors(executor_ids(spark))}")
    finally:
        spark.stop()
    for row in sink_totals(args.uri, args.db, args.sink):
        print(f"{row['account']}\t{row['count']}\t{row['amount']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
