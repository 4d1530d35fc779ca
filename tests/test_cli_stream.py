"""``bucketq stream list|lag|reset`` over a real connection, in a subprocess like an operator runs them."""

from __future__ import annotations

import json

from click.testing import CliRunner

import bucketq
from bucketq.cli import cli
from tests.cli_runner import Run, jsonl, ok, one_line_error


async def _seed(mongo_uri: str, db_name: str) -> None:
    async with bucketq.Stream(mongo_uri, name="events", db=db_name, poll_interval=0.01) as stream:
        await stream.push_many(["a", "b", "c"])
        async with stream.reader("audit", start="beginning") as reader:
            message = await reader.read(timeout=2)
            await message.ack()
        async with stream.reader("search", start="beginning") as reader:
            for message in await reader.read_many(3, timeout=2):
                await message.ack()


async def test_list_lag_and_reset(bq: Run, mongo_uri: str, db_name: str) -> None:
    await _seed(mongo_uri, db_name)
    groups = {g["group"]: g for g in jsonl(ok(bq("stream", "list", "events", "--json")).stdout)}
    assert groups["audit"]["position"] == "1:0"  # committed by whole buckets: "b" and "c" are not read yet
    assert groups["search"]["position"] == "2:0"
    lags = {g["group"]: g for g in jsonl(ok(bq("stream", "lag", "events", "--json")).stdout)}
    assert lags["audit"]["lag_messages"] == 2 and lags["search"]["lag_messages"] == 0
    assert lags["audit"]["lag_s"] > 0 and lags["search"]["lag_s"] == 0
    human = ok(bq("stream", "lag", "events")).stdout
    assert "audit" in human and "search" in human

    assert "reads from position 1:0" in ok(bq("stream", "reset", "events", "search", "--beginning")).stdout
    lags = {g["group"]: g for g in jsonl(ok(bq("stream", "lag", "events", "--json")).stdout)}
    assert lags["search"]["lag_messages"] == 3
    assert "position 2:0" in ok(bq("stream", "reset", "events", "search", "--end")).stdout
    assert "position 1:2" in ok(bq("stream", "reset", "events", "new", "--position", "1:2")).stdout
    assert "position 1:0" in ok(bq("stream", "reset", "events", "search", "--at", "1h")).stdout
    assert "position 2:0" in ok(bq("stream", "reset", "events", "search", "--at", "2099-01-01T00:00:00Z")).stdout
    lags = {g["group"]: g for g in jsonl(ok(bq("stream", "lag", "events", "--json")).stdout)}
    assert lags["new"]["lag_messages"] == 1 and json.dumps(lags)


def test_errors_are_one_line(bq: Run) -> None:
    one_line_error(bq("stream", "lag", "nothing"), "unknown stream 'nothing'")
    for args in ([], ["--beginning", "--end"], ["--position", "x:y"], ["--at", "yesterday"],
                 ["--at", "2026-01-01T00:00:00"]):
        result = bq("stream", "reset", "events", "g", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_help() -> None:
    runner = CliRunner()
    assert "stream" in runner.invoke(cli, ["--help"]).output
    for command in ("list", "lag", "reset"):
        result = runner.invoke(cli, ["stream", command, "--help"])
        assert result.exit_code == 0 and "--uri" in result.output and "BUCKETQ_MONGODB_URI" in result.output


async def test_a_partitioned_stream_shows_and_takes_positions_by_partition(bq: Run, mongo_uri: str,
                                                                          db_name: str) -> None:
    async with bucketq.Stream(mongo_uri, name="parts", db=db_name, partitions=2) as stream:
        await stream.ready()  # opened: the stream's partitions known
        stream.store._next_part = 0
        await stream.push_many(["a", "b"])  # partition 0
        await stream.push("c")  # partition 1
        await stream.reset("audit", "beginning")
    groups = {g["group"]: g for g in jsonl(ok(bq("stream", "list", "parts", "--json")).stdout)}
    assert groups["audit"]["position"] == "1:0 1/1:0"
    assert "last sequence 1 1" in ok(bq("stream", "lag", "parts")).stdout
    moved = ok(bq("stream", "reset", "parts", "audit", "--position", "1/2:0")).stdout
    assert "now reads from position 1:0 1/2:0" in moved
    lags = {g["group"]: g for g in jsonl(ok(bq("stream", "lag", "parts", "--json")).stdout)}
    assert lags["audit"]["lag_messages"] == 2 and lags["audit"]["position"] == "1:0 1/2:0"
