"""Every test the documentation names as evidence exists: a guarantee that cites a renamed or deleted test cites
nothing.

A page names tests in code spans, in three shapes: a file (``tests/test_cancel.py``, ``test_idle.py``), a
file and a test (``test_cancel.py::test_a_cancel_racing_consumers_has_exactly_one_outcome``, a parametrized
id allowed), or a test alone (``test_a_bad_retry_is_refused_when_built``). ``...`` in a name stands for the part the
page leaves out (``..._release_...``): some test must match it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
         ROOT / "spark" / "README.md", ROOT / "bench" / "README.md"]
CODE_SPAN = re.compile(r"`([^`\n]+)`")
TEST_FILE = re.compile(r"(?<![\w/])((?:tests/)?(?:\w+/)*test_\w+\.py)(?:::([\w.]+)(?:\[[^\]]*\])?)?")
TEST_NAME = re.compile(r"(?:\.\.\.)?\w*(?:\.\.\.)?")


@cache
def defined_tests(path: Path) -> frozenset[str]:
    """The names of the test functions a file defines, at module level or in its classes."""
    tree = ast.parse(path.read_text())
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"))


@cache
def all_defined_tests() -> frozenset[str]:
    return frozenset().union(*(defined_tests(path) for path in TESTS.rglob("test_*.py")))


def resolve(name: str) -> list[Path]:
    """The test files a page's file name means: a path from the root, or a name found under tests/."""
    if name.startswith("tests/"):
        return [ROOT / name] if (ROOT / name).is_file() else []
    return sorted(path for path in TESTS.rglob(Path(name).name) if path.as_posix().endswith(name))


def matches(pattern: str, names: frozenset[str]) -> bool:
    regex = re.compile(re.escape(pattern).replace(re.escape("..."), r"\w*") + r"\Z")
    return any(regex.match(name) for name in names)


def cited(page: Path) -> list[tuple[str, str]]:
    """``(what the page says, what is wrong with it)`` for each test reference of ``page`` that names nothing."""
    wrong = []
    for span in CODE_SPAN.findall(page.read_text()):
        files = list(TEST_FILE.finditer(span))
        for match in files:
            paths = resolve(match.group(1))
            if not paths:
                wrong.append((match.group(0), "no such test file"))
            elif match.group(2) and not any(matches(match.group(2), defined_tests(path)) for path in paths):
                wrong.append((match.group(0), "no such test in that file"))
        if not files and TEST_NAME.fullmatch(span) and ("test_" in span or span.startswith("...")) \
                and len(span.strip(".")) > len("test_") and not matches(span, all_defined_tests()):
            wrong.append((span, "no such test under tests/"))
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_test_a_page_names_exists(page: Path) -> None:
    assert cited(page) == []


def test_the_check_finds_a_test_that_does_not_exist(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Held by `test_cancel.py::test_no_such_thing`, `tests/test_nope.py`, `test_nor_this_one` "
                    "and `..._in_push_order_across_buckets`; not `test_` alone, nor `make test`.")
    assert cited(page) == [("test_cancel.py::test_no_such_thing", "no such test in that file"),
                           ("tests/test_nope.py", "no such test file"),
                           ("test_nor_this_one", "no such test under tests/")]
