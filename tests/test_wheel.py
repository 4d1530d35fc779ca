"""The package as a user gets it: the sdist and the wheel built from the checkout (``python -m build``: the wheel is
built from the sdist), the files they must carry, and the wheel installed into a fresh venv, away from the checkout.

There, from a folder of its own with the checkout off ``sys.path``, the README's first example runs against the test
server, and a type checker (this venv's ``mypy --strict``, reading the new venv's site-packages) checks a user's
snippet against the installed annotations: without ``py.typed`` it could not read them. The new venv gets the wheel's
dependencies from pip (its cache) with the project's constraints, as ``make venv`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import blocks, new_databases_dropped

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"bucketq": ROOT / "bucketq", "bucketq_spark": ROOT / "spark" / "bucketq_spark"}
# Besides the packages: what the sdist needs to build the wheel (setup.cfg and PKG-INFO are setuptools' own).
SDIST_TOP = {"LICENSE", "MANIFEST.in", "PKG-INFO", "README.md", "pyproject.toml", "setup.cfg"}

pytestmark = pytest.mark.server

USER_CODE = '''import bucketq


async def send(q: bucketq.Queue) -> str:
    message_id: str = await q.push({"order": 1})
    return message_id
'''
WRONG_USER_CODE = '''import bucketq


async def send(q: bucketq.Queue) -> int:
    n: int = await q.push({"order": 1})
    return n
'''

PROBE = """
import importlib.metadata as metadata, json, runpy, sys
runpy.run_path("example.py", run_name="__main__")
import bucketq, bucketq_spark
dist = metadata.distribution("bucketq")
print(json.dumps({"bucketq": bucketq.__file__, "bucketq_spark": bucketq_spark.__file__, "path": sys.path,
                  "version": bucketq.__version__, "metadata_version": dist.version,
                  "license": dist.metadata["License-Expression"],
                  "files": sorted(str(f) for f in dist.files or [])}))
"""


def package_files() -> set[str]:
    """The packages' files in the checkout as the wheel names them: every file git tracks or would track."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *PACKAGES.values()],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    names = set()
    for path in map(Path, listed):
        if (ROOT / path).is_file():
            package = next(name for name, folder in PACKAGES.items() if (ROOT / path).is_relative_to(folder))
            names.add(f"{package}/{(ROOT / path).relative_to(PACKAGES[package]).as_posix()}")
    return names


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The sdist and the wheel, built with this venv's setuptools (no download of a build environment)."""
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)])
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    yield sdist, wheel


@pytest.fixture(scope="module")
def venv(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip of its own: this venv's pip installs into it) holding the wheel and its dependencies."""
    folder = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(folder)])
    python = folder / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "-c", str(ROOT / "constraints.txt"),
         str(built[1])])
    return python


def run(command: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result


def test_the_sdist_and_the_wheel_carry_the_packages_license_and_type_marker(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as archive:
        in_sdist = {m.name.removeprefix(f"{top}/") for m in archive.getmembers() if m.isfile()}
    packaged = {name for name in in_sdist if name.startswith(("bucketq/", "spark/bucketq_spark/"))}
    assert {name for name in in_sdist - packaged if not name.startswith("bucketq.egg-info/")} == SDIST_TOP
    expected = package_files()
    assert {"bucketq/py.typed", "bucketq/web/templates/base.html", "bucketq_spark/log4j2.properties"} <= expected
    assert {name.replace("spark/bucketq_spark/", "bucketq_spark/", 1) for name in packaged} == expected
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        info = next(name.split("/")[0] for name in in_wheel if name.split("/")[0].endswith(".dist-info"))
        assert {name for name in in_wheel if not name.startswith(f"{info}/")} == expected
        assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()


def test_the_readme_example_runs_on_the_installed_wheel(venv: Path, mongo_uri: str, tmp_path: Path) -> None:
    example = next(block for block in blocks() if block.document.name == "README.md")
    (tmp_path / "example.py").write_text(example.on(mongo_uri))
    with new_databases_dropped(mongo_uri):
        # -I: neither the working folder nor PYTHONPATH nor the user's site-packages is on sys.path
        result = run([str(venv), "-I", "-c", PROBE], cwd=tmp_path)
    found = json.loads(result.stdout.splitlines()[-1])
    site = venv.parent.parent
    assert Path(found["bucketq"]).is_relative_to(site) and Path(found["bucketq_spark"]).is_relative_to(site), found
    assert not any(Path(entry).is_relative_to(ROOT) for entry in found["path"] if entry), found["path"]
    assert "handling {'order': 1}" in result.stdout  # the example did its work (a message handled)
    assert found["version"] == found["metadata_version"] and found["license"] == "MIT"
    assert "bucketq/py.typed" in found["files"]


def test_a_type_checker_reads_the_installed_annotations(venv: Path, tmp_path: Path) -> None:
    """``mypy --strict`` takes a user's correct code, and finds the wrong type in the other: it read bucketq's own
    annotations. Without ``py.typed`` both files would get "missing library stubs or py.typed marker"."""
    (tmp_path / "user.py").write_text(USER_CODE)
    (tmp_path / "wrong.py").write_text(WRONG_USER_CODE)
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-executable", str(venv),
                             "--cache-dir", str(tmp_path / ".mypy_cache"), "user.py", "wrong.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=240)
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert errors == ['wrong.py:5: error: Incompatible types in assignment (expression has type "str", variable has '
                      'type "int")  [assignment]'], result.stdout + result.stderr
