"""Every ```python block of README.md, of every page under docs/ (nested folders, indented fences) and of
spark/README.md runs as written, and every test a page names as evidence exists.

Each block is checked with pyflakes' rules (through ruff), so that a name the snippet never defines cannot hide
in an ``except Exception``, then run the way the text tells a user to:
- a block of ``test_`` functions is saved as a test module and run by pytest in a directory of its own (no
  project configuration: pytest-asyncio in its default, strict, mode);
- a block whose first line is ``# <path>`` is that file of the repository, verbatim (the file has a test of its
  own, e.g. tests/test_web_service.py);
- any other block is run as a script, twice (a user runs a snippet again), on the in-memory database or, when
  its code names ``mongodb://localhost:27017``, on the test server: that prefix is the only change made. A block
  of spark/README.md runs in a process of its own (a JVM, the connector's jars through ``$BUCKETQ_SPARK_JARS``),
  marked ``spark``.
A fence indented under a list item is read with its indentation taken off. ``test_blocks_are_found`` has one id
per page, ending in the number of blocks found there (``-v`` lists them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import DOCUMENTS, ROOT, Block, blocks, blocks_of, new_databases_dropped
from tests.helpers import SUBPROCESS_PYTEST_PLUGINS_OFF

OPENING = re.compile(r"^[ \t]*```python\b", re.MULTILINE)


def params() -> list:
    return [pytest.param(block, id=block.name, marks=mark(block)) for block in blocks()]


def mark(block: Block) -> list[pytest.MarkDecorator]:
    if block.needs_spark:
        return [pytest.mark.spark, pytest.mark.server]
    return [pytest.mark.server if block.needs_server else pytest.mark.memory]


@pytest.mark.parametrize("document,count", [
    pytest.param(document, len(blocks_of(document)), id=f"{document.relative_to(ROOT)}-{len(blocks_of(document))}")
    for document in DOCUMENTS])
def test_blocks_are_found(document: Path, count: int) -> None:
    """Every opening fence of a page is a block read (none hides in a fence the pattern misses)."""
    assert count == len(OPENING.findall(document.read_text()))


def test_the_readme_stays_short() -> None:
    """A user's first page: what bucketq is, one example, links; the rest is on the docs site."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_indented_fences_are_read_without_their_indentation(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("- an item:\n\n    ```python\n    x = 1\n    if x:\n        print(x)\n    ```\n")
    [block] = blocks_of(page)
    assert block.source == "x = 1\nif x:\n    print(x)\n" and block.line == 4


@pytest.mark.parametrize("block", params())
def test_the_block_runs_as_written(block: Block, request: pytest.FixtureRequest, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", "--no-cache",
                           "--output-format", "concise", "--stdin-filename", "snippet.py", "-"],
                          input=block.source, capture_output=True, text=True)
    assert lint.returncode == 0, (f"{block.name}, line {block.line} (lines counted from the block's first):\n"
                                  f"{lint.stdout}{lint.stderr}")
    if block.copy_of is not None:
        assert block.source == block.copy_of.read_text(), f"{block.name} differs from {block.copy_of}"
    elif block.is_test_module:
        run_as_tests(block, tmp_path)
    elif block.needs_spark:
        run_in_spark(block, block.on(request.getfixturevalue("mongo_uri")), tmp_path)
    elif block.needs_server:
        uri = request.getfixturevalue("mongo_uri")
        with new_databases_dropped(uri):
            for _ in range(2):
                run_as_script(block, block.on(uri))
    else:
        for _ in range(2):
            run_as_script(block, block.source)
    print(capsys.readouterr().out)  # what the snippet printed, shown when the test fails


def run_as_script(block: Block, source: str) -> None:
    # padded so that a traceback names the document's own line numbers
    code = compile("\n" * (block.line - 1) + source, str(block.document), "exec")
    exec(code, {"__name__": "__main__"})


def run_in_spark(block: Block, source: str, directory: Path) -> None:
    """Twice in one process of its own (the second ``build_session()`` takes the running session), as a user's
    script runs: the connector's jars through ``$BUCKETQ_SPARK_JARS``, as the page says."""
    from devtools.jars import ensure_jars

    script = directory / "snippet.py"
    script.write_text("\n" * (block.line - 1) + source)
    runner = ("import runpy, sys\nfor _ in range(2):\n    runpy.run_path(sys.argv[1], run_name='__main__')\n")
    # the snippet's temporary folders (tempfile) go under this test's, which pytest removes
    env = {**os.environ, "BUCKETQ_SPARK_JARS": ",".join(str(jar) for jar in ensure_jars("spark")),
           "TMPDIR": str(directory)}
    result = subprocess.run([sys.executable, "-c", runner, str(script)], cwd=directory, env=env,
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, f"{block.name}, line {block.line}:\n{result.stdout}{result.stderr[-4000:]}"


def run_as_tests(block: Block, directory: Path) -> None:
    (directory / "pytest.ini").write_text("[pytest]\n")  # none of this project's settings
    (directory / "test_snippet.py").write_text(block.source)
    # the plugins of this venv that a reader's project need not have are off (the snippet needs pytest-asyncio)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *SUBPROCESS_PYTEST_PLUGINS_OFF, "test_snippet.py"],
                            cwd=directory, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and " passed" in result.stdout, result.stdout + result.stderr
