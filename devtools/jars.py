"""Fetch a pom's runtime jars with Maven into the repo's git-ignored cache.

Maven's local repository lives in ``.cache/m2`` so nothing is written outside the checkout, and the jars are
copied flat into ``.cache/jars/<name>`` so they can be put on a classpath or into ``spark.jars``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
POMS = {
    "testserver": ROOT / "devtools" / "testserver" / "pom.xml",
    "spark": ROOT / "spark" / "jars" / "pom.xml",
}
# Maven 3.8 binds an old dependency plugin by default; name a 3.x release explicitly.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# Maven's console library (jansi 2) writes a colour reset, ESC[0m, to stdout and stderr as it starts and stops,
# even in batch mode (-B, no colours): noreset leaves them out of a log. A JVM property: MAVEN_OPTS, not mvn -D.
QUIET_MAVEN_OPTS = "-Djansi.noreset=true"


def jar_dir(name: str) -> Path:
    return CACHE / "jars" / name


def ensure_jars(name: str) -> list[Path]:
    """Return the jars of pom ``name``, fetching them first unless the pom is unchanged since the last fetch."""
    pom = POMS[name]
    out = jar_dir(name)
    stamp = out / ".pom"
    if not (stamp.exists() and stamp.read_bytes() == pom.read_bytes()):
        print(f"fetching {name} jars with Maven into {out.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        if out.exists():
            for old in out.glob("*.jar"):
                old.unlink()
        copy_dependencies(pom, out)
        stamp.write_bytes(pom.read_bytes())
    return sorted(out.glob("*.jar"))


def copy_dependencies(pom: Path, out: Path) -> None:
    """Maven copies the runtime jars of ``pom`` into ``out``, printing only its errors, as plain text."""
    maven_opts = f"{os.environ.get('MAVEN_OPTS', '')} {QUIET_MAVEN_OPTS}".strip()
    subprocess.run(
        [
            "mvn", "-q", "-B", "-f", str(pom),
            f"-Dmaven.repo.local={CACHE / 'm2'}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ],
        check=True, env={**os.environ, "MAVEN_OPTS": maven_opts},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", choices=sorted(POMS))
    args = parser.parse_args()
    for jar in ensure_jars(args.name):
        print(jar)


if __name__ == "__main__":
    main()
