"""The ```python blocks of the documentation pages (README.md, CHANGELOG.md, every page under docs/, in nested
folders and under list items, and spark/README.md), as tests/test_readme.py runs them and tests/test_wheel.py
runs the README's example on the installed wheel."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pymongo import MongoClient

ROOT = Path(__file__).resolve().parent.parent
SPARK_README = ROOT / "spark" / "README.md"
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")), SPARK_README]
README_URI = "mongodb://localhost:27017"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One ```python block of a page, its indentation taken off."""

    document: Path
    index: int  # the document's first block is 1
    line: int  # of the block's first line of code in the document
    source: str

    @property
    def name(self) -> str:
        """The test id: the page and the block's rank in it, which an edit of the prose around it leaves alone."""
        return f"{self.document.relative_to(ROOT)}#{self.index}"

    @property
    def needs_spark(self) -> bool:
        return self.document == SPARK_README

    @property
    def copy_of(self) -> Path | None:
        """The repository file this block shows, when its first line is ``# <path>`` naming one."""
        first = self.source.split("\n", 1)[0]
        path = ROOT / first[1:].strip() if first.startswith("#") else None
        return path if path is not None and path.is_file() else None

    @property
    def is_test_module(self) -> bool:
        return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
                   for node in ast.parse(self.source).body)

    @property
    def needs_server(self) -> bool:
        """Whether it runs as a script whose code (not a comment) names the README's MongoDB URI."""
        if self.copy_of is not None or self.is_test_module:
            return False
        tokens = tokenize.generate_tokens(io.StringIO(self.source).readline)
        return any(t.type == tokenize.STRING and README_URI in t.string for t in tokens)

    def on(self, uri: str) -> str:
        """The source with ``README_URI`` pointed at ``uri``'s hosts and options; each path (database) kept."""
        scheme, hosts, _, query, _ = urlsplit(uri)
        return re.sub(re.escape(README_URI) + r"(/[\w.-]*)?",
                      lambda m: urlunsplit((scheme, hosts, m.group(1) or ("/" if query else ""), query, "")),
                      self.source)


def blocks_of(document: Path) -> list[Block]:
    """The blocks of ``document``, in order; fails on a block indented less than its fence."""
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        indent = match.group("indent")
        lines = match.group("body").splitlines(keepends=True)
        if indent and any(line.strip() and not line.startswith(indent) for line in lines):
            raise ValueError(f"{document}: a block indented by {len(indent)} has a line indented less")
        source = "".join(line[len(indent):] if line.startswith(indent) else line.lstrip(" \t") for line in lines)
        found.append(Block(document, len(found) + 1, text.count("\n", 0, match.start("body")) + 1, source))
    return found


def blocks() -> Iterator[Block]:
    """The blocks of every page of ``DOCUMENTS``."""
    for document in DOCUMENTS:
        yield from blocks_of(document)



@contextmanager
def new_databases_dropped(uri: str) -> Iterator[None]:
    """The databases a snippet made on the server of ``uri`` (the README's name theirs) are dropped afterwards."""
    with MongoClient(uri) as client:
        before = set(client.list_database_names())
        try:
            yield
        finally:
            for name in set(client.list_database_names()) - before:
                client.drop_database(name)
