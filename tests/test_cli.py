"""The ``bucketq`` console script, driven as a subprocess against the test server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bson import ObjectId
from click.testing import CliRunner

from bucketq import Queue
from bucketq.cli import cli
from bucketq.cli.params import parse_duration
from bucketq.core import claims
from bucketq.core.stats import STATS_KEYS
from tests.cli_runner import BQ, REPO, Run, cli_env, jsonl, ok, one_line_error
from tests.entrypoints import cli_handlers
from tests.helpers import step_local_clock, utc_now

PASSWORD = "pa55-not-to-be-shown"


def on_terminal(bq_argv: list[str], answer: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run with stdin on a pseudo-terminal that answers ``answer`` to a prompt."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(bq_argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=REPO)
        os.write(master, answer.encode())
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    return subprocess.CompletedProcess(bq_argv, proc.returncode, out, err)


def stats(bq: Run, queue: str) -> dict:
    return json.loads(ok(bq("stats", queue, "--json")).stdout)


# -- help ------------------------------------------------------------------------------------------------------

COMMANDS = [["stats"], ["peek"], ["push"], ["drain"], ["worker"], ["dead", "list"], ["dead", "requeue"],
            ["dead", "purge"], ["quarantine", "list"], ["quarantine", "requeue"], ["quarantine", "purge"],
            ["pause"], ["resume"], ["remove"], ["cancel"], ["purge"]]


def test_help_lists_every_command_and_tells_how_to_use_it() -> None:
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0
    for name in ("stats", "peek", "push", "drain", "worker", "dead", "quarantine", "pause", "resume", "remove",
                 "cancel", "purge"):
        assert name in top.output
    for command in COMMANDS:
        result = runner.invoke(cli, [*command, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage: " in result.output and "--uri" in result.output and "--db" in result.output
        assert "BUCKETQ_MONGODB_URI" in result.output


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "bucketq"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Commands:" in result.stdout


def test_durations() -> None:
    assert parse_duration("90") == 90 and parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("1.5s") == 1.5 and parse_duration("2d") == 172800
    with pytest.raises(ValueError):
        parse_duration("soon")


# -- push, stats, peek, drain ----------------------------------------------------------------------------------

def test_push_stdin_then_stats_peek_and_drain(bq: Run, sync_db) -> None:
    pushed = ok(bq("push", "events", input='{"n": 1}\n{"n": 2}\n\n[3, "x"]\n'))
    assert "pushed 3 message(s) to 'events'" in pushed.stdout

    row = stats(bq, "events")
    assert list(row) == [*STATS_KEYS, "pending", "cancelled", "groups", "not_buckets", "rate_limit"]
    assert row["ready"] == 3 and row["scheduled"] == row["in_flight"] == row["dead"] == 0 and row["buckets"] == 1

    table = ok(bq("stats", "events")).stdout
    assert "events" in table and "ready" in table and "in flight" in table and "quarantined" in table

    peeked = jsonl(ok(bq("peek", "events", "--json")).stdout)
    assert [p["payload"] for p in peeked] == [{"n": 1}, {"n": 2}, [3, "x"]]
    assert all(p["tries"] == 0 and p["id"] for p in peeked)
    assert [p["payload"] for p in jsonl(ok(bq("peek", "events", "-n", "2", "--json")).stdout)] == [{"n": 1}, {"n": 2}]
    assert '{"n":2}' in ok(bq("peek", "events")).stdout
    assert stats(bq, "events")["ready"] == 3  # peek claims nothing

    drained = ok(bq("drain", "events", "--idle-timeout", "0.5"))
    assert jsonl(drained.stdout) == [{"n": 1}, {"n": 2}, [3, "x"]]
    assert "drained 3 message(s)" in drained.stderr
    row = stats(bq, "events")
    assert row["ready"] == row["in_flight"] == row["scheduled"] == 0
    assert jsonl(ok(bq("peek", "events", "--json")).stdout) == []
    assert sync_db["events"].count_documents({"fin": {"$exists": False}}) == 0  # finished: only tombstones left


def test_push_arguments_with_delay_are_scheduled(bq: Run) -> None:
    assert "pushed 2 message(s)" in ok(bq("push", "later", '{"a": 1}', '"text"', "--delay", "1h")).stdout
    row = stats(bq, "later")
    assert row["scheduled"] == 2 and row["ready"] == 0
    assert ok(bq("drain", "later", "--idle-timeout", "0.3")).stdout == ""  # nothing is due yet


def test_drain_limit_meta_and_discard(bq: Run) -> None:
    ok(bq("push", "jobs", input="".join(f'{{"i": {i}}}\n' for i in range(5))))
    first = jsonl(ok(bq("drain", "jobs", "--limit", "2", "--meta")).stdout)
    assert [m["payload"] for m in first] == [{"i": 0}, {"i": 1}]
    assert {"id", "tries", "enqueued_at", "headers", "key", "payload"} <= set(first[0])
    assert stats(bq, "jobs")["ready"] == 3
    rest = ok(bq("drain", "jobs", "--discard", "--idle-timeout", "0.3"))
    assert rest.stdout == "" and "discarded 3 message(s)" in rest.stderr
    assert stats(bq, "jobs")["ready"] == 0


def test_stats_of_every_queue(bq: Run, sync_db) -> None:
    ok(bq("push", "alpha", "1", "2"))
    ok(bq("push", "beta", "3"))
    sync_db["system.views"]  # never a queue, nor are alpha.dead/.quarantine/.inbox (created by the pushes)
    every = json.loads(ok(bq("stats", "--json")).stdout)
    assert set(every) == {"alpha", "beta"}
    assert every["alpha"]["ready"] == 2 and every["beta"]["ready"] == 1
    assert list(every["beta"]) == [*STATS_KEYS, "pending", "cancelled", "groups", "not_buckets", "rate_limit"]
    table = ok(bq("stats")).stdout
    assert "alpha" in table and "beta" in table and "alpha.dead" not in table


def test_stats_watch_refreshes_until_sigterm(mongo_uri: str, db_name: str, bq: Run) -> None:
    ok(bq("push", "events", "1"))
    proc = subprocess.Popen([*BQ, "stats", "events", "--watch", "--json", "--interval", "0.2", "--db", db_name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(mongo_uri), cwd=REPO)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err
    assert [json.loads(line)["ready"] for line in lines] == [1, 1]


# -- read commands write nothing ------------------------------------------------------------------------------

def _bucket(payloads: list[str], *, done: list[int] | None = None, age_s: float = 0.0) -> dict:
    """A due bucket as any producer writes it (docs/FORMAT.md), without going through a ``Queue``."""
    now = utc_now()
    return {"_id": ObjectId(), "v": 1, "enc": "json", "created": now - dt.timedelta(seconds=age_s), "due": now,
            "n": len(payloads), "p": payloads, "done": done or [], "c": 0, "lease": None}


def _layout(db) -> dict[str, dict]:
    """Every collection of the database with its indexes."""
    return {name: db[name].index_information() for name in sorted(db.list_collection_names())}


async def test_read_commands_and_methods_write_nothing(bq: Run, sync_db, adb) -> None:
    # A queue written by another client, so far without indexes or dead-letter collection: a bucket with one of
    # its two messages done, and a tombstone (a finished bucket), beside an application's own collections.
    sync_db["events"].insert_many([_bucket(['{"n": 1}', '{"n": 2}'], done=[0], age_s=5),
                                   {"_id": ObjectId(),
                                    **claims.finish(utc_now(), "a-token", 0)}])
    sync_db["users"].insert_one({"name": "ann"})
    sync_db["users"].create_index("name")
    sync_db.create_collection("empty")
    before = _layout(sync_db)

    every = json.loads(ok(bq("stats", "--json")).stdout)
    assert list(every) == ["events"]  # neither users nor empty is taken for a queue
    assert every["events"]["ready"] == 1 and every["events"]["buckets"] == 1  # the tombstone is not counted
    assert "users" not in ok(bq("stats")).stdout
    assert stats(bq, "events")["ready"] == 1
    assert [p["payload"] for p in jsonl(ok(bq("peek", "events", "--json")).stdout)] == [{"n": 2}]
    assert "no dead letters match" in ok(bq("dead", "list", "events")).stdout
    assert "no quarantined entries match" in ok(bq("quarantine", "list", "events")).stdout
    for command in (["stats", "users"], ["peek", "users"], ["drain", "users"], ["dead", "list", "empty"]):
        one_line_error(bq(*command), "unknown queue", "holds no buckets; queues: events")

    queue = Queue(adb, name="events")
    assert (await queue.stats())["ready"] == 1
    assert [p["payload"] for p in await queue.peek()] == [{"n": 2}]
    assert await queue.dead_letters() == [] and await queue.quarantined() == []
    await queue.close()
    ghost = Queue(adb, name="ghost")
    assert (await ghost.stats())["buckets"] == 0 and await ghost.peek() == []
    await ghost.close()

    assert _layout(sync_db) == before  # no collection, no index was made


# -- expected errors: one line, non-zero exit, no traceback ----------------------------------------------------

def test_bad_json_on_stdin_stops_at_the_line(bq: Run) -> None:
    message = one_line_error(bq("push", "events", input='{"ok": 1}\n{"ok": 2}\n{broken\n{"ok": 4}\n'),
                             "line 3, column 2: invalid JSON (unexpected character")
    assert "line 1" not in message  # one line number: the input's, not orjson's count within the line
    assert "2 message(s) before it were pushed" in message
    assert stats(bq, "events")["ready"] == 2


def test_bad_json_argument_pushes_nothing(bq: Run, sync_db) -> None:
    one_line_error(bq("push", "events", '{"ok": 1}', "{nope"), "argument 2, column 2: invalid JSON",
                   "nothing was pushed")
    one_line_error(bq("push", "events", '{"ok":\n x}'), "argument 1, line 2 column 2: invalid JSON")
    assert "events" not in sync_db.list_collection_names()


@pytest.mark.parametrize("command, uri, fragment", [
    ("stats", "notmongo://localhost", "invalid MongoDB URI"),
    ("push", "mongodb://127.0.0.1:badport", "invalid MongoDB URI"),
    ("peek", "mongodb://127.0.0.1:1/?connectTimeoutMS=300", "cannot reach MongoDB"),
    # not taken for a host name; an unknown option is an error, not pymongo's raw warning (its reason is pymongo's
    # wording, which differs between releases)
    ("stats", "notamongouri", "invalid MongoDB URI notamongouri: it must begin with mongodb:// or mongodb+srv://"),
    ("stats", "mongodb://127.0.0.1:1/?bogusOption=1", "invalid MongoDB URI mongodb://127.0.0.1:1/?bogusOption=1: "),
])
def test_bad_uri_fails_fast(bq: Run, command: str, uri: str, fragment: str) -> None:
    started = time.monotonic()
    result = bq(command, "events", "--connect-timeout", "0.5", uri=uri)
    one_line_error(result, fragment)
    assert result.returncode == (1 if fragment == "cannot reach MongoDB" else 2)  # an invalid URI is bad usage
    assert time.monotonic() - started < 10


def test_missing_uri_says_how_to_give_one(bq: Run) -> None:
    one_line_error(bq("stats", uri=None), "--uri", "BUCKETQ_MONGODB_URI")


def test_uri_option_and_db_option(mongo_uri: str, db_name: str, bq: Run) -> None:
    ok(bq("push", "events", "1", "--uri", mongo_uri, uri=None))
    assert stats(bq, "events")["ready"] == 1


def _with_password(mongo_uri: str) -> dict[str, str]:
    """URIs carrying ``PASSWORD``: unreachable, invalid, valid (the test server then refuses the login), and two
    whose password holds an unescaped '/' (pymongo's own message once echoed a piece of it)."""
    host = mongo_uri.split("://", 1)[1].split("/", 1)[0].split("@")[-1]
    slashed = PASSWORD.replace("-", "/", 1)
    return {"unreachable": f"mongodb://user:{PASSWORD}@127.0.0.1:1/db?connectTimeoutMS=300",
            "invalid": f"mongodb://user:{PASSWORD}@127.0.0.1:badport/db",
            "valid": f"mongodb://user:{PASSWORD}@{host}/db",
            "slash": f"mongodb://user:{slashed}@127.0.0.1:57321/shop",
            "slash-several-hosts": f"mongodb://user:{slashed}@h1:1,h2:2/shop"}


@pytest.mark.parametrize("kind", ["unreachable", "invalid", "valid", "slash", "slash-several-hosts"])
def test_no_output_shows_a_password(bq: Run, mongo_uri: str, kind: str) -> None:
    uri = _with_password(mongo_uri)[kind]
    pieces = PASSWORD.split("-", 1)  # what a password cut at its '/' would leave
    worker = ["worker", "tests.entrypoints.cli_handlers:record", "--queue", "events", "--log-level", "debug"]
    for command, via_env in ((["stats"], True), (["stats"], False), (["peek", "events"], False),
                             (["push", "events", "1"], False), (worker, True), (["dead", "list", "events"], True)):
        args = [*command, "--connect-timeout", "0.5", *([] if via_env else ["--uri", uri])]
        result = bq(*args, uri=uri if via_env else None)
        expected = 1 if kind in ("unreachable", "valid") else 2  # an invalid URI is bad usage
        assert result.returncode == expected and "Traceback" not in result.stderr, result.stderr
        for secret in (PASSWORD, *pieces):  # the worker's debug log lines included
            assert secret not in result.stdout + result.stderr, result.stderr
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("Error: "), result.stderr
        if kind != "valid":  # the message names the URI it could not use, without the credentials
            assert "mongodb://***@" in error
    # A URI typed where a queue name or a command goes is echoed back in the error, redacted.
    if kind == "valid":
        assert PASSWORD not in one_line_error(bq("peek", uri), "unknown queue 'mongodb://***@")
    typo = bq(uri)
    assert typo.returncode == 2 and "No such command 'mongodb://***@" in typo.stderr
    assert PASSWORD not in typo.stdout + typo.stderr


def test_a_bug_traceback_shows_no_password(monkeypatch: pytest.MonkeyPatch, mongo_uri: str, db_name: str,
                                          sync_db) -> None:
    sync_db["events"].insert_one(_bucket(["1"]))

    async def broken_peek(self: Queue, n: int = 10) -> list:
        raise RuntimeError(f"a bug, with mongodb://user:{PASSWORD}@example.invalid/db in its message")

    monkeypatch.setattr(Queue, "peek", broken_peek)
    result = CliRunner().invoke(cli, ["peek", "events", "--uri", mongo_uri, "--db", db_name])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "RuntimeError: a bug, with mongodb://***@example.invalid/db" \
        in result.stderr
    assert PASSWORD not in result.output + result.stderr


def test_unknown_queue_is_an_error_and_creates_nothing(bq: Run, sync_db) -> None:
    sync_db["real"].insert_one(_bucket(["1"]))
    sync_db.create_collection("unrelated")
    for command in (["stats", "ghost"], ["peek", "ghost"], ["drain", "ghost"], ["dead", "list", "ghost"],
                    ["dead", "purge", "ghost", "--yes"], ["quarantine", "requeue", "ghost", "--yes"]):
        one_line_error(bq(*command), "unknown queue 'ghost'", "(queues: real)")
    assert sorted(sync_db.list_collection_names()) == ["real", "unrelated"]


def test_bad_options_are_usage_errors(bq: Run) -> None:
    result = bq("dead", "purge", "events", "--older-than", "soon")
    assert result.returncode == 2 and "not a duration" in result.stderr and "Traceback" not in result.stderr


WORK = ["worker", "tests.entrypoints.cli_hooks:fail_marked", "-q", "tasks"]


@pytest.mark.parametrize("args, fragment", [
    ([*WORK, "--concurrency", "0"], "0 is not in the range 1<=x<=1024"),  # checked by click
    ([*WORK, "--lease", "-1"], "InvalidOption: lease must be between 1"),  # checked by QueueOptions
    ([*WORK, "--max-attempts", "0"], "InvalidOption: max_attempts must be at least 1"),
    ([*WORK, "--batch-size", "200000"], "InvalidOption: batch_size must be"),  # checked by Worker, once connected
    (["worker", "tests.entrypoints.cli_handlers:record", "-q", "tasks", "--threads", "2"],
     "InvalidOption: threads is for a sync handler"),
    (["worker", "tests.entrypoints.cli_handlers", "-q", "tasks"], "must look like MODULE:HANDLER"),
    (["remove", "events", "notanid"], "malformed message id(s) 'notanid'"),
], ids=["click", "lease", "max-attempts", "batch-size", "threads-async", "handler-spec", "message-id"])
def test_bad_usage_exits_with_2_whichever_check_finds_it(bq: Run, args: list[str], fragment: str) -> None:
    exits_as_bad_usage(bq(*args), fragment)


def test_no_uri_and_invalid_json_are_bad_usage(bq: Run, sync_db) -> None:
    exits_as_bad_usage(bq("stats", uri=None), "no MongoDB URI: pass --uri or set BUCKETQ_MONGODB_URI")
    exits_as_bad_usage(bq("push", "events", "{nope"), "argument 1, column 2: invalid JSON")
    exits_as_bad_usage(bq("push", "events", input='{"ok": 1}\n{nope\n'), "line 2, column 2: invalid JSON")
    assert sync_db["events"].count_documents({}) == 1  # the line before the bad one was pushed, as it says


def exits_as_bad_usage(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2 and fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_failures_at_run_time_exit_with_1(bq: Run) -> None:
    ok(bq("push", "events", "1"))
    for args in (["peek", "ghost"], ["purge", "events"], ["stats", "--connect-timeout", "0.3"]):
        uri = "mongodb://127.0.0.1:1/db" if args[0] == "stats" else None
        result = bq(*args, **({"uri": uri} if uri else {}))
        assert result.returncode == 1 and result.stderr.startswith("Error: "), result.stderr


# -- dead letters and quarantine --------------------------------------------------------------------------------

async def _make_dead_letters(adb, errors: list[str]) -> None:
    queue = Queue(adb, name="events", max_attempts=1)
    await queue.push_many([{"n": i} for i in range(len(errors))])
    await queue.flush()
    for error in errors:
        message = await queue.reserve(timeout=5)
        assert message is not None
        await message.nack(error=error)
    await queue.close()


async def test_dead_list_requeue_purge(bq: Run, adb, sync_db, mongo_uri: str, db_name: str) -> None:
    await _make_dead_letters(adb, ["TimeoutError: upstream timeout", "KeyError: 'user'", "KeyError: 'id'"])
    sync_db["events.dead"].insert_one({  # an old one, in the dead-letter format (core/format.py dead_letter)
        "_id": f"{ObjectId()}:0", "enc": "json", "p": '{"old": true}', "h": None, "k": None, "tries": 5,
        "error": "ValueError: ancient", "at": utc_now() - dt.timedelta(days=3),
        "enqueued_at": utc_now() - dt.timedelta(days=3), "origin": {}})

    listed = jsonl(ok(bq("dead", "list", "events", "--json")).stdout)
    assert listed[0]["payload"] == {"old": True}  # oldest first
    assert {d["error"] for d in listed[1:]} == {"TimeoutError: upstream timeout", "KeyError: 'user'", "KeyError: 'id'"}
    assert [d["payload"] for d in jsonl(ok(bq("dead", "list", "events", "--json", "--error", "keyerror")).stdout)] \
        == [{"n": 1}, {"n": 2}]
    assert [d["payload"] for d in jsonl(ok(bq("dead", "list", "events", "--json", "--older-than", "1d")).stdout)] \
        == [{"old": True}]
    assert "KeyError: 'id'" in ok(bq("dead", "list", "events")).stdout

    requeued = ok(bq("dead", "requeue", "events", "--error", "timeout", "--yes"))
    assert "requeued 1 dead letter of queue 'events'" in requeued.stdout
    row = stats(bq, "events")
    assert row["ready"] == 1 and row["dead"] == 3
    assert jsonl(ok(bq("drain", "events", "--idle-timeout", "0.3")).stdout) == [{"n": 0}]

    one_line_error(bq("dead", "purge", "events"), "not confirmed", "--yes")  # no terminal to ask on
    one_line_error(bq("dead", "purge", "events", input="y\n"), "not confirmed", "--yes")
    purge = [*BQ, "dead", "purge", "events", "--db", db_name]
    declined = on_terminal(purge, "n\n", cli_env(mongo_uri))
    assert "Purge 3 dead letters of queue 'events'? [y/N]" in declined.stderr
    assert declined.returncode == 1 and "Error: cancelled; nothing purged" in declined.stderr
    assert sync_db["events.dead"].count_documents({}) == 3
    assert "purged 1 dead letter" in ok(on_terminal([*purge, "--older-than", "1d"], "y\n", cli_env(mongo_uri))).stdout
    one_id = listed[2]["id"]
    assert "purged 1 dead letter" in ok(bq("dead", "purge", "events", "--id", one_id, "--yes")).stdout
    assert "purged 1 dead letter" in ok(bq("dead", "purge", "events", "--yes")).stdout
    assert "no dead letters match" in ok(bq("dead", "list", "events")).stdout
    assert "nothing purged" in ok(bq("dead", "purge", "events", "--yes")).stdout


async def test_quarantine_list_requeue_purge(bq: Run, adb, sync_db) -> None:
    now = utc_now()
    bad = [ObjectId(), ObjectId()]
    sync_db["events"].insert_many([{"_id": b, "v": 1, "enc": "json", "created": now, "due": now, "n": 1,
                                    "p": ["{not json"], "done": [], "c": 0, "lease": None} for b in bad])
    queue = Queue(adb, name="events")
    assert await queue.reserve(timeout=1) is None  # both buckets go to quarantine
    await queue.close()

    listed = jsonl(ok(bq("quarantine", "list", "events", "--json")).stdout)
    assert {q["id"] for q in listed} == {str(b) for b in bad}
    assert all(q["kind"] == "bucket" and "undecodable" in q["reason"] and q["messages"] == 1 for q in listed)
    assert "whole bucket" in ok(bq("quarantine", "list", "events")).stdout

    requeued = ok(bq("quarantine", "requeue", "events", "--id", str(bad[0]), "--yes"))
    assert "requeued 1 quarantined entry" in requeued.stdout
    assert sync_db["events"].find_one({"_id": bad[0]}) is not None
    assert stats(bq, "events")["quarantined"] == 1
    assert "purged 1 quarantined entry" in ok(bq("quarantine", "purge", "events", "--error", "undecodable",
                                                   "--yes")).stdout
    assert stats(bq, "events")["quarantined"] == 0


# -- worker -----------------------------------------------------------------------------------------------------

def test_worker_handles_messages_and_stops_on_sigterm(mongo_uri: str, db_name: str, bq: Run, tmp_path: Path) -> None:
    ok(bq("push", "tasks", input="".join(f'{{"task": {i}}}\n' for i in range(6))))
    out = tmp_path / "handled.jsonl"
    env = {**cli_env(mongo_uri), "BUCKETQ_TEST_OUT": str(out)}
    proc, err = _work_until([*BQ, "worker", "tests.entrypoints.cli_handlers:record", "--queue", "tasks",
                             "--concurrency", "2", "--db", db_name], env,
                            lambda: out.exists() and len(out.read_text().splitlines()) >= 6)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "worker started" in err and "worker stopped" in err
    assert "handled a message for mongodb://***@db.example/app" in err and cli_handlers.PASSWORD not in err
    assert sorted(json.loads(line)["task"] for line in out.read_text().splitlines()) == list(range(6))
    row = stats(bq, "tasks")
    assert row["ready"] == row["in_flight"] == row["dead"] == 0


def test_worker_runs_a_sync_handler_on_its_threads(mongo_uri: str, db_name: str, bq: Run, tmp_path: Path) -> None:
    ok(bq("push", "tasks", input="".join(f'{{"task": {i}}}\n' for i in range(6))))
    out = tmp_path / "handled.jsonl"
    env = {**cli_env(mongo_uri), "BUCKETQ_TEST_OUT": str(out)}
    proc, err = _work_until([*BQ, "worker", "tests.entrypoints.cli_handlers:record_sync", "--queue", "tasks",
                             "--concurrency", "2", "--db", db_name], env,
                            lambda: out.exists() and len(out.read_text().splitlines()) >= 6)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "a sync handler on 2 threads" in err and "worker stopped" in err
    handled = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(h["task"] for h in handled) == list(range(6))
    assert {h["thread"] for h in handled} <= {"bucketq-handler-0", "bucketq-handler-1"}
    row = stats(bq, "tasks")
    assert row["ready"] == row["in_flight"] == row["dead"] == 0


def _work_until(argv: list[str], env: dict[str, str], done: Callable[[], bool]) -> tuple[subprocess.Popen, str]:
    """Run a worker command until ``done()`` (within 30 s), then stop it with SIGTERM: the process and its stderr."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and not done():
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc, err


@pytest.mark.parametrize("handler, fragment", [
    ("tests.entrypoints.cli_handlers", "MODULE:HANDLER"),
    ("tests.no_such_module:fn", "cannot import module 'tests.no_such_module'"),
    ("tests.entrypoints.cli_handlers:missing", "has no attribute 'missing'"),
    ("tests.entrypoints.cli_handlers:NOT_A_FUNCTION", "not a function"),
])
def test_worker_bad_handler(bq: Run, handler: str, fragment: str) -> None:
    one_line_error(bq("worker", handler, "--queue", "tasks"), fragment)


# -- operator controls: pause, resume, remove, purge -------------------------------------------------------------

def test_pause_and_resume_commands(bq: Run, sync_db) -> None:
    ok(bq("push", "events", "1"))
    assert "paused queue 'events': consumers stop claiming within 1s" in ok(bq("pause", "events")).stdout
    assert sync_db["events.control"].find_one({"_id": "pause"})["paused"] is True
    assert "events (paused)" in ok(bq("stats")).stdout
    assert "was already paused" in ok(bq("pause", "events")).stdout
    drained = ok(bq("drain", "events", "--idle-timeout", "0.5"))
    assert drained.stdout == "" and "queue 'events' is paused" in drained.stderr  # nothing claimed while paused
    assert "resumed queue 'events'" in ok(bq("resume", "events")).stdout
    assert "(paused)" not in ok(bq("stats")).stdout
    assert jsonl(ok(bq("drain", "events", "--idle-timeout", "1")).stdout) == [1]
    one_line_error(bq("pause", "ghost"), "unknown queue 'ghost'")


def test_remove_command(bq: Run) -> None:
    ok(bq("push", "events", input='{"n": 1}\n{"n": 2}\n{"n": 3}\n'))
    ids = [p["id"] for p in jsonl(ok(bq("peek", "events", "--json")).stdout)]
    assert ok(bq("remove", "events", ids[0], ids[2])).stdout.splitlines() == [f"removed {ids[0]}", f"removed {ids[2]}"]
    partly = bq("remove", "events", ids[1], ids[0])  # the second was removed already
    assert f"no pending message '{ids[0]}'" in one_line_error(partly, "1 of 2 message(s) not removed")
    assert partly.stdout == f"removed {ids[1]}\n"
    assert stats(bq, "events")["ready"] == 0
    result = bq("remove", "events")
    assert result.returncode == 2 and "Missing argument 'ID...'" in result.stderr


def test_cancel_command(bq: Run, sync_db) -> None:
    ok(bq("push", "events", input='{"n": 1}\n{"n": 2}\n'))
    ids = [p["id"] for p in jsonl(ok(bq("peek", "events", "--json")).stdout)]
    assert ok(bq("cancel", "events", ids[0])).stdout == f"cancelled {ids[0]}\n"
    assert sync_db["events.dead"].find_one({"_id": ids[0]})["cancelled"] is True
    partly = bq("cancel", "events", ids[0], "6b0340a5e418eb7f18364742:3")  # again: still cancelled; unknown
    assert partly.stdout == f"cancelled {ids[0]}\nnot_found 6b0340a5e418eb7f18364742:3\n"
    one_line_error(partly, "1 of 2 message(s) not found pending in queue 'events'")
    malformed = bq("cancel", "events", ids[1], "notanid")
    assert malformed.returncode == 2 and "nothing cancelled" in malformed.stderr
    assert stats(bq, "events")["ready"] == 1 and stats(bq, "events")["cancelled"] == 1


def test_remove_command_reports_a_malformed_id_and_removes_nothing(bq: Run) -> None:
    ok(bq("push", "events", "1"))
    (good,) = [p["id"] for p in jsonl(ok(bq("peek", "events", "--json")).stdout)]
    for bad in ("notanid", f"{good}x", good.split(":")[0], good.replace(":", "-")):
        result = bq("remove", "events", good, bad)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert f"malformed message id(s) {bad!r}: an id looks like " in result.stderr, result.stderr
        assert "no pending message" not in result.stderr and "nothing removed" in result.stderr
    assert stats(bq, "events")["ready"] == 1


def test_remove_command_refuses_a_held_message(bq: Run, mongo_uri: str, db_name: str, sync_db) -> None:
    sync_db["events"].insert_one({**_bucket(["1"]), "due": utc_now() + dt.timedelta(minutes=5),
                                  "lease": {"token": "t", "owner": "worker-7:42", "until": dt.datetime.now()}})
    bucket_id = sync_db["events"].find_one()["_id"]
    one_line_error(bq("remove", "events", f"{bucket_id}:0"), "not removed", "worker-7:42 holds until")


def test_purge_command_asks_unless_yes(bq: Run, mongo_uri: str, db_name: str, sync_db) -> None:
    ok(bq("push", "events", "1", "2", "3"))
    ok(bq("push", "events", "4", "--delay", "1h"))
    one_line_error(bq("purge", "events"), "not confirmed", "--yes")
    declined = on_terminal([*BQ, "purge", "events", "--db", db_name], "n\n", cli_env(mongo_uri))
    assert "Purge 4 message(s) (3 ready, 1 scheduled, 0 in flight) of queue 'events'? [y/N]" in declined.stderr
    assert declined.returncode == 1 and "cancelled; nothing purged" in declined.stderr
    assert "purged 4 message(s) of queue 'events'" in ok(bq("purge", "events", "--yes")).stdout
    row = stats(bq, "events")
    assert row["ready"] == row["scheduled"] == row["buckets"] == 0
    assert "has no messages; nothing purged" in ok(bq("purge", "events", "--yes")).stdout


# -- worker: queue options and hooks ---------------------------------------------------------------------------------

def test_worker_options_are_generated_from_queue_options() -> None:
    import dataclasses

    from bucketq.cli.worker import worker
    from bucketq.options import QueueOptions

    options = {p.name: p for p in worker.params}
    for field in dataclasses.fields(QueueOptions):
        option = options.get(field.name)
        assert option is not None, f"--{field.name.replace('_', '-')} is missing from bucketq worker"
        assert option.help and option.help.endswith("]") and "[default: " in option.help and len(option.help) > 30
    help_text = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output
    assert "--dedupe / --no-dedupe" in help_text and "--malformed [quarantine|skip]" in help_text
    assert "--lease NUMBER" in help_text and "--max-attempts INTEGER" in help_text


def test_worker_help_gives_each_option_its_own_text_and_its_default_as_typed() -> None:
    import dataclasses

    from bucketq.cli.worker import worker
    from bucketq.options import QueueOptions

    options = {p.name: p for p in worker.params}
    texts = [options[f.name].help.rsplit(" [default: ", 1)[0] for f in dataclasses.fields(QueueOptions)]
    shared = {text for text in texts if texts.count(text) > 1}
    assert not shared, shared  # --quarantine-retention and --inbox-retention had one text, the retry_* options another
    help_text = " ".join(CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output.split())
    assert "[default: None]" not in help_text and "[default: False]" not in help_text
    assert "--dedupe / --no-dedupe skip messages" in help_text and "[default: --no-dedupe]" in help_text
    assert "--change-streams / --no-change-streams" in help_text and "[default: neither flag (None)]" in help_text
    assert "--write-concern 1..50|majority|TAG|none" in help_text  # not INTEGER|NONE: "majority" and tags work
    assert "--inbox-retention NUMBER|NONE seconds before the dedupe keys" in help_text


def test_worker_concurrency_has_one_default_in_the_library_the_cli_and_the_docs() -> None:
    import inspect

    from bucketq.cli.worker import worker
    from bucketq.worker import Worker

    default = inspect.signature(Worker).parameters["concurrency"].default
    assert {p.name: p for p in worker.params}["concurrency"].default == default
    assert f"`bucketq.Worker(q, handler, concurrency={default}, " in (REPO / "docs" / "guide" / "worker.md").read_text()
    help_text = " ".join(CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output.split())
    assert f"[default: {default}; 1<=x<=1024]" in help_text


@pytest.mark.parametrize("args, fragment", [
    (["--lease", "0.5"], "InvalidOption: lease must be between 1 and 86400 seconds"),
    (["--bucket-max-size", "0"], "InvalidOption: bucket_max_size must be between 1"),
    (["--inbox-retention", "-1"], "InvalidOption: inbox_retention must be None (keep forever) or positive"),
])
def test_worker_refuses_bad_queue_options_before_connecting(bq: Run, args: list[str], fragment: str) -> None:
    unreachable = "mongodb://127.0.0.1:1/db?connectTimeoutMS=300"
    result = bq("worker", "tests.entrypoints.cli_hooks:fail_marked", "-q", "tasks", *args, uri=unreachable)
    one_line_error(result, fragment)
    assert result.returncode == 2  # bad usage


@pytest.mark.parametrize("args, fragment", [
    (["--max-attempts", "many"], "'many' is not an integer"),
    (["--lease", "soon"], "'soon' is not a number"),
    (["--malformed", "drop"], "'drop' is not one of 'quarantine', 'skip'"),
])
def test_worker_queue_option_types_are_usage_errors(bq: Run, args: list[str], fragment: str) -> None:
    result = bq("worker", "tests.entrypoints.cli_hooks:fail_marked", "-q", "tasks", *args)
    assert result.returncode == 2 and fragment in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("hook, fragment", [
    (["--on-error", "tests.entrypoints.cli_hooks"],
     "on-error 'tests.entrypoints.cli_hooks' must look like MODULE:FUNCTION"),
    (["--after-batch", "tests.entrypoints.cli_hooks:nope"], "has no attribute 'nope' (the after-batch)"),
    (["--on-error", "tests.missing_module:f"], "cannot import module 'tests.missing_module' for the on-error"),
])
def test_worker_bad_hooks(bq: Run, hook: list[str], fragment: str) -> None:
    one_line_error(bq("worker", "tests.entrypoints.cli_hooks:fail_marked", "-q", "tasks", *hook), fragment)


def test_worker_takes_queue_options_and_hooks(mongo_uri: str, db_name: str, bq: Run, tmp_path: Path) -> None:
    ok(bq("push", "tasks", input='{"n": 1}\n{"n": 2, "fail": true}\n{"n": 3}\n'))
    out = tmp_path / "out.jsonl"
    env = {**cli_env(mongo_uri), "BUCKETQ_TEST_OUT": str(out)}
    argv = [*BQ, "worker", "tests.entrypoints.cli_hooks:fail_marked", "--queue", "tasks", "--db", db_name,
            "--max-attempts", "1", "--lease", "20", "--inbox-retention", "none",
            "--on-error", "tests.entrypoints.cli_hooks:on_error", "--after-batch",
            "tests.entrypoints.cli_hooks:after_batch", "--log-level", "debug"]
    proc, err = _work_until(argv, env, lambda: out.exists() and out.read_text().count('"batch"') >= 3)
    assert proc.returncode == 0, err
    # The failure is logged once, with what became of the message and the handler's traceback (the only one).
    (failure,) = [line for line in err.splitlines() if "handler failed on message" in line]
    assert failure.endswith("(try 1 of 1): dead-lettered: max_attempts (1) reached") and " WARNING " in failure
    assert err.count("Traceback") == 1 and "ValueError: refusing 2" in err.split(failure, 1)[1], err
    assert " pymongo." not in err, "--log-level debug sets bucketq's loggers, not the driver's"
    records = jsonl(out.read_text())
    assert sorted(r["handled"] for r in records if "handled" in r) == [1, 3]
    assert [r for r in records if "error" in r] == [{"error": "refusing 2", "n": 2, "tries": 0}]
    assert sorted((r["batch"], r["failed"]) for r in records if "batch" in r) == [(1, 0), (1, 0), (1, 1)]
    row = stats(bq, "tasks")
    assert row["dead"] == 1 and row["ready"] == row["scheduled"] == 0  # --max-attempts 1: dead at the first failure


# -- stats --watch: rates ------------------------------------------------------------------------------------------

async def test_stats_watch_shows_messages_in_and_out_per_second(mongo_uri: str, db_name: str, bq: Run) -> None:
    ok(bq("push", "events", "0"))
    proc = subprocess.Popen([*BQ, "stats", "events", "--watch", "--json", "--interval", "3", "--db", db_name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(mongo_uri), cwd=REPO)
    queue = Queue(mongo_uri, name="events", db=db_name, bucket_max_wait=0.005)
    try:
        first = json.loads(await asyncio.to_thread(proc.stdout.readline))  # type: ignore[union-attr]
        await queue.push_many(list(range(1, 31)))  # 30 in
        for _ in range(10):  # 10 out: the message pushed before, and 9 of the 30
            message = await queue.reserve(timeout=5)
            await message.ack(wait=True)
        second = json.loads(await asyncio.to_thread(proc.stdout.readline))  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        proc.kill()
        await queue.close()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert first["ready"] == 1 and first["rates"] is None  # no previous refresh to compare with
    rates = second["rates"]
    assert (rates["in"], rates["out"]) == (30, 10), second
    assert 2.5 < rates["seconds"] < 10
    assert rates["in_per_s"] == pytest.approx(30 / rates["seconds"], abs=0.1)
    assert rates["out_per_s"] == pytest.approx(10 / rates["seconds"], abs=0.1)
    assert second["ready"] + second["in_flight"] == 21


def test_stats_watch_table_has_rate_columns(mongo_uri: str, db_name: str, bq: Run) -> None:
    ok(bq("push", "events", "1"))
    proc = subprocess.Popen([*BQ, "stats", "--watch", "--interval", "0.3", "--db", db_name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**cli_env(mongo_uri), "COLUMNS": "120"}, cwd=REPO)
    try:
        rows = []
        while len(rows) < 2:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, proc.communicate()[1]
            if line.lstrip().startswith("events"):
                rows.append(line.split())
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err
    assert rows[0][-2:] == ["-", "-"] and rows[1][-2:] == ["0.0", "0.0"]  # in/s and out/s, known from the second


# -- tables at 80 columns ------------------------------------------------------------------------------------------

STATS_HEADERS = ["ready", "scheduled", "in flight", "dead", "quarantined", "buckets", "oldest"]  # and queue
LONG_NAME = "orders-of-the-northern-warehouse"


def _fits_80_columns(output: str, headers: list[str], cells: list[str]) -> None:
    """Every header and cell in full on one line (nothing cut with "…", nothing wrapped), no line over 80."""
    lines = output.splitlines()
    assert max(len(line) for line in lines) <= 80, output
    assert "…" not in output, output
    for text in [*headers, *cells]:
        assert any(text in line for line in lines), f"{text!r} is not on one line of:\n{output}"


def test_tables_fit_80_columns_or_turn_plain(mongo_uri: str, db_name: str, bq: Run, sync_db) -> None:
    """Not a terminal, 80 columns: headers are never cut and cells never wrapped, as in the README."""
    ok(bq("push", LONG_NAME, "1"))
    ok(bq("push", "events", "0"))
    now = utc_now()
    sync_db["events.dead"].insert_one({  # the dead-letter format (core/format.py dead_letter)
        "_id": f"{ObjectId()}:0", "enc": "json", "p": '{"n": 0}', "h": None, "k": None, "tries": 5, "at": now,
        "error": "TimeoutError: the upstream payment service did not answer within 30 seconds", "enqueued_at": now,
        "origin": {}})
    narrow = CliRunner(env={"COLUMNS": "80"})
    where = ["--uri", mongo_uri, "--db", db_name]

    short = narrow.invoke(cli, ["stats", "events", *where])
    assert short.exit_code == 0 and short.output.splitlines()[1].split() == \
        ["queue", "ready", "scheduled", "in", "flight", "dead", "quarantined", "buckets", "oldest"]  # a table still
    every = narrow.invoke(cli, ["stats", *where])
    assert every.exit_code == 0, every.output
    _fits_80_columns(every.output, STATS_HEADERS, [LONG_NAME, "events"])

    dead = narrow.invoke(cli, ["dead", "list", "events", *where])
    assert dead.exit_code == 0, dead.output
    letter = json.loads(ok(bq("dead", "list", "events", "--json")).stdout)
    _fits_80_columns(dead.output, ["at", "tries", "error", "payload"], [letter["id"], '{"n":0}'])
    assert "upstream payment service" in dead.output

    proc = subprocess.Popen([*BQ, "stats", "--watch", "--interval", "0.2", *where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**cli_env(None), "COLUMNS": "80"}, cwd=REPO)
    try:
        lines: list[str] = []
        while sum("out/s" in line for line in lines) < 2:  # two refreshes, the second with rates
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, proc.communicate()[1]
            lines.append(line)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    _fits_80_columns("".join(lines) + rest, [*STATS_HEADERS, "in/s", "out/s"], [LONG_NAME, "events"])


def test_push_group_stores_an_ordered_group_and_refuses_a_delay_or_a_bad_group(bq: Run, sync_db) -> None:
    assert "pushed 3 message(s)" in ok(bq("push", "orders", "--group", "order-17", "1", "2", "3")).stdout
    (doc,) = list(sync_db["orders"].find())
    assert doc["g"] == "order-17" and doc["p"] == ["1", "2", "3"]
    assert jsonl(ok(bq("drain", "orders", "--idle-timeout", "0.5")).stdout) == [1, 2, 3]
    refused = bq("push", "orders", "--group", "g", "--delay", "5", "1")
    assert refused.returncode != 0 and "--group takes no --delay" in refused.stderr
    refused = bq("push", "orders", "--group", "", "1")
    assert refused.returncode != 0 and "non-empty string" in refused.stderr


def test_push_priority_stores_the_level_and_refuses_a_bad_one_or_a_group(bq: Run, sync_db) -> None:
    assert "pushed 1 message(s)" in ok(bq("push", "alerts", "1")).stdout
    assert "pushed 2 message(s)" in ok(bq("push", "alerts", "--priority", "9", "2", "3")).stdout
    assert sorted((d["p"], d.get("pr")) for d in sync_db["alerts"].find()) == [(["1"], None), (["2", "3"], 9)]
    assert jsonl(ok(bq("drain", "alerts", "--idle-timeout", "0.5")).stdout) == [2, 3, 1]
    refused = bq("push", "alerts", "--priority", "10", "1")
    assert refused.returncode != 0 and "0<=x<=9" in refused.stderr
    refused = bq("push", "alerts", "--group", "g", "--priority", "1", "1")
    assert refused.returncode != 0 and "--group takes no --priority" in refused.stderr


def test_shard_prints_the_sharding_commands_of_a_queue_and_connects_to_nothing() -> None:
    """``bucketq shard``: the shard key's index, sh.shardCollection, one zone per range of partitions, and the
    unsharded side collections with their reasons; the database from --db, else bucketq."""
    result = CliRunner().invoke(cli, ["shard", "events", "--partitions", "4", "--shards", "2", "--db", "app"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:2] == ['db.getSiblingDB("app").getCollection("events").createIndex({pt: 1, _id: 1})',
                         'sh.shardCollection("app.events", {pt: 1, _id: 1})']
    assert [line for line in lines if line.startswith("sh.updateZoneKeyRange")] == [
        'sh.updateZoneKeyRange("app.events", {pt: MinKey, _id: MinKey}, {pt: 2, _id: MinKey}, "app.events-z0")',
        'sh.updateZoneKeyRange("app.events", {pt: 2, _id: MinKey}, {pt: MaxKey, _id: MaxKey}, "app.events-z1")']
    assert "// app.events.dead: unsharded" in result.output and "app.events.groups: unsharded" in result.output
    other = CliRunner().invoke(cli, ["shard", "events"])
    assert 'sh.shardCollection("bucketq.events", {pt: 1, _id: 1})' in other.output
    assert other.output.count("sh.updateZoneKeyRange") == 1
    bad = CliRunner().invoke(cli, ["shard", "events", "--partitions", "0"])
    assert bad.exit_code == 2 and "--partitions" in bad.output
    assert CliRunner().invoke(cli, ["shard", "bad$name"]).exit_code == 2
    assert "sh.shardCollection" in CliRunner().invoke(cli, ["shard", "--help"]).output
    stream = CliRunner().invoke(cli, ["shard", "ev", "--stream", "--partitions", "2", "--db", "app"]).output
    assert 'sh.shardCollection("app.ev", {pt: 1, s: 1})' in stream and "inbox" not in stream
    assert 'sh.updateZoneKeyRange("app.ev", {pt: 1, s: MinKey}, {pt: MaxKey, s: MaxKey}, "app.ev-z1")' in stream


def test_peek_and_dead_list_count_ages_by_the_server_clock_and_show_levels(monkeypatch: pytest.MonkeyPatch,
                                                                           mongo_uri: str, db_name: str,
                                                                           sync_db) -> None:
    due = utc_now() - dt.timedelta(hours=2, minutes=30)  # by the server's clock: the test server runs on this host
    sync_db["events"].insert_many([{**_bucket(['{"n": 1}']), "due": due, "pr": 7},
                                   {**_bucket(['{"n": 2}']), "due": due}])
    sync_db["events.dead"].insert_one({"_id": f"{ObjectId()}:0", "enc": "json", "p": '"dead"', "h": None,
                                       "k": None, "tries": 5, "error": "boom", "at": due, "enqueued_at": due,
                                       "origin": {}, "pr": 4})
    step_local_clock(monkeypatch, 3600)  # this host's wall clock, then, an hour ahead of the server's
    runner, target = CliRunner(env={"COLUMNS": "200"}), ["events", "--uri", mongo_uri, "--db", db_name]

    peeked = runner.invoke(cli, ["peek", *target])
    assert peeked.exit_code == 0, peeked.output
    assert re.findall(r"\b(\d+)h \d+m ago", peeked.output) == ["2", "2"], "an age took in the local clock's step"
    rows = re.findall(r" ago +0 +(\d) +\{\"n\":(\d)\}", peeked.output)
    assert sorted(rows) == [("0", "2"), ("7", "1")], peeked.output
    as_json = [json.loads(line) for line in runner.invoke(cli, ["peek", "--json", *target]).output.splitlines()]
    assert sorted(e["priority"] for e in as_json) == [0, 7]

    listed = runner.invoke(cli, ["dead", "list", *target])
    assert listed.exit_code == 0 and re.search(r"\b2h \d+m ago +5 +boom", listed.output), listed.output
    assert json.loads(runner.invoke(cli, ["dead", "list", "--json", *target]).output)["priority"] == 4
