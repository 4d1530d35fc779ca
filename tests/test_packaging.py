"""What the installed packages may import: every module of ``bucketq`` and ``bucketq_spark`` imports with the
checkout's own trees (``devtools``, ``bench``, ``tests`` and the example jobs' ``jobs``) made unimportable.

A fresh interpreter (``-P``: the working directory is not on ``sys.path``; ``PYTHONPATH`` names this checkout's
two package roots) puts a ``sys.meta_path`` finder first that raises ``ImportError`` for those names, then walks
both packages with ``pkgutil.walk_packages``: each module's source must have no import statement naming them
(lazy imports inside functions included), and each module must import (but ``__main__``, which would run its
program). It prints the modules that passed and the ones that failed, with the reason.

And the build backend reads ``pyproject.toml`` without a warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("devtools", "bench", "tests", "jobs")

PROBE = r"""
import ast, importlib, importlib.util, json, pkgutil, sys

FORBIDDEN = set(sys.argv[1].split(","))


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"{name} is not part of the installed packages")
        return None


sys.meta_path.insert(0, Blocker())
imported, failed = [], {}
for package in ("bucketq", "bucketq_spark"):
    spec = importlib.util.find_spec(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(spec.submodule_search_locations, package + ".")]
    for name in names:
        try:
            # Lazy imports too (inside functions): any import statement naming a blocked package.
            tree = ast.parse(importlib.util.find_spec(name).loader.get_source(name) or "")
            for node in ast.walk(tree):
                targets = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                for target in targets:
                    if target.split(".")[0] in FORBIDDEN:
                        raise ImportError(f"line {node.lineno} imports {target}")
            if not name.endswith(".__main__"):  # a __main__ runs its program when imported
                importlib.import_module(name)
            imported.append(name)
        except BaseException as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
files = {p: importlib.util.find_spec(p).origin for p in ("bucketq", "bucketq_spark")}
print(json.dumps({"imported": imported, "failed": failed, "files": files}))
"""


def _probe(forbidden: tuple[str, ...]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "spark")])}
    env.pop("BUCKETQ_SPARK_JARS", None)
    out = subprocess.run([sys.executable, "-P", "-c", PROBE, ",".join(forbidden)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_installed_packages_import_nothing_from_the_checkout() -> None:
    result = _probe(FORBIDDEN)
    assert result["files"]["bucketq"] == str(ROOT / "bucketq" / "__init__.py")
    assert result["files"]["bucketq_spark"] == str(ROOT / "spark" / "bucketq_spark" / "__init__.py")
    assert result["failed"] == {}
    assert {"bucketq.batch", "bucketq.core.claims", "bucketq_spark.session", "bucketq_spark.reader",
            "bucketq_spark.job", "bucketq_spark.sinks"} <= set(result["imported"])


def test_the_blocker_catches_an_import_of_the_checkout() -> None:
    """The probe can fail: blocking ``pymongo`` too, the modules that import it are reported."""
    result = _probe((*FORBIDDEN, "pymongo"))
    assert "pymongo is not part of the installed packages" in result["failed"]["bucketq.batch"]
    assert "bucketq.errors" in result["imported"]  # imports no driver


def test_pyproject_reads_without_a_deprecation_warning() -> None:
    """The build backend reads pyproject.toml with every warning an error: ``project.license`` as a TOML table
    printed setuptools' deprecation notice on every install (three times each ``make demo`` reinstalled)."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "MIT"
