"""Housekeeping once per queue, sans-I/O: the lease in ``Q.control`` that lets one consumer of a queue at a time
run its retention deletes and tombstone reaping, whatever the number of consumers.

The holder renews the lease at each round (``HOUSEKEEPING_EVERY_S``); the others try to take it once a
``HOUSEKEEPER_LEASE_S`` or so, and succeed only once it has ended: after its holder died (or closed, which ends it
at once), within ``2 * HOUSEKEEPER_LEASE_S``. Its fields are named apart from the pause document's, so that the
consumers' change streams on ``Q.control`` can leave its writes out (``changes.WATCH_CONTROL``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

HOUSEKEEPING_EVERY_S = 60.0  # a round of retention deletes and tombstone reaping, by the holder of the lease
HOUSEKEEPER_LEASE_S = 300.0  # how long a round's lease lasts; the other consumers try to take it this often
HOUSEKEEPER_ID = "housekeeping"  # the ``_id`` of the lease document in ``Q.control``
UNTIL = "housekeeping_until"  # the lease's end: a field no other document of ``Q.control`` has


def take(now: dt.datetime, token: str, owner: str, lease_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter and update (an upsert) that take the lease for ``lease_s`` seconds, or renew it for its holder
    (``token``): they match nothing while another holder's lease lasts (the upsert then fails on the
    ``_id``, as a duplicate)."""
    query = {"_id": HOUSEKEEPER_ID, "$or": [{UNTIL: {"$lte": now}}, {"token": token}]}
    return query, {"$set": {UNTIL: now + dt.timedelta(seconds=lease_s), "token": token, "owner": owner}}


def give_up(now: dt.datetime, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter and update that end the lease now, if ``token`` still holds it (a consumer closing): the next
    consumer to try takes it."""
    return {"_id": HOUSEKEEPER_ID, "token": token}, {"$set": {UNTIL: now}}
