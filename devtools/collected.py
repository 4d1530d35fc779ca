"""The test ids each Python's tiers collect, written to ``tests/collected/<version>.txt``:
``python -m devtools.collected [VERSION ...]``.

tests/test_collected.py compares today's collection with these lists, so that a test dropped from ``make test``
(deleted, renamed, deselected by a tier's marks) shows up. Tests added since are fine there. Regenerate after
removing or renaming a test on purpose, and say why in the commit. Versions given pick the lists (default: all).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from devtools.tiers import ROOT, TIERS, pytest_command, python_of, selection

FOLDER = ROOT / "tests" / "collected"
VERSIONS = tuple(sorted({tier.version for tier in TIERS if tier.version is not None}))


def listed(version: str) -> Path:
    return FOLDER / f"{version}.txt"


def collect(python: str | Path, version: str) -> list[str]:
    """The ids that ``python`` (of ``version``) collects with the marks of that version's tiers, sorted."""
    marks = selection(version)
    command = [*pytest_command(python, version), "--collect-only", "-q"]
    if marks is not None:
        command += ["-m", marks]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"pytest --collect-only on python {version} exited {out.returncode}:\n"
                           f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return sorted(line for line in out.stdout.splitlines() if "::" in line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.collected", description=__doc__)
    parser.add_argument("versions", nargs="*", default=list(VERSIONS))
    args = parser.parse_args(argv)
    FOLDER.mkdir(parents=True, exist_ok=True)
    for version in args.versions:
        ids = collect(python_of(version), version)
        listed(version).write_text("".join(f"{test_id}\n" for test_id in ids))
        print(f"{listed(version).relative_to(ROOT)}: {len(ids)} tests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
