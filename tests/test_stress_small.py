"""A small, fixed-seed run of the stress harness (``python -m tests.stress``) in each dedupe mode inside
``make test``, and the harness's accounting checked on made-up logs, so that a harness that can no longer see
a loss or a duplicate is caught."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stress.__main__ import KNOBS
from tests.stress.accounting import ConsumerLog, account, account_groups, parse_consumer_logs, parse_writer_log

ROOT = Path(__file__).resolve().parent.parent
KNOB_ENV = set(KNOBS.values())  # the harness's environment knobs: the run below sets everything by flags
SMALL = ["--quick", "--seed", "7", "--writers", "2", "--messages-per-writer", "300", "--consumers", "2",
         "--crashers", "1", "--server-restarts", "1", "--writer-kills", "1", "--cuts", "2", "--lost-inserts", "2",
         "--lost-fenced", "2", "--delayed-retries", "2", "--clock-steps", "2", "--write-seconds", "6",
         "--timeout", "150"]


@pytest.mark.server  # the harness starts a test server of its own (or uses BUCKETQ_MONGODB_URI's)
@pytest.mark.timeout(200)
@pytest.mark.parametrize("dedupe", ["on", "off"])
def test_small_stress_run_loses_nothing_and_duplicates_nothing_outside_the_documented_windows(dedupe):
    """Every fault of the menu, once or twice. Without dedupe the messages carry no keys: a bucket stored
    again after a lost insert reply, an ack not kept after a lost fenced write, or two consumers holding a
    bucket at once after a clock step would each show as duplicated. The harness's stream run (after the
    queue's) does not depend on the dedupe mode and takes the same seed in both: it runs with "on" only (it was
    37 s of each run)."""
    env = {k: v for k, v in os.environ.items() if k not in KNOB_ENV}
    streams = [] if dedupe == "on" else ["--no-streams"]
    proc = subprocess.Popen([sys.executable, "-m", "tests.stress", *SMALL, *streams, "--dedupe", dedupe], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
    for key in ("written", "processed", "lost", "duplicated", "duplicates_explained", "unexpected", "left_behind",
                "throughput", "modes"):
        assert key in report, key
    assert report["dedupe"] is (dedupe == "on") and list(report["modes"]) == [dedupe], context
    assert report["written"] == 600, context
    assert (report["lost"], report["unexpected"], report["duplicated"]) == (0, 0, 0), context
    assert report["left_behind"] == {"buckets": 0, "messages": 0, "dead_letters": 0, "quarantined": 0}, context
    assert report["processed"] >= 600, context
    faults = report["faults"]
    assert sum(faults["consumer_kills"].values()) >= 1 and faults["writer_kills"] == 1, context
    assert faults["proxy_cuts"] == 2, context
    if not os.environ.get("BUCKETQ_MONGODB_URI"):
        assert faults["server_restarts"] == 1, context
    lost = sum(faults["lost_replies"].values()) + sum(faults["lost_requests"].values())
    assert (lost, faults["command_faults_unfired"]) == (6, 0), context
    assert faults["lost_replies"].get("bucket_insert", 0) >= 2 and faults["delayed_retries"]["lost"] == 2, context
    assert len(faults["clock_steps_s"]) == 2 and min(map(abs, faults["clock_steps_s"])) >= 20, context
    assert set(report["throughput"]) == {"write", "crash_recovery", "drain", "total"}
    groups = report["groups"]
    assert groups["records"] >= 100 and (groups["order_violations"], groups["overlaps"]) == (0, 0), context
    if dedupe == "on":
        stream = report["stream"]
        assert stream["ok"] and (stream["lost"], stream["duplicated"], stream["unexpected"]) == (0, 0, 0), context
    else:
        assert "stream" not in report, context
    assert report["ok"] and proc.returncode == 0, context


# -- the accounting, on made-up logs ------------------------------------------------------------------------

def _writer(text: str, w: int = 0, g: int = 0):
    return parse_writer_log(w, g, text)


def _rec(rid: str, s: int, pid: int, at: float, *, w: int = 0, g: int = 0, mid: str | None = None,
         problem: str | None = None, tries: int = 0, lease: float = 0.0) -> dict:
    return {"_id": rid, "w": w, "g": g, "s": s, "mid": mid or f"b:{s}", "pid": pid, "at": at, "problem": problem,
            "tries": tries, "lease": lease}


def _account(logs, records, consumers, *, killed=frozenset(), dedupe=False):
    return account(logs, records, consumers, killed_pids=set(killed), dedupe=dedupe, max_in_flight_per_kill=25)


def test_accounting_clean_run():
    logs = [_writer("t 0 3\nok 0\nok 1\nok 2\ndone\n")]
    records = [_rec("r0", 0, 1, 1.0), _rec("r1", 1, 1, 1.0), _rec("r2", 2, 2, 1.0)]
    result = _account(logs, records, parse_consumer_logs(["ack r0 r1\n", "ack r2\n"]), dedupe=True)
    assert (result["written"], result["processed"], result["lost"], result["duplicated"], result["unexpected"]) \
        == (3, 3, 0, 0, 0)


def test_accounting_sees_a_lost_message_and_counts_unacked_pushes_apart():
    logs = [_writer("t 0 4\nok 0\nok 1\n"), _writer("t 0 1\nok 0\ndone\n", g=1)]
    records = [_rec("r0", 0, 1, 1.0), _rec("r9", 0, 1, 1.0, g=1), _rec("r3", 3, 1, 1.0)]
    result = _account(logs, records, parse_consumer_logs(["ack r0 r9 r3\n"]), dedupe=True)
    assert result["written"] == 3 and result["lost"] == 1  # 0.0.1 was acknowledged, never processed
    assert result["unacked_pushes"] == {"attempted": 2, "survived": 1, "lost": 1}  # 0.0.2 lost, 0.0.3 survived


def test_accounting_sees_unexpected_and_corrupted_messages_and_double_storage():
    logs = [_writer("t 0 2\nok 0\nok 1\n")]
    records = [_rec("r0", 0, 1, 1.0), _rec("r1", 1, 1, 1.0, problem="corrupted"), _rec("r2", 7, 1, 1.0),
               _rec("r3", 0, 2, 2.0, mid="other:0", tries=1)]
    result = _account(logs, records, parse_consumer_logs(["ack r0 r1 r2 r3\n"]))
    assert result["unexpected"] == 3  # a corrupted payload, a message never pushed, one stored under two ids


def test_accounting_explains_duplicates_of_killed_consumers_without_dedupe_only():
    logs = [_writer("t 0 2\nok 0\nok 1\n")]
    # Message 0: committed by pid 1 (then killed before its ack was flushed), committed again by pid 2 after
    # a new claim (one more try). Message 1: handled by killed pid 1 without ack, then committed by pid 2.
    records = [_rec("a", 0, 1, 1.0, lease=1.9), _rec("b", 0, 2, 3.0, tries=1), _rec("c", 1, 1, 1.0),
               _rec("d", 1, 2, 3.0, tries=1)]
    consumers = parse_consumer_logs(["ack a\n", "ack b d\n"])
    without = _account(logs, records, consumers, killed={1})
    assert (without["duplicated"], without["duplicates_explained"], without["redelivered_in_flight"]) == (0, 1, 1)
    with_dedupe = _account(logs, records, consumers, killed={1}, dedupe=True)
    assert (with_dedupe["duplicated"], with_dedupe["duplicates_explained"]) == (1, 0)
    not_killed = _account(logs, records, consumers)
    assert (not_killed["duplicated"], not_killed["duplicates_explained"]) == (1, 0)
    assert not_killed["problems"]["duplicated"] == ["0.0.0 (ack_not_kept)"]
    assert not_killed["problems"]["duplicated_by_cause"]["ack_not_kept"]["count"] == 1
    assert not_killed["_counts"]["uncommitted_without_kill"] == 1  # "c" was never acked, and pid 1 lived


def test_accounting_explains_duplicates_of_acks_refused_with_a_lost_lease_without_dedupe_only():
    logs = [_writer("t 0 1\nok 0\n")]
    records = [_rec("a", 0, 1, 1.0, mid="bkt:0", lease=1.5), _rec("b", 0, 2, 2.6, mid="bkt:0", tries=1)]
    consumers = parse_consumer_logs(["ack a\nleaselost 1 bkt\n", "ack b\n"])
    without = _account(logs, records, consumers)
    assert (without["duplicated"], without["duplicates_explained"], without["leases_lost"]) == (0, 1, 1)
    with_dedupe = _account(logs, records, consumers, dedupe=True)
    assert (with_dedupe["duplicated"], with_dedupe["duplicates_explained"]) == (1, 0)
    assert with_dedupe["problems"]["duplicated"] == ["0.0.0 (keyed_ack_after_lease)"]
    other_bucket = parse_consumer_logs(["ack a\nleaselost 1 other\n", "ack b\n"])
    assert _account(logs, records, other_bucket)["duplicated"] == 1


def test_group_accounting_sees_order_violations_and_overlaps_and_excuses_killed_consumers():
    # Seqs 0, 2, 4 of writer 0.0 are in group "0.0.0" with 2 groups (common.ordered_group), 1 and 3 in "0.0.1".
    in_order = [_rec("a", 0, 1, 1.0), _rec("b", 2, 1, 2.0), _rec("c", 4, 2, 3.0), _rec("d", 1, 2, 1.5)]
    acked = parse_consumer_logs(["ack a b\nacked 1.5 a\nacked 2.5 b\n", "ack c d\nacked 3.5 c\nacked 1.6 d\n"])
    clean = account_groups(in_order, acked, groups=2, killed_pids=set())
    assert (clean["groups"], clean["records"], clean["order_violations"], clean["overlaps"]) == (2, 4, 0, 0)
    swapped = [_rec("a", 0, 1, 1.0), _rec("b", 4, 1, 2.0), _rec("c", 2, 2, 3.0)]
    assert account_groups(swapped, acked, groups=2, killed_pids=set())["order_violations"] == 1
    early = [_rec("a", 0, 1, 1.0), _rec("b", 2, 2, 1.2)]  # served before a's ack returned at 1.5
    assert account_groups(early, acked, groups=2, killed_pids=set())["overlaps"] == 1
    assert account_groups(early, acked, groups=2, killed_pids={1})["overlaps"] == 0  # a's consumer was killed
    again = [_rec("a", 0, 1, 1.0), _rec("b", 2, 1, 2.0), _rec("c", 0, 2, 9.0, tries=1), _rec("d", 2, 2, 9.5)]
    redelivered = account_groups(again, acked, groups=2, killed_pids={1})
    assert (redelivered["order_violations"], redelivered["redelivered"]) == (0, 1)


def test_accounting_sees_two_consumers_holding_a_bucket_at_once():
    logs = [_writer("t 0 1\nok 0\n")]
    consumers = parse_consumer_logs(["ack a\nleaselost 1 bkt\n", "ack b\n"])
    # pid 1 served the message believing it held the lease 1.9 s more; pid 2 claimed and served it 0.5 s
    # later (a lease taken already expired, a clock step): pid 1's flush was refused, yet that is no excuse.
    early = [_rec("a", 0, 1, 1.0, mid="bkt:0", lease=1.9), _rec("b", 0, 2, 1.5, mid="bkt:0", tries=1)]
    result = _account(logs, early, consumers)
    assert (result["duplicated"], result["duplicates_explained"]) == (1, 0)
    assert result["problems"]["duplicated"] == ["0.0.0 (lease_overlap)"]
    after_the_lease = [_rec("a", 0, 1, 1.0, mid="bkt:0", lease=1.9), _rec("b", 0, 2, 2.9, mid="bkt:0", tries=1)]
    assert _account(logs, after_the_lease, consumers)["duplicates_explained"] == 1


def test_accounting_names_a_stale_lease_duplicate():
    logs = [_writer("t 0 1\nok 0\n")]
    # pid 2 re-claimed the bucket (tries 1) and handled the message; pid 1 handled it later, with tries 0.
    records = [_rec("a", 0, 2, 1.0, mid="bkt:0", tries=1), _rec("b", 0, 1, 2.0, mid="bkt:0", tries=0)]
    consumers = parse_consumer_logs(["ack a\n", "ack b\nleaselost 1 bkt\n"])
    result = _account(logs, records, consumers, killed={1})
    assert result["duplicated"] == 1 and result["duplicates_explained"] == 0
    assert result["problems"]["duplicated"] == ["0.0.0 (stale_lease)"]


def test_accounting_names_a_bucket_stored_twice_even_when_its_first_consumer_was_killed():
    logs = [_writer("t 0 1\nok 0\n")]
    records = [_rec("a", 0, 1, 1.0, mid="bkt:0"), _rec("b", 0, 2, 5.0, mid="bkt:0")]
    result = _account(logs, records, parse_consumer_logs(["ack a\n", "ack b\n"]), killed={1})
    assert result["duplicated"] == 1 and result["duplicates_explained"] == 0
    assert result["problems"]["duplicated"] == ["0.0.0 (stored_again)"]


def test_accounting_limits_what_a_kill_leaves_in_flight_to_one_batch_not_counting_refused_acks():
    logs = [_writer("t 0 3\nok 0\nok 1\nok 2\n")]
    # pid 1 handled messages 0 and 1, its ack() of 0 raised LeaseLost, and it was killed before acking 1;
    # pid 2 committed them both. Message 2: pid 1 handled it, and no ack() said anything.
    records = [_rec("a", 0, 1, 1.0), _rec("b", 1, 1, 1.0), _rec("c", 0, 2, 3.0, tries=1),
               _rec("d", 1, 2, 3.0, tries=1), _rec("e", 2, 1, 1.0), _rec("f", 2, 2, 3.0, tries=1)]
    consumers = parse_consumer_logs(["lost a\n", "ack c d f\n"])
    one_batch = account(logs, records, consumers, killed_pids={1}, dedupe=False, max_in_flight_per_kill=2)
    assert one_batch["redelivered_in_flight"] == 3 and one_batch["problems"]["in_flight_over_limit"] == {}
    too_many = account(logs, records, consumers, killed_pids={1}, dedupe=False, max_in_flight_per_kill=1)
    assert too_many["problems"]["in_flight_over_limit"] == {"1": 2}


def test_accounting_allows_uncommitted_records_of_lost_leases():
    logs = [_writer("t 0 1\nok 0\n")]
    records = [_rec("a", 0, 1, 1.0), _rec("b", 0, 2, 2.0, tries=1)]
    result = _account(logs, records, ConsumerLog(committed={"b"}, lease_lost={"a"}), dedupe=True)
    assert result["redelivered_in_flight"] == 1 and result["_counts"]["uncommitted_without_kill"] == 0
    assert result["duplicated"] == 0


# -- a library bug the harness can run into (server restarts let leases expire under a consumer) -------------

async def test_bug_13_dedupe_ack_after_the_lease_expired_raises_lease_lost(make_queue):
    import asyncio

    import bucketq

    options = {"lease": 1.0, "state_flush_period": 0.3, "dedupe": True, "change_streams": False, "drain_timeout": 0}
    a = make_queue(bucket_max_wait=0.005, **options)
    c = make_queue(**options)
    await a.push("m", key="k-m")
    first = await a.reserve(timeout=5)
    a._consumer._flushing._loop.cancel()  # A hangs (a pause, a partition, a server restart): its lease is not extended
    await asyncio.sleep(1.3)
    second = await c.reserve(timeout=5)  # C claims the expired bucket; "k-m" is not in the inbox yet
    assert second is not None and second.payload == "m"
    with pytest.raises(bucketq.LeaseLost):
        await first.ack()  # today: returns normally, and then C's ack does too: handled twice, both "done"


async def test_bug_15_no_message_is_served_from_a_bucket_whose_extension_was_not_applied(make_queue):
    import asyncio

    options = {"lease": 1.0, "state_flush_period": 0.1, "change_streams": False, "drain_timeout": 0}
    a = make_queue(bucket_max_wait=0.005, **options)
    c = make_queue(**options)
    await a.push_many(list(range(10)))
    assert await a.reserve(timeout=5) is not None
    store = a._store
    update_fenced = store.update_fenced
    reachable = asyncio.Event()

    async def unreachable_for_a_while(query, update):  # a server restart, a partition: the write waits
        await reachable.wait()
        return await update_fenced(query, update)

    store.update_fenced = unreachable_for_a_while
    try:
        await asyncio.sleep(1.2)  # past the lease as the server last extended it
        taken = await c.reserve(timeout=2)  # C claims the bucket: its lease ran out on the server
        assert taken is not None and taken.tries == 1
        served = await a.reserve(timeout=0)  # today: slot 1, which C will serve too
        assert served is None, f"A served {served} from a bucket C holds"
    finally:
        reachable.set()


async def test_bug_16_a_retried_insert_does_not_store_a_consumed_bucket_again(make_queue):
    import asyncio

    from pymongo.errors import AutoReconnect

    producer = make_queue(bucket_max_wait=0.005, drain_timeout=0)
    consumer = make_queue(change_streams=False, drain_timeout=0)
    store = producer._producer._store
    write_buckets = store.write_buckets
    consumed = asyncio.Event()
    calls = 0

    async def reply_lost_once(docs):
        nonlocal calls
        calls += 1
        if calls == 1:
            await write_buckets(docs)  # the insert gets through...
            raise AutoReconnect("connection closed")  # ...but its reply is lost (a cut, a server restart)
        await consumed.wait()  # the retry comes after a backoff, by when the bucket was consumed
        return await write_buckets(docs)

    store.write_buckets = reply_lost_once
    push = asyncio.ensure_future(producer.push("once"))
    message = await consumer.reserve(timeout=5)
    assert message is not None and message.payload == "once"
    await message.ack(wait=True)  # the bucket is finished: deleted
    consumed.set()
    await push
    again = await consumer.reserve(timeout=1)
    assert again is None, f"delivered twice: {again}"
