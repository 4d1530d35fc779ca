"""keuss contender: keuss@2.0.6 ``bucket-mongo-safe`` driven by bench/keuss/driver.js.

``ensure_installed()`` runs ``npm ci`` from bench/keuss/package-lock.json into the git-ignored
bench/.node/ (once per lock file); ``command()`` builds one worker's command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BENCH = Path(__file__).resolve().parent.parent
SOURCE = BENCH / "keuss"
PREFIX = BENCH / ".node"
STAMP = PREFIX / ".installed"
MANIFESTS = ("package.json", "package-lock.json")


def ensure_installed() -> str:
    """Install keuss into bench/.node unless this lock file is installed there already; its version."""
    digest = hashlib.sha256(b"".join((SOURCE / name).read_bytes() for name in MANIFESTS)).hexdigest()
    if not (STAMP.exists() and STAMP.read_text() == digest):
        PREFIX.mkdir(exist_ok=True)
        for name in MANIFESTS:
            shutil.copy(SOURCE / name, PREFIX / name)
        subprocess.run(
            ["npm", "ci", "--prefix", str(PREFIX), "--no-audit", "--no-fund", "--loglevel=error"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=300,
        )
        STAMP.write_text(digest)
    return json.loads((PREFIX / "node_modules" / "keuss" / "package.json").read_text())["version"]


def keuss_url(uri: str, db: str, write_concern: str) -> str:
    """keuss takes the database in the URL path; monitorCommands lets the driver count commands."""
    parts = urlsplit(uri)
    query = [item for item in parts.query.split("&") if item] + ["monitorCommands=true"]
    if write_concern != "1":
        query.append(f"w={write_concern}")
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, "&".join(query), ""))


def command(spec: dict) -> tuple[list[str], dict[str, str]]:
    spec = {**spec, "url": keuss_url(spec["uri"], spec["db"], spec["write_concern"])}
    env = {**os.environ, "NODE_PATH": str(PREFIX / "node_modules")}
    return ["node", str(SOURCE / "driver.js"), json.dumps(spec)], env
