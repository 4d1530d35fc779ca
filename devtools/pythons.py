"""The other supported Pythons (3.12, 3.13) and a venv of each, for the tiers of ``make test`` (devtools/tiers.py).

The main venv (``.venv``, Python 3.11) runs the whole suite. Each other version gets a venv of its own under
``.cache/venvs/<version>`` with the package and its test extra (no Spark), rebuilt when pyproject.toml,
constraints.txt or the version's extra pin change. An interpreter is looked up as ``pythonX.Y`` on the PATH, then
in pyenv's versions; a missing one fails its tiers, since the package claims to support it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.12", "3.13")
# A version's pins that take the place of constraints.txt's for the same package: the suite runs on the oldest
# pymongo the dependency range allows on 3.12, on the newest (constraints.txt) on 3.11 and 3.13
EXTRA_PINS = {"3.12": "pymongo==4.13.2"}


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
    """A venv for ``version`` with ``.[test]`` installed under its constraints (``_constraints``), reinstalled when
    the package's pins change."""
    venv = ROOT / ".cache" / "venvs" / version
    python = venv / "bin" / "python"
    constraints = _constraints(version)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + constraints.encode())
    stamp = venv / ".installed"
    if stamp.exists() and python.exists() and stamp.read_text() == digest.hexdigest():
        return python
    pin = EXTRA_PINS.get(version)
    print(f"python {version}: installing the package and its test extra{f' and {pin}' if pin else ''} into "
          f"{venv.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
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

