"""A small, fixed-seed run of the stress harness (``python -m tests.stress``) inside ``make test``, and the
harness's accounting checked on made-up logs, so that a harness that can no longer see a loss is caught."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stress.accounting import ConsumerLog, account, parse_consumer_logs, parse_writer_log

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--quick", "--seed", "7", "--writers", "2", "--messages-per-writer", "300", "--consumers", "2",
         "--crashers", "1", "--server-restarts", "1", "--writer-kills", "1", "--cuts", "2",
         "--write-seconds", "6", "--dedupe", "on", "--timeout", "150"]


@pytest.mark.timeout(200)
def test_small_stress_run_loses_nothing_and_duplicates_nothing_with_dedupe():
    env = {k: v for k, v in os.environ.items()
           if k not in ("WRITERS", "MESSAGES_PER_WRITER", "CONSUMERS", "CRASHERS", "PAYLOAD_BYTES",
                        "SERVER_RESTARTS", "DEDUPE", "STRESS_SEED", "WRITER_KILLS", "PROXY_CUTS")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.stress", *SMALL], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the harness stops its processes and its server on SIGTERM
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the stress harness did not finish: {err.decode()[-2000:]}")
    lines = out.decode().strip().splitlines()
    assert lines, f"no report; stderr: {err.decode()[-2000:]}"
    report = json.loads(lines[-1])
    context = f"{json.dumps(report, indent=1)[:4000]}\nstderr: {err.decode()[-2000:]}"
    for key in ("written", "processed", "lost", "duplicated", "unexpected", "left_behind", "throughput"):
        assert key in report, key
    assert report["written"] == 600, context
    assert (report["lost"], report["unexpected"], report["duplicated"]) == (0, 0, 0), context
    assert report["left_behind"] == {"buckets": 0, "messages": 0, "dead_letters": 0, "quarantined": 0}, context
    assert report["processed"] >= 600, context
    faults = report["faults"]
    assert sum(faults["consumer_kills"].values()) >= 1 and faults["writer_kills"] == 1, context
    assert faults["proxy_cuts"] == 2, context
    if not os.environ.get("BUCKETQ_MONGODB_URI"):
        assert faults["server_restarts"] == 1, context
    assert set(report["throughput"]) == {"write", "crash_recovery", "drain", "total"}
    assert report["ok"] and proc.returncode == 0, context


# -- the accounting, on made-up logs ------------------------------------------------------------------------

def _writer(text: str, w: int = 0, g: int = 0):
    return parse_writer_log(w, g, text)


def _rec(rid: str, s: int, pid: int, at: float, *, w: int = 0, g: int = 0, mid: str | None = None,
         problem: str | None = None) -> dict:
    return {"_id": rid, "w": w, "g": g, "s": s, "mid": mid or f"b:{s}", "pid": pid, "at": at, "problem": problem}


def test_accounting_clean_run():
    logs = [_writer("t 0 3\nok 0\nok 1\nok 2\ndone\n")]
    records = [_rec("r0", 0, 1, 1.0), _rec("r1", 1, 1, 1.0), _rec("r2", 2, 2, 1.0)]
    result = account(logs, records, parse_consumer_logs(["ack r0 r1\n", "ack r2\n"]), killed_pids=set(),
                     dedupe=True, max_in_flight_per_kill=25)
    assert (result["written"], result["processed"], result["lost"], result["duplicated"], result["unexpected"]) \
        == (3, 3, 0, 0, 0)


def test_accounting_sees_a_lost_message_and_counts_unacked_pushes_apart():
    logs = [_writer("t 0 4\nok 0\nok 1\n"), _writer("t 0 1\nok 0\ndone\n", g=1)]
    records = [_rec("r0", 0, 1, 1.0), _rec("r9", 0, 1, 1.0, g=1), _rec("r3", 3, 1, 1.0)]
    result = account(logs, records, parse_consumer_logs(["ack r0 r9 r3\n"]), killed_pids=set(), dedupe=True,
                     max_in_flight_per_kill=25)
    assert result["written"] == 3 and result["lost"] == 1  # 0.0.1 was acknowledged, never processed
    assert result["unacked_pushes"] == {"attempted": 2, "survived": 1, "lost": 1}  # 0.0.2 lost, 0.0.3 survived


def test_accounting_sees_unexpected_and_corrupted_messages_and_double_storage():
    logs = [_writer("t 0 2\nok 0\nok 1\n")]
    records = [_rec("r0", 0, 1, 1.0), _rec("r1", 1, 1, 1.0, problem="corrupted"), _rec("r2", 7, 1, 1.0),
               _rec("r3", 0, 2, 2.0, mid="other:0")]
    result = account(logs, records, parse_consumer_logs(["ack r0 r1 r2 r3\n"]), killed_pids=set(), dedupe=False,
                     max_in_flight_per_kill=25)
    assert result["unexpected"] == 3  # a corrupted payload, a message never pushed, one stored under two ids


def test_accounting_duplicates_with_and_without_dedupe():
    logs = [_writer("t 0 2\nok 0\nok 1\n")]
    # Message 0: committed by pid 1 (then killed before its ack was flushed), committed again by pid 2.
    # Message 1: handled by killed pid 1 without ack, then committed by pid 2: an in-flight redelivery.
    records = [_rec("a", 0, 1, 1.0), _rec("b", 0, 2, 2.0), _rec("c", 1, 1, 1.0), _rec("d", 1, 2, 2.0)]
    consumers = parse_consumer_logs(["ack a\n", "ack b d\n"])
    without = account(logs, records, consumers, killed_pids={1}, dedupe=False, max_in_flight_per_kill=25)
    assert (without["duplicated"], without["duplicates_allowed"], without["redelivered_in_flight"]) == (1, 1, 1)
    with_dedupe = account(logs, records, consumers, killed_pids={1}, dedupe=True, max_in_flight_per_kill=25)
    assert (with_dedupe["duplicated"], with_dedupe["duplicates_allowed"]) == (1, 0)
    not_killed = account(logs, records, consumers, killed_pids=set(), dedupe=False, max_in_flight_per_kill=25)
    assert not_killed["_counts"]["unexplained_duplicates"] == 1
    assert not_killed["_counts"]["uncommitted_without_kill"] == 1  # "c" was never acked, and pid 1 lived


def test_accounting_allows_uncommitted_records_of_lost_leases():
    logs = [_writer("t 0 1\nok 0\n")]
    records = [_rec("a", 0, 1, 1.0), _rec("b", 0, 2, 2.0)]
    result = account(logs, records, ConsumerLog(committed={"b"}, lease_lost={"a"}), killed_pids=set(),
                     dedupe=True, max_in_flight_per_kill=25)
    assert result["redelivered_in_flight"] == 1 and result["_counts"]["uncommitted_without_kill"] == 0
    assert result["duplicated"] == 0
