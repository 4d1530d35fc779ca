"""The modules built on a ``Queue`` (``Schedule``, ``Outbox``, ``Worker``, the CLI's and the dashboard's views) use
its machinery through one door, ``bucketq.queue.internals`` (``QueueInternals``): no module but ``bucketq/queue.py``
reads a private attribute of a Queue (``._store``, ``._clock``, ``._ready()``, ...). Reads the source only (``ast``).

A Queue's private names are those ``bucketq/queue.py`` gives ``self._...`` in class ``Queue`` (attributes and
methods); a read of one of them on anything but ``self`` elsewhere counts, whatever the object, unless allowed below
with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
QUEUE = ROOT / "bucketq" / "queue.py"
SCANNED = (ROOT / "bucketq", ROOT / "spark" / "bucketq_spark")

# (file, expression): why it is no read of a Queue's internals
ALLOWED = {
    ("bucketq/consumer/consumer.py", "message._consumer"): "a Message's consumer (Consumer.ack_many checks that each "
                                                           "message is its own), not a Queue's",
}


def queue_private_names(source: str) -> set[str]:
    """The private attributes and methods of class ``Queue`` in ``source`` (dunders aside)."""
    queue = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Queue")
    names = set()
    for node in ast.walk(queue):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def private_reads(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, expression) of each read of one of ``names`` on anything but ``self`` or ``cls`` in ``source``."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in names
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def scanned_files() -> list[Path]:
    return sorted(path for root in SCANNED for path in root.rglob("*.py") if path != QUEUE)


def found() -> set[tuple[str, int, str]]:
    names = queue_private_names(QUEUE.read_text())
    return {(path.relative_to(ROOT).as_posix(), line, expression)
            for path in scanned_files() for line, expression in private_reads(path.read_text(), names)}


def test_no_module_but_the_queue_reads_a_queues_private_attributes() -> None:
    offenders = sorted(f"{path}:{line}: {expression}" for path, line, expression in found()
                       if (path, expression) not in ALLOWED)
    assert not offenders, ("a Queue's internals read outside bucketq/queue.py (use bucketq.queue.internals, or add "
                           "what is missing to QueueInternals):\n" + "\n".join(offenders))


def test_each_allowed_read_is_still_there() -> None:
    assert {(path, expression) for path, _, expression in found()} >= set(ALLOWED), "an allowed read is gone: drop it"


def test_the_scan_knows_the_queues_internals_and_finds_a_planted_read() -> None:
    names = queue_private_names(QUEUE.read_text())
    assert {"_store", "_clock", "_wakeup", "_ready", "_internals"} <= names
    files = {path.relative_to(ROOT).as_posix() for path in scanned_files()}
    assert {"bucketq/schedule.py", "bucketq/outbox.py", "bucketq/worker.py", "bucketq/shell/text_views.py",
            "bucketq/web/dashboard.py"} <= files
    schedule = (ROOT / "bucketq" / "schedule.py").read_text()
    assert private_reads(schedule, names) == []
    planted = schedule + "\n\nasync def sneak(self, queue):\n    await self.queue._ready()\n    return queue._store\n"
    reads = sorted(expression for _, expression in private_reads(planted, names))
    assert reads == ["queue._store", "self.queue._ready"]
