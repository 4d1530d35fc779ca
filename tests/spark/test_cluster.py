"""The example job under ``spark-submit``: on a standalone cluster (a Master and a Worker of the installed pyspark,
on 127.0.0.1, stopped by PID) with an executor killed mid-run, and without the connector on the driver."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import defaultdict

import pytest

import bucketq
from bucketq.core import claims
from bucketq_spark.session import describe_executors
from devtools.jars import ROOT, ensure_jars
from devtools.sparkcluster import SparkCluster, submit, submit_command
from examples.demo import parse_job_output

pytestmark = pytest.mark.spark

JOB = ROOT / "spark" / "jobs" / "account_totals.py"
STREAM_JOB = ROOT / "spark" / "jobs" / "stream_totals.py"


async def _push_events(make_queue, n: int) -> dict[str, list[float]]:
    rng = random.Random(5)
    events = [{"account": f"acct-{rng.randrange(7)}", "amount": round(rng.uniform(1, 100), 2), "seq": i, "ts": 0.0}
              for i in range(n)]
    q = make_queue(bucket_max_size=100)
    await q.push_many(events)
    await q.close()
    return _totals(events)


def assert_ran_on_executors(report: dict) -> None:
    """The job's line names the master and counts the executors it has, then gives their ids."""
    assert re.fullmatch(r"master spark://\S+, executors: [1-9]\d* \(ids? \d+(, \d+)*\)", report["executors"]), \
        report["executors"]


def test_executors_are_told_by_count_then_ids() -> None:
    assert describe_executors(["0"]) == "1 (id 0)"  # not "executors: 0", which read as none
    assert describe_executors(["0", "2"]) == "2 (ids 0, 2)"
    assert describe_executors([]) == "none (local mode)"


def _totals(events: list[dict]) -> dict[str, list[float]]:
    """``[count, sum of amount]`` per account: what the jobs must print."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        totals[e["account"]][0] += 1
        totals[e["account"]][1] += e["amount"]
    return totals


@pytest.fixture(scope="module")
def cluster():
    with SparkCluster(cores=1, memory="1g") as running:
        yield running


async def test_the_job_runs_on_the_clusters_executors_and_survives_an_executor_killed(
        cluster, make_queue, mongo_uri, db_name, sync_db, tmp_path) -> None:
    """``build_session`` used to set ``local[2]`` over spark-submit's ``--master``: the job ran in local mode and
    still reported the right totals. Now the master runs it, on its executors; one is SIGKILLed while the job
    reads, and the totals are still exact, every bucket committed once."""
    expected = await _push_events(make_queue, 20_000)
    command = submit_command(cluster.master_url, ensure_jars("spark"), JOB,
                             ["--uri", mongo_uri, "--db", db_name, "--queue", "events", "--out", str(tmp_path / "out"),
                              "--max-buckets", "20"], name="bucketq-cluster-test")
    # spark-submit passes the Python driver's stderr (the job's progress) on to its stdout, with the report
    with (tmp_path / "spark-submit.log").open("w") as log:
        job = submit(command, stdout=subprocess.PIPE, stderr=log)
    reading = threading.Event()
    output: list[str] = []

    def follow() -> None:
        assert job.stdout is not None
        for chunk in iter(lambda: job.stdout.read(256), ""):
            output.append(chunk)
            if re.search(r"batch \d+: read", "".join(output[-2:])):
                reading.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    killed = None
    try:
        deadline = time.monotonic() + 240
        while killed is None and job.poll() is None and time.monotonic() < deadline:
            executors = cluster.executor_pids()
            if reading.is_set() and executors:
                killed = executors[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
        job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    follower.join(10)
    stdout = "".join(output)
    assert job.returncode == 0, stdout[-3000:]
    assert killed is not None, "no executor was running while the job read: the kill never happened"
    report = parse_job_output(stdout)
    assert_ran_on_executors(report)
    assert "bucketq-cluster-test" in [app["name"] for app in cluster.state()["completedapps"]]
    got = {r["account"]: r for r in report["accounts"]}
    assert sorted(got) == sorted(expected)
    for account, (count, amount) in expected.items():
        assert got[account]["count"] == count and got[account]["amount"] == pytest.approx(amount, abs=0.01)
    assert sync_db.events.count_documents(claims.LIVE) == 0


async def test_a_stream_groups_range_is_read_on_the_clusters_executors_and_committed(cluster, mongo_uri, db_name,
                                                                                       sync_db) -> None:
    rng = random.Random(9)
    events = [{"account": f"acct-{rng.randrange(5)}", "amount": float(rng.randrange(1, 100)), "seq": i, "ts": 0.0}
              for i in range(3000)]
    async with bucketq.Stream(mongo_uri, name="events", db=db_name, bucket_max_size=100) as stream:
        await stream.push_many(events)
    command = submit_command(cluster.master_url, ensure_jars("spark"), STREAM_JOB,
                             ["--uri", mongo_uri, "--db", db_name, "--stream", "events", "--group", "totals",
                              "--sink", "totals"], name="bucketq-stream-cluster-test")
    job = submit(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    report = parse_job_output(stdout)
    assert_ran_on_executors(report)
    assert "bucketq-stream-cluster-test" in [app["name"] for app in cluster.state()["completedapps"]]
    assert {r["account"]: [r["count"], r["amount"]] for r in report["accounts"]} == _totals(events)
    last = sync_db["events.seq"].find_one()["last"]
    assert sync_db["events.positions"].find_one({"_id": "totals"})["s"] == last + 1, "the group did not commit it all"


async def test_a_job_submitted_without_the_connector_fails_before_claiming(make_queue, mongo_uri, db_name, sync_db,
                                                                           tmp_path) -> None:
    """Jars given through ``spark.jars`` never reach a driver that spark-submit started: the job found out only
    after claiming a bucket. Now it says so before claiming anything."""
    await _push_events(make_queue, 200)
    command = submit_command("local[1]", [], JOB, ["--uri", mongo_uri, "--db", db_name, "--queue", "events",
                                                   "--out", str(tmp_path / "out")])
    job = submit(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode != 0
    said = stdout + stderr  # spark-submit passes the Python driver's stderr on to its stdout
    assert "ConnectorMissing" in said and "spark-submit --jars" in said, said[-2000:]
    assert all(d["c"] == 0 and d["lease"] is None for d in sync_db.events.find()), "a bucket was claimed"
