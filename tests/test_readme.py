"""Every ```python block of the README (and of docs/*.md) runs as written (issue 24).

Each block is checked with pyflakes' rules (through ruff), so that a name the snippet never defines cannot hide
in an ``except Exception``, then run the way the text tells a user to:
- a block of ``test_`` functions is saved as a test module and run by pytest in a directory of its own (no
  project configuration: pytest-asyncio in its default, strict, mode);
- a block whose first line is ``# <path>`` is that file of the repository, verbatim (the file has a test of its
  own, e.g. tests/test_web_service.py);
- any other block is run as a script, twice (a user runs a snippet again), on the in-memory database or, when
  its code names ``mongodb://localhost:27017``, on the test server: that prefix is the only change made.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pymongo import MongoClient

from tests.helpers import SUBPROCESS_PYTEST_PLUGINS_OFF

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_URI = "mongodb://localhost:27017"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the block's first line of code in the document
    source: str

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

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


def blocks() -> Iterator[Block]:
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            yield Block(document, text.count("\n", 0, match.start(1)) + 1, match.group(1))


def params() -> list:
    return [pytest.param(block, id=block.name,
                         marks=pytest.mark.server if block.needs_server else pytest.mark.memory)
            for block in blocks()]


def test_every_python_fence_is_found() -> None:
    found = list(blocks())
    assert found and len(found) == sum(document.read_text().count("```python") for document in DOCUMENTS)


@pytest.mark.parametrize("block", params())
def test_the_block_runs_as_written(block: Block, request: pytest.FixtureRequest, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", "--no-cache",
                           "--output-format", "concise", "--stdin-filename", "snippet.py", "-"],
                          input=block.source, capture_output=True, text=True)
    assert lint.returncode == 0, f"{block.name} (lines counted from the block's first):\n{lint.stdout}{lint.stderr}"
    if block.copy_of is not None:
        assert block.source == block.copy_of.read_text(), f"{block.name} differs from {block.copy_of}"
    elif block.is_test_module:
        run_as_tests(block, tmp_path)
    elif block.needs_server:
        uri = request.getfixturevalue("mongo_uri")
        with new_databases_dropped(uri):
            for _ in range(2):
                run_as_script(block, block.on(uri))
    else:
        for _ in range(2):
            run_as_script(block, block.source)
    print(capsys.readouterr().out)  # what the snippet printed, shown when the test fails


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


def run_as_script(block: Block, source: str) -> None:
    # padded so that a traceback names the document's own line numbers
    code = compile("\n" * (block.line - 1) + source, str(block.document), "exec")
    exec(code, {"__name__": "__main__"})


def run_as_tests(block: Block, directory: Path) -> None:
    (directory / "pytest.ini").write_text("[pytest]\n")  # none of this project's settings
    (directory / "test_snippet.py").write_text(block.source)
    # the plugins of this venv that a reader's project need not have are off (the snippet needs pytest-asyncio)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *SUBPROCESS_PYTEST_PLUGINS_OFF, "test_snippet.py"],
                            cwd=directory, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and " passed" in result.stdout, result.stdout + result.stderr
