"""Fail when a file a user reads names an internal tracker number ("issue 21", "#25").

A user cannot open the project's tracker, so such a reference says nothing to them; the history lives in git and
in CHANGELOG.md. ``make lint`` runs ``python -m devtools.tracker_refs``, which prints each offending line and
exits 1. Two shapes are refused:

* a tracker word and a number: ``issue 21``, ``Issues #3``, ``PR 7``, ``ticket 12`` (any case);
* a bare ``#`` number at the start of a word: ``see #25``, ``(#25)``. Not a colour (``#111827``, ``"#999"``: the
  ``#`` follows a quote or is followed by more than four digits or by hex letters), nor an anchor in a link
  (``FORMAT.md#3``), nor an HTTP status or any other number without a ``#`` or a tracker word before it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a user reads: the README, the docs site, the READMEs of Spark and the bench, the package, the examples;
# and the bench and the developer tools, whose docstrings the docs send contributors to.
CHECKED = ("README.md", "CHANGELOG.md", "docs", "spark", "bench", "bucketq", "examples", "devtools", "tests")
SUFFIXES = {".md", ".py", ".html", ".txt", ".yml", ".yaml"}
TRACKER_REF = re.compile(
    r"\b(?:issues?|tickets?|prs?|pull requests?)\s*#?\d+\b"  # a tracker word, then a number
    r"|(?:^|(?<=[\s(\[]))#\d{1,4}(?![\w-])",  # or "#25" starting a word: not "#111827", "#abc1", "x.md#3"
    re.IGNORECASE,
)


def files(roots: Iterable[str]) -> Iterator[Path]:
    for name in roots:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            # this file's own examples are what it refuses; bench/.node holds keuss's npm packages, not ours
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                              and p != Path(__file__).resolve() and ".node" not in p.parts)


def findings(paths: Iterable[Path]) -> Iterator[str]:
    """``path:line: text`` for each line naming a tracker number."""
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TRACKER_REF.search(line):
                yield f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("paths", nargs="*", default=CHECKED, help="files or folders, relative to the repository")
    found = list(findings(files(parser.parse_args(argv).paths)))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} line(s) name an internal tracker number: say what changed, not where it was filed",
              file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
