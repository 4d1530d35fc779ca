"""The import paths users rely on: ``bucketq.__all__``, the documented entry points, every import that the docs,
the README and the examples show, and a package root that holds the public modules only (the machinery lives in
``bucketq.shell``, the sans-I/O protocol in ``bucketq.core``: docs/contributing.md, Layout)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bucketq

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(bucketq.__file__).resolve().parent

ALL = [
    "AlreadyResolved", "BatchTiming", "BsonCodec", "BucketqError", "BufferFull", "Codec", "CodecUnavailable",
    "EncodeError", "FORMAT_VERSION", "HandlerTimeout", "InvalidOption", "JsonCodec", "LeaseLost", "MalformedBucket",
    "Message", "MessageHeld", "MsgpackCodec", "Outbox", "Outgoing", "PayloadTooLarge", "Position", "Queue",
    "QueueClosed", "QueueOptions", "RateLimit", "Reject", "Retry", "Schedule", "ServerRefused", "ServerUnreachable",
    "Stream", "StreamMessage", "StreamOptions", "StreamReader", "SyncProducer", "Worker", "WriteFailed", "list_queues",
]

# What a user imports or reads first, and the subpackages. Anything else at the root is machinery: bucketq/shell/.
PUBLIC_ROOT = {
    "__init__", "batch", "codecs", "errors", "message", "metrics", "motor_adapter", "options", "outbox", "queue",
    "schedule", "stream", "sync_producer", "testing", "worker",
    "cli", "consumer", "core", "memory", "shell", "store", "web",
}

ENTRY_POINTS = [  # (module, name): the documented ones (docs/reference/, README.md)
    ("bucketq.batch", "BatchQueue"), ("bucketq.batch", "Batch"), ("bucketq.testing", "queue"),
    ("bucketq.testing", "run"), ("bucketq.memory", "MemoryClient"), ("bucketq.web", "create_app"),
    ("bucketq.web.app", "create_app"), ("bucketq.outbox", "Outbox"), ("bucketq.outbox", "event"),
    ("bucketq.codecs", "JsonCodec"), ("bucketq.codecs", "MsgpackCodec"), ("bucketq.codecs", "BsonCodec"),
]

SHELL_DOCSTRING = (  # the layout decision's two lines, the same in every branch
    '"""The I/O shells: the machinery that carries ``bucketq.core``\'s decisions over a connection. Not public API:\n'
    'import from ``bucketq`` (or the documented modules) instead."""\n')

FROM_IMPORT = re.compile(r"^\s*from (bucketq(?:\.\w+)*) import ([\w, ]+)$", re.M)
IMPORT = re.compile(r"^\s*import (bucketq(?:\.\w+)*(?:, *bucketq(?:\.\w+)*)*)$", re.M)


def root_modules(package: Path) -> set[str]:
    """The modules and subpackages directly in ``package``."""
    return {path.stem for path in package.glob("*.py")} | {path.name for path in package.iterdir()
                                                            if (path / "__init__.py").is_file()}


def shown_imports() -> set[tuple[str, str | None]]:
    """(module, name) of every bucketq import in docs/, README.md and examples/ (name None: ``import module``)."""
    texts = [path.read_text() for path in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md",
                                           *(ROOT / "examples").glob("*.py")]]
    shown: set[tuple[str, str | None]] = set()
    for text in texts:
        shown |= {(m[1], name.strip()) for m in FROM_IMPORT.finditer(text) for name in m[2].split(",")}
        shown |= {(module.strip(), None) for m in IMPORT.finditer(text) for module in m[1].split(",")}
    return shown


def test_all_is_the_public_api() -> None:
    assert sorted(bucketq.__all__) == sorted(ALL)
    assert all(hasattr(bucketq, name) for name in bucketq.__all__)


@pytest.mark.parametrize(("module", "name"), ENTRY_POINTS)
def test_the_documented_entry_points_import(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name).__doc__


def test_every_import_the_docs_readme_and_examples_show_works() -> None:
    shown = shown_imports()
    assert ("bucketq", None) in shown and ("bucketq.outbox", "event") in shown  # the reading finds them
    for module, name in sorted(shown, key=str):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name), f"docs import {name} from {module}"


def test_the_package_root_holds_only_the_public_modules() -> None:
    assert root_modules(PACKAGE) == PUBLIC_ROOT, "machinery goes in bucketq/shell/ (docs/contributing.md, Layout)"
    assert (PACKAGE / "shell" / "__init__.py").read_text() == SHELL_DOCSTRING


def test_an_extra_module_at_the_root_would_fail(tmp_path: Path) -> None:
    for name in PUBLIC_ROOT - {"cli", "consumer", "core", "memory", "shell", "store", "web"}:
        (tmp_path / f"{name}.py").write_text("")
    for name in ("cli", "consumer", "core", "memory", "shell", "store", "web"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "templates").mkdir()  # a folder of data, no package
    assert root_modules(tmp_path) == PUBLIC_ROOT
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "extras").mkdir()
    (tmp_path / "extras" / "__init__.py").write_text("")
    assert root_modules(tmp_path) - PUBLIC_ROOT == {"helpers", "extras"}
