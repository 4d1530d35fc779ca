"""Which pymongo talks to which MongoDB server. A driver and a server talk when their wire versions overlap; a
server the installed pymongo refuses is said as that, in bucketq's ``ServerRefused``, with the pymongo releases
bucketq is tested with that do talk to it."""

from __future__ import annotations

from typing import Any

import pymongo
from pymongo import common
from pymongo.errors import ConfigurationError

from bucketq.errors import BucketqError

# The pymongo releases the tests run (the ends of pyproject.toml's range) and the wire versions each accepts:
# its pymongo.common.MIN_SUPPORTED_WIRE_VERSION and MAX_SUPPORTED_WIRE_VERSION. MongoDB 4.0 is wire version 7,
# 4.2 is 8, 4.4 is 9, 8.0 is 25.
TESTED_PYMONGO = {"4.13.2": (7, 25), "4.20.1": (9, 29)}


# Here, not in bucketq.errors, which imports no driver (tests/test_packaging.py).
class ServerRefused(BucketqError, ConfigurationError):
    """The installed pymongo refuses the server: their wire versions do not overlap. The message names both, and
    which of the pymongo releases bucketq is tested with talks to that server. Still a pymongo
    ``ConfigurationError``, as it was before bucketq said it."""


def tested_range() -> str:
    """The pymongo releases bucketq is tested with, as a sentence's end: "pymongo 4.13.2 (wire versions 7 to
    25) and 4.20.1 (9 to 29)"."""
    (oldest, (low, high)), (newest, (new_low, new_high)) = TESTED_PYMONGO.items()
    return f"pymongo {oldest} (wire versions {low} to {high}) and {newest} ({new_low} to {new_high})"


def refusal(client: Any) -> str | None:
    """Why the installed pymongo refuses a server that ``client`` (pymongo's, sync or async, or Motor's) has
    heard from, or None when it refuses none."""
    topology = getattr(client, "topology_description", None)
    if topology is None:
        return None
    for (host, port), server in topology.server_descriptions().items():
        low, high = server.min_wire_version, server.max_wire_version
        if not server.is_server_type_known or (
                common.MIN_SUPPORTED_WIRE_VERSION <= high and low <= common.MAX_SUPPORTED_WIRE_VERSION):
            continue
        talking = [release for release, (first, last) in TESTED_PYMONGO.items() if first <= high and low <= last]
        advice = (f"pymongo {talking[-1]} talks to it (pip install 'pymongo=={talking[-1]}')" if talking else
                  "none of them talks to it: a server of a wire version both accept does")
        return (f"the MongoDB server at {host}:{port} speaks wire versions {low} to {high}, and the installed "
                f"pymongo {pymongo.version} only {common.MIN_SUPPORTED_WIRE_VERSION} to "
                f"{common.MAX_SUPPORTED_WIRE_VERSION}: it refuses the server. bucketq is tested with "
                f"{tested_range()}; {advice}")
    return None


def as_refused(exc: ConfigurationError, client: Any) -> ServerRefused | None:
    """``exc`` said as ``ServerRefused`` when it came of a server that ``client``'s pymongo refuses, else None."""
    if isinstance(exc, ServerRefused):
        return exc
    said = refusal(client)
    return None if said is None else ServerRefused(said)
