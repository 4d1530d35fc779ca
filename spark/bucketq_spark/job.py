"""The batch cycle: claim -> read -> process -> write -> commit (or release / quarantine on failure).

    job = BatchJob(spark, uri, "db", "events", payload_schema="account STRING, amount DOUBLE",
                   process=lambda df: df.select("bucket_id", "message_id", "payload.*"),
                   sink=ParquetSink("/data/events"))
    results = job.run()            # batches until no bucket is due

1. claim (driver): up to ``max_buckets`` due buckets under one token and lease (``bucketq.batch.BatchQueue``,
   the consumer's claim); 2. read: the connector reads the buckets matching ``{_id: {$in: ids}, "lease.token":
   token}`` (found by the ``_id`` index) and Spark explodes them into one row per message
   (``bucketq_spark.reader``), cached; payloads that do not parse
   with ``payload_schema`` are noted for quarantine (or, with ``malformed="fail"``, fail the batch);
   3. process: the user's ``process(df) -> df`` over the other messages, materialized and cached; 4. write: the
   lease is extended, then the result goes to an idempotent sink (``bucketq_spark.sinks``); 5. commit: the
   malformed messages are copied to ``<queue>.quarantine`` (raw payload kept), then the buckets are replaced by
   tombstones (fenced). A failure in 2-4 releases the buckets (tries + 1, backoff) or, after ``max_attempts``,
   moves them to ``<queue>.quarantine``. A job that dies between 4 and 5 leaves its buckets leased; after the
   lease runs out the next run claims them again and rewrites the same rows: the sink keeps one copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import ObjectId

from bucketq.batch import Batch, BatchQueue
from bucketq.core.backoff import Backoff
from bucketq.core.format import DOCUMENT_CODEC, payload_size, stored_payload_ok
from bucketq.errors import BucketqError, InvalidOption
from bucketq.shell.redaction import redact
from bucketq_spark.reader import READ_CODECS, ReadOptions, decode_options, payload_struct, read_messages
from bucketq_spark.session import require_connector
from bucketq_spark.sinks import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

STEPS = ("claim", "read", "process", "write", "commit")
MALFORMED_CHOICES = ("quarantine", "fail")
Progress = Callable[[dict[str, Any]], Any]


class MalformedPayloads(BucketqError, ValueError):
    """With ``malformed="fail"``: some payloads of the batch do not parse with ``payload_schema``."""


@dataclass
class BatchResult:
    """What one cycle did. ``error`` is set when read, process, write or commit failed. ``rows`` counts every
    message read, ``malformed`` those of them that went to quarantine instead of ``process``."""

    token: str
    buckets: int = 0
    rows: int = 0
    malformed: int = 0
    out_rows: int = 0
    committed: int = 0
    released: list[Any] = field(default_factory=list)
    quarantined: list[Any] = field(default_factory=list)
    error: str | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEPS, 0.0))


# The connector's error for a value it cannot convert to the schema (a bson payload that does not fit)
CONNECTOR_DATA_ERROR = "com.mongodb.spark.sql.connector.exceptions.DataException"


class BatchJob:
    """Runs ``process`` over the messages of queue ``queue`` in batches of up to ``max_buckets`` buckets.

    ``malformed``: what to do with messages whose payload does not parse with ``payload_schema`` (see
    ``bucketq_spark.reader``): ``"quarantine"`` (default) copies each to ``<queue>.quarantine`` (``kind:
    "message"``, raw payload kept) when the batch commits, and ``process`` never sees them; ``"fail"`` fails
    the batch (``MalformedPayloads``): it is released, and after ``max_attempts`` its buckets go to quarantine
    whole. ``payload_schema`` must be a struct; ``json_options`` may not set ``mode`` nor
    ``columnNameOfCorruptRecord`` (``InvalidOption``). ``codec``: the payloads' codec it reads, ``"json"`` or
    ``"bson"`` (``bucketq_spark.reader``); its claims quarantine buckets of any other.

    ``progress(event)`` gets dicts ``{"batch", "step", "state": "start"|"running"|"done", "elapsed_s",
    "tasks": (done, total) | None, ...}``: "running" every ``progress_interval`` s while Spark works.
    """

    def __init__(self, spark: SparkSession, uri: str, database: str, queue: str, *,
                 payload_schema: str | StructType, process: Callable[[DataFrame], DataFrame], sink: Sink,
                 max_buckets: int = 100, lease: float = 300.0, max_attempts: int = 5, backoff: Backoff | None = None,
                 read: ReadOptions | None = None, json_options: Mapping[str, str] | None = None,
                 malformed: str = "quarantine", progress: Progress | None = None,
                 progress_interval: float = 0.5, partitions: int | None = None, codec: str = "json") -> None:
        if malformed not in MALFORMED_CHOICES:
            raise InvalidOption(f"malformed must be one of {', '.join(MALFORMED_CHOICES)}, got {malformed!r}")
        decode_options(json_options)
        self.malformed = malformed
        self.malformed_reason = ("payload does not parse with the Spark job's payload_schema "
                                 f"{payload_struct(payload_schema).simpleString()}")
        self.spark = spark
        self.uri, self.database, self.queue_name = uri, database, queue
        self.payload_schema = payload_schema
        self.process_fn = process
        self.sink = sink
        self.max_buckets = max_buckets
        self.read_options = read or ReadOptions()
        self.json_options = json_options
        if codec not in READ_CODECS:
            raise InvalidOption(f"codec must be one of {', '.join(READ_CODECS)}, got {codec!r}")
        self.codec = codec
        # partitions: the queue's; claims go to one partition at a time
        self.queue = BatchQueue(uri, name=queue, db=database, lease=lease, max_attempts=max_attempts, backoff=backoff,
                                partitions=partitions, codecs=(codec,))
        try:
            require_connector(spark)  # after the URI's check, before anything is claimed
        except BaseException:
            self.queue.close()
            raise
        self.progress = progress
        self.progress_interval = progress_interval
        self.batches = 0

    # -- the steps (public so a crash can be simulated by skipping one) -------------------------------------

    def claim(self) -> Batch | None:
        return self.queue.claim(self.max_buckets)

    def read(self, batch: Batch) -> tuple[DataFrame, int]:
        """The batch's messages, cached, and their number, malformed ones included. Those are noted in
        ``batch.malformed`` for ``commit`` to quarantine, or, with ``malformed="fail"``, raise
        ``MalformedPayloads``."""
        # The payloads' size sizes the partitions.
        size = sum(payload_size(p) for doc in batch.buckets for p in doc.get("p") or ()
                   if stored_payload_ok(p, self.codec))
        try:
            return self._read(batch, size, as_json=False)
        except Exception as exc:
            if self.codec != DOCUMENT_CODEC or CONNECTOR_DATA_ERROR not in str(exc):
                raise
        # A bson payload the connector could not convert to payload_schema failed the read: the batch is read again
        # with its payloads as JSON text, which flags that payload alone (bucketq_spark.reader, Codecs).
        return self._read(batch, size, as_json=True)

    def _read(self, batch: Batch, size: int, *, as_json: bool) -> tuple[DataFrame, int]:
        from pyspark import StorageLevel

        df = read_messages(self.spark, self.uri, self.database, self.queue_name, self.payload_schema,
                           token=batch.token, ids=batch.ids, expected_docs=len(batch), expected_bytes=size,
                           read=self.read_options, json_options=self.json_options, codec=self.codec,
                           as_json=as_json).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = {row.malformed: row["count"] for row in df.groupBy("malformed").count().collect()}
            if counts.get(True):
                self._note_malformed(batch, df, counts[True], sum(counts.values()))
        except BaseException:
            df.unpersist()
            raise
        return df, sum(counts.values())

    def _note_malformed(self, batch: Batch, messages: DataFrame, bad: int, total: int) -> None:
        malformed = messages.where("malformed").select("bucket_id", "slot", "message_id")
        if self.malformed == "fail":
            first = malformed.first()
            assert first is not None  # bad > 0
            raise MalformedPayloads(f"{bad} of {total} payload(s) do not parse with payload_schema "
                                    f"(first: message {first.message_id})")
        batch.malformed.update({(ObjectId(row.bucket_id), row.slot): self.malformed_reason
                                for row in malformed.collect()})

    def process(self, messages: DataFrame) -> tuple[DataFrame, int]:
        """The user's result over the messages that parsed (``malformed`` false, the column dropped), computed
        (so its failures surface here) and cached, and its row count."""
        from pyspark import StorageLevel

        wellformed = messages.where("NOT malformed").drop("malformed")
        return _counted(self.process_fn(wellformed).persist(StorageLevel.MEMORY_AND_DISK))

    def write(self, batch: Batch, out: DataFrame) -> None:
        self.queue.extend(batch)
        self.sink.write(out)

    def commit(self, batch: Batch) -> int:
        return self.queue.commit(batch)

    # -- the cycle ------------------------------------------------------------------------------------------

    def run_once(self) -> BatchResult | None:
        """One claim -> commit cycle; None when no bucket is due."""
        self.batches += 1
        with self._step("claim") as t:
            batch = self.claim()
        if batch is None:
            return None
        result = BatchResult(batch.token, buckets=len(batch), quarantined=list(batch.quarantined))
        result.seconds["claim"] = t.seconds
        if not batch.buckets:
            return result
        cached: list[DataFrame] = []
        try:
            with self._step("read", buckets=len(batch), messages=batch.messages) as t:
                messages, result.rows = self.read(batch)
                cached.append(messages)
                result.malformed = len(batch.malformed)
            result.seconds["read"] = t.seconds
            with self._step("process", rows=result.rows) as t:
                out, result.out_rows = self.process(messages)
                cached.append(out)
            result.seconds["process"] = t.seconds
            with self._step("write", out_rows=result.out_rows) as t:
                self.write(batch, out)
            result.seconds["write"] = t.seconds
        except Exception as exc:
            result.error = redact(f"{type(exc).__name__}: {_first_line(exc)}", self.uri)  # stored and shown
            outcome = self.queue.release(batch, result.error)
            result.released, result.quarantined = outcome["released"], result.quarantined + outcome["quarantined"]
            self._emit("release", "done", 0.0, released=len(result.released), quarantined=len(result.quarantined),
                       error=result.error)
            return result
        finally:
            for df in cached:
                df.unpersist()
        try:
            with self._step("commit", buckets=len(batch), malformed=len(batch.malformed)) as t:
                result.committed = self.commit(batch)
            result.seconds["commit"] = t.seconds
        except Exception as exc:  # written but not finished: the lease runs out and a re-run rewrites the same rows
            result.error = redact(f"commit failed: {type(exc).__name__}: {_first_line(exc)}", self.uri)
        return result

    def run(self, max_batches: int | None = None) -> list[BatchResult]:
        """Cycles until no bucket is due (or ``max_batches``). Failed batches are released and the run goes
        on; their buckets come back after the backoff."""
        results: list[BatchResult] = []
        while max_batches is None or len(results) < max_batches:
            result = self.run_once()
            if result is None:
                break
            results.append(result)
        return results

    def close(self) -> None:
        self.queue.close()

    def __enter__(self) -> BatchJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- progress -------------------------------------------------------------------------------------------

    def _emit(self, step: str, state: str, elapsed: float, **info: Any) -> None:
        if self.progress is not None:
            self.progress({"batch": self.batches, "step": step, "state": state, "elapsed_s": elapsed, **info})

    def _step(self, step: str, **info: Any) -> _Step:
        return _Step(self, step, info)


class _Step:
    """Times one step; while it runs, a thread reports Spark's task progress every ``progress_interval``."""

    def __init__(self, job: BatchJob, step: str, info: dict[str, Any]) -> None:
        self.job, self.step, self.info = job, step, info
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Step:
        self._start = time.perf_counter()
        self.job._emit(self.step, "start", 0.0, **self.info)
        if self.job.progress is not None and self.step != "claim" and self.step != "commit":
            self._thread = threading.Thread(target=self._tick, name=f"bucketq-progress-{self.step}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.job._emit(self.step, "done", self.seconds, **self.info)

    def _tick(self) -> None:
        tracker = self.job.spark.sparkContext.statusTracker()
        while not self._stop.wait(self.job.progress_interval):
            try:
                stages = [s for s in (tracker.getStageInfo(i) for i in tracker.getActiveStageIds()) if s]
                tasks = (sum(s.numCompletedTasks for s in stages), sum(s.numTasks for s in stages)) if stages else None
            except Exception:  # the context is stopping; progress is best effort
                tasks = None
            if not self._stop.is_set():
                self.job._emit(self.step, "running", time.perf_counter() - self._start, tasks=tasks, **self.info)


def _counted(df: DataFrame) -> tuple[DataFrame, int]:
    try:
        return df, df.count()
    except BaseException:
        df.unpersist()
        raise


def _first_line(exc: BaseException) -> str:
    """A short reason for logs and quarantine entries: Spark errors carry a JVM stack trace, and a Python
    UDF's error ends its traceback."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return repr(exc)
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        tail = [ln for ln in lines if not ln.startswith(("at ", "File ", "Driver stacktrace"))]
        return tail[-1][:1000]
    if lines[0].startswith("An error occurred while calling") and len(lines) > 1:  # Py4JJavaError
        return lines[1].lstrip(": ")[:1000]
    return lines[0][:1000]


def format_progress(event: dict[str, Any]) -> str:
    """A one-line rendering of a progress event, for a status line."""
    text = f"batch {event['batch']}: {event['step']} {event['state']}"
    if event.get("elapsed_s"):
        text += f" {event['elapsed_s']:.1f}s"
    if event.get("tasks"):
        text += " (tasks {}/{})".format(*event["tasks"])
    for key in ("buckets", "messages", "rows", "malformed", "out_rows", "released", "quarantined"):
        if key in event:
            text += f" {key}={event[key]}"
    return text
