"""Example job: count and sum of ``amount`` per account over the events of a bucketq queue, into Parquet.

    python spark/jobs/account_totals.py --uri mongodb://localhost:27017 --db demo --queue events --out /tmp/totals

Claims the queue's due buckets in batches, decodes the JSON payloads with ``EVENT_SCHEMA``
(``{"account": "acct-17", "amount": 12.5, "seq": 123, "ts": <unix seconds>}``), writes partial totals per
bucket (idempotent on re-run), commits, and prints the totals per account. The code is
``bucketq_spark.example`` (importable: ``from bucketq_spark.example import run_example_job``).
"""

from __future__ import annotations

import argparse
import sys

from bucketq_spark.example import run_example_job
from bucketq_spark.job import format_progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--queue", default="events")
    parser.add_argument("--out", required=True, help="Parquet output directory")
    parser.add_argument("--max-buckets", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=None)
    args = parser.parse_args(argv)

    def progress(event: dict) -> None:
        if event["state"] != "start":
            print(f"\r{format_progress(event):<100}", end="", file=sys.stderr, flush=True)

    result = run_example_job(args.uri, args.db, args.queue, args.out, max_buckets=args.max_buckets,
                             partitions=args.partitions, progress=progress)
    print(file=sys.stderr)
    steps = ", ".join(f"{k} {v:.2f}s" for k, v in result["seconds"].items())
    print(f"{result['batches']} batch(es), {result['buckets']} buckets, {result['rows']} rows "
          f"({result['rows_per_s']:,.0f} rows/s, {result['malformed']} malformed: quarantined); {steps}")
    for err in result["errors"]:
        print(f"failed batch: {err}")
    for row in result["accounts"]:
        print(f"{row['account']}\t{row['count']}\t{row['amount']:.2f}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
