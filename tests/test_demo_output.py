"""What ``make demo`` prints reads as plain text in a log file: ``StatusLine`` (the demo's and the example jobs'
progress) rewrites one line in place on a terminal only, elsewhere each update it prints is a line of its own (at
most one every 5 s); and Maven, fetching the jars, writes no escape codes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bucketq import Queue
from bucketq.memory import MemoryDatabase
from bucketq_spark.status_line import CLEAR_LINE, StatusLine
from devtools.jars import POMS, copy_dependencies
from examples.demo import consume, events, produce


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_update_is_a_line_and_the_last_one_held_back_is_printed_at_the_end() -> None:
    log = io.StringIO()
    status = StatusLine(log, every=3600)
    for done in (1, 2, 3):
        status.show(f"{done}/3")
    status.end()
    assert log.getvalue() == "1/3\n3/3\n"
    status.show("again")  # a new run of updates after end()
    status.end()
    assert log.getvalue().endswith("3/3\nagain\n")


def test_off_a_terminal_updates_further_apart_than_every_are_all_printed() -> None:
    log = io.StringIO()
    status = StatusLine(log, every=0)
    for done in (1, 2, 3):
        status.show(f"{done}/3")
    status.end()
    assert log.getvalue() == "1/3\n2/3\n3/3\n"


def test_on_a_terminal_the_line_is_rewritten_in_place() -> None:
    terminal = Terminal()
    status = StatusLine(terminal)
    status.show("a long first update")
    status.show("short")
    status.end()
    assert terminal.getvalue() == f"{CLEAR_LINE}a long first update{CLEAR_LINE}short\n"


async def test_the_demos_progress_in_a_log_is_plain_lines(memory_db: MemoryDatabase,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    queue = Queue(memory_db, name="events")
    await produce(queue, events(25_000), "pushed")
    await consume(queue, 25_000, consumers=2)
    await queue.close()
    progress = capsys.readouterr().err
    assert "\r" not in progress and progress.endswith("\n")
    lines = progress.splitlines()
    assert lines[0].startswith("  pushed: 10,000/25,000 (") and lines[-1].startswith("  consumed: 25,000/25,000 (")
    assert any(line.startswith("  pushed: 25,000/25,000 (") for line in lines), lines


@pytest.mark.slow  # a JVM: Maven, from its local repository (make jars filled it)
def test_maven_fetching_the_jars_writes_no_escape_codes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    copy_dependencies(POMS["testserver"], tmp_path)
    out, err = capfd.readouterr()
    assert "\x1b" not in out + err, repr(out + err)
    assert any(jar.name.startswith("mongo-java-server") for jar in tmp_path.glob("*.jar"))
