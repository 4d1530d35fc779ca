"""Run the tests on the other supported Pythons (3.12, 3.13): ``make test-pythons``.

The full suite runs on the main venv's Python (3.11). Each other version gets a venv of its own under
``.cache/venvs/<version>`` with the package and its test extra (no Spark), rebuilt when pyproject.toml or
constraints.txt change, and runs every test but the Spark and browser ones, in two passes: ``pytest -m unit`` on
two workers (as ``make unit`` does: the in-memory queue tests, the property tests, the CLI and the codecs), then
the tests over a real connection, one at a time as on 3.11 (the test server, or ``BUCKETQ_MONGODB_URI``): the
async driver, change streams, cancellation and subprocesses run on each interpreter's own asyncio. An interpreter
is looked up as ``pythonX.Y`` on the PATH, then in pyenv's versions; a missing one fails the target, since the
package claims to support it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.12", "3.13")
# A version's pins that take the place of constraints.txt's for the same package: the suite runs on the oldest
# pymongo the dependency range allows on 3.12, on the newest (constraints.txt) on 3.11 and 3.13
EXTRA_PINS = {"3.12": "pymongo==4.13.2"}
# (marks, whether on the xdist workers): tests/conftest.py marks "unit" the tests that need no server, no JVM and
# are not slow; the venvs here have no pyspark, and the browser test runs once, on 3.11
PASSES = (("unit", True), ("not unit and not spark and not browser", False))


def find_interpreter(version: str) -> str | None:
    """The newest ``pythonX.Y`` on the PATH or in pyenv's versions folder, or None."""
    found = shutil.which(f"python{version}")
    if found and _reports(found, version):
        return found
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"),
                        key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()])
    return next((c for c in reversed(candidates) if _reports(c, version)), None)


def _reports(interpreter: str, version: str) -> bool:
    out = subprocess.run([interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == version


def ensure_venv(version: str, interpreter: str) -> Path:
    """A venv for ``version`` with ``.[test]`` installed, reinstalled when the package's pins change."""
    venv = ROOT / ".cache" / "venvs" / version
    python = venv / "bin" / "python"
    constraints = _constraints(version)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + constraints.encode())
    stamp = venv / ".installed"
    if stamp.exists() and python.exists() and stamp.read_text() == digest.hexdigest():
        return python
    print(f"python {version}: installing the package and its test extra into {venv.relative_to(ROOT)} ...",
          file=sys.stderr, flush=True)
    subprocess.run([interpreter, "-m", "venv", "--clear", str(venv)], check=True)
    (venv / "constraints.txt").write_text(constraints)
    # without setuptools' boxed notice on editable installs (the Makefile's EDITABLE_QUIET says why)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(venv / "constraints.txt"), "-e", ".[test]"],
                   cwd=ROOT, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"})
    stamp.write_text(digest.hexdigest())
    return python


def _constraints(version: str) -> str:
    """constraints.txt with ``version``'s ``EXTRA_PINS`` entry in place of the line that pins the same package."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pin = EXTRA_PINS.get(version)
    if pin is not None:
        package = pin.split("==")[0]
        lines = [line for line in lines if line.split("==")[0].strip() != package] + [pin]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.pythons", description=__doc__)
    parser.add_argument("versions", nargs="*", default=list(VERSIONS))
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per version")
    args = parser.parse_args(argv)
    failed = []
    for version in args.versions:
        interpreter = find_interpreter(version)
        if interpreter is None:
            print(f"python {version}: no interpreter found (python{version} on PATH or in pyenv)", file=sys.stderr)
            failed.append(version)
            continue
        python = ensure_venv(version, interpreter)
        # A bytecode cache of the version's own, written even where PYTHONDONTWRITEBYTECODE is set (as make unit's):
        # under a prefix, Python reads no __pycache__ beside the sources, the stdlib's and site-packages' included,
        # so without it every process (a test's subprocesses too) compiled all it imported, a third of the time.
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(ROOT / ".cache" / "pycache" / version)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for marks, on_workers in PASSES:
            started = time.monotonic()
            print(f"python {version}: pytest -m {marks!r} ({interpreter})", file=sys.stderr, flush=True)
            workers = ["-n", str(args.workers)] if on_workers else []
            run = subprocess.run([str(python), "-m", "pytest", "-p", "no:anyio", "-m", marks, "-q", *workers,
                                  "-p", "no:cacheprovider"], cwd=ROOT, env=env)
            print(f"python {version}: pytest -m {marks!r} exited {run.returncode} after "
                  f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            if run.returncode != 0:
                failed.append(version)
                break
    if failed:
        print(f"failed on python {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
