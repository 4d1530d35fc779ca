"""Generate the synchronous store (``bucketq/store/sync/``) from the async one (``bucketq/store/aio/``).

The store is written once, async; the Spark driver's shell (``bucketq.batch``, ``bucketq_spark.stream``) runs
the generated copy, as PyMongo generates its synchronous API (its ``tools/synchro.py``). The rewriting is by
lines and tokens, so the async source keeps to a few rules:

* Only code is rewritten: strings (docstrings among them) and comments are copied as written, so the prose of the
  generated copy still says what the async source is. An f-string counts as code, fields and text alike (its
  fields may ``await``).

* ``async def``, ``await``, ``async for`` and ``async with`` lose their ``async``/``await``; ``Async*`` names lose
  the prefix; ``asyncio.sleep`` becomes ``time.sleep``, ``asyncio.Lock`` ``threading.Lock``; the types in
  ``REPLACEMENTS`` become their synchronous counterparts.
* A line ending in ``# async-only`` is left out, as is every line from ``# async-only: begin`` to
  ``# async-only: end`` (cancellation, change streams, the pause gate: what only the asyncio shells have).
* A line ``# sync: <code>`` becomes ``<code>`` (an import only the synchronous copy needs: written after the
  import block, it is sorted into it with ruff's isort, the one formatting step).

``python -m devtools.unasync`` writes the files; ``--check`` (run by ``make lint``) writes nothing and fails,
naming them, when a generated file differs from what its source gives.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bucketq" / "store" / "aio"
TARGET = ROOT / "bucketq" / "store" / "sync"
# Modules of the async store with no synchronous copy (change streams, catalogue reads of the asyncio CLI).
ASYNC_ONLY = {"catalog.py", "changes.py", "outbox.py"}

REPLACEMENTS = [  # (pattern, replacement), applied in order to each line kept
    (r"\basync def\b", "def"),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basyncio\.Lock\b", "threading.Lock"),
    (r"\bbucketq\.store\.aio\b", "bucketq.store.sync"),
    (r"from collections\.abc import Awaitable, Callable", "from collections.abc import Callable"),
    (r"Awaitable\[([^\[\]]*)\]", r"\1"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
]
ASYNC_ONLY_LINE = re.compile(r"#\s*async-only\s*$")
BEGIN, END = re.compile(r"^\s*#\s*async-only: begin\s*$"), re.compile(r"^\s*#\s*async-only: end\s*$")
SYNC_LINE = re.compile(r"^(\s*)# sync: (.*)$")
# Tokens copied as written. An f-string is code whatever the Python: one STRING token before 3.12, from
# FSTRING_START to FSTRING_END since (strings inside its fields included), so every Python generates the same text.
PROSE = {tokenize.STRING, tokenize.COMMENT}
FSTRING_START, FSTRING_END = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
FSTRING_PREFIX = re.compile(r"^[a-zA-Z]*[fF]")


def header(source: Path) -> str:
    return (f"# Generated from {source.relative_to(ROOT).as_posix()} by devtools/unasync.py; do not edit.\n"
            "# Edit the async source and run `python -m devtools.unasync`.\n")


def unasync(text: str) -> str:
    """The synchronous version of one async module's text."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if BEGIN.match(line):
            skipping = True
            continue
        if END.match(line):
            skipping = False
            continue
        if skipping or ASYNC_ONLY_LINE.search(line):
            continue
        if match := SYNC_LINE.match(line):
            line = match.group(1) + match.group(2)
        out.append(line)
    return rewrite_code("\n".join(out) + "\n")


def prose_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) offsets in ``text`` of its strings and comments, in order."""
    line_starts = [0]
    for line in io.StringIO(text):  # the lines tokenize reads
        line_starts.append(line_starts[-1] + len(line))
    spans: list[tuple[int, int]] = []
    fstring_depth = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        fstring_depth += (token.type == FSTRING_START) - (token.type == FSTRING_END)
        if token.type in PROSE and fstring_depth == 0 and not FSTRING_PREFIX.match(token.string):
            start, end = (line_starts[row - 1] + col for row, col in (token.start, token.end))
            spans.append((start, end))
    return spans


def rewrite_code(text: str) -> str:
    """``text`` with ``REPLACEMENTS`` applied to its code, between its strings and comments."""
    out: list[str] = []
    done = 0
    for start, end in [*prose_spans(text), (len(text), len(text))]:
        code = text[done:start]
        for pattern, replacement in REPLACEMENTS:
            code = re.sub(pattern, replacement, code)
        out += [code, text[start:end]]
        done = end
    return "".join(out)


def sort_imports(text: str, path: Path) -> str:
    """``text`` with its imports sorted as ``ruff check`` wants them (the lines ``# sync:`` added)."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I", "--fix-only",
                           "--stdin-filename", str(path), "-"], input=text, capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return done.stdout


def generated() -> dict[Path, str]:
    """Each generated file and the text it must hold."""
    files = {}
    for source in sorted(SOURCE.glob("*.py")):
        if source.name in ASYNC_ONLY:
            continue
        target = TARGET / source.name
        files[target] = sort_imports(header(source) + unasync(source.read_text()), target)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a generated file is stale")
    args = parser.parse_args(argv)
    expected = generated()
    extra = {p for p in TARGET.glob("*.py")} - set(expected)
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in [*stale, *sorted(extra)]:
            print(f"{path.relative_to(ROOT)}: stale or not generated from {SOURCE.relative_to(ROOT)}; "
                  "run `python -m devtools.unasync`", file=sys.stderr)
        return 1 if stale or extra else 0
    TARGET.mkdir(exist_ok=True)
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
