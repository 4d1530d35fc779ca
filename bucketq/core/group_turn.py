"""An ordered group's turn as a conversation with the store, sans-I/O: generators that yield the next store call
(a ``GroupStep``) and take its reply back, h11 style. The consumer only carries steps to the store and replies
back (``OrderedGroupTurns.converse``); the order of the writes, and what each reply decides, live here. The filters and
updates are ``core.groups``'s; the protocol is docs/FORMAT.md's (Ordered groups) and ``core.groups``'s docstring.

- ``take_turn``: after the claim of an ordered group's bucket, take the group's lock and check that no earlier
  bucket of the group is live; if either fails, release the bucket to wait, give the lock back if taken, and
  hand off when the group is (or became) free.
- ``end_turn``: after the bucket's last write, give the lock back and hand off.
- ``hand_off``: wake the group's earliest live bucket if it waits for a hand-off.

An error raised by a step is thrown into the generator at its ``yield`` (``Generator.throw``), so that it can
still give the lock back, as a ``try``/``finally`` around an ``await`` would.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from bucketq.core import claims, groups
from bucketq.core.format import StoredBucket
from bucketq.core.sharding import key as shard_key


@dataclass(frozen=True)
class LockGroup:
    """``store.lock_group(query, update, mine)``; reply: whether the lock was taken."""

    query: dict
    update: dict
    mine: dict


@dataclass(frozen=True)
class ReadEarliestLive:
    """``store.first_bucket(query, sort)``; reply: the group's earliest live bucket, or None."""

    query: dict
    sort: list


@dataclass(frozen=True)
class ReleaseToWait:
    """``store.update_fenced(query, update, mine=mine)``; reply: whether it applied (not used)."""

    query: dict
    update: dict
    mine: dict


@dataclass(frozen=True)
class Unlock:
    """``store.unlock_group(mine)``; reply: None."""

    mine: dict


@dataclass(frozen=True)
class ReadLock:
    """``store.group_lock(group)``; reply: the lock document, or None."""

    group: str


@dataclass(frozen=True)
class Wake:
    """``store.wake(query, update)``, then wake this process's claims (no event tells of it); reply: None."""

    query: dict
    update: dict


GroupStep = LockGroup | ReadEarliestLive | ReleaseToWait | Unlock | ReadLock | Wake
Conversation = Generator[GroupStep, Any, Any]


@dataclass(frozen=True)
class Turn:
    """What a claim of an ordered group's bucket may do: ``serve`` it (the turn is ours), or not, and then
    ``claim_instead``: the shard key of the group's earliest live bucket when the group was free (a claim of it
    could serve the group now), else None."""

    serve: bool
    claim_instead: dict | None = None


def take_turn(bucket: StoredBucket, token: str, now: dt.datetime, lease_until: dt.datetime, expired_by: dt.datetime,
              *, waited: bool) -> Generator[GroupStep, Any, Turn]:
    """The turn of ``bucket``, just claimed under ``token`` (``now``, ``lease_until``, ``expired_by``: the claim's,
    which serve the whole conversation: a lock that expired since is taken as held, so the recheck wakes the
    bucket rather than a hand-off). Not served: the bucket is released uncounted to wait (``groups.wait_release``;
    ``waited``: it came back from a wait) and the lock, if taken, is given back."""
    group = bucket.group
    assert group is not None
    mine = groups.held_by(group, token)
    locked = yield LockGroup(*groups.acquire(group, token, lease_until, bucket.id, expired_by), mine)
    # An error before the release leaves the lock to expire with the bucket's lease, as a crash would.
    first = None
    if locked:
        first = yield ReadEarliestLive(*groups.earliest_live(group, bucket.partition))
        if first is None or first["_id"] == bucket.id:
            return Turn(serve=True)
    try:
        yield ReleaseToWait(claims.fenced(bucket.ref, token), groups.wait_release(now, token, again=waited),
                            claims.released_by(bucket.ref, token))
    except GeneratorExit:  # abandoned: no one is left to carry a step
        raise
    except BaseException:
        if locked:
            yield Unlock(mine)  # then the error goes on, as from a ``finally``
        raise
    if locked:
        yield Unlock(mine)
    if locked or groups.free((yield ReadLock(group)), expired_by):
        # We gave the lock back, or its holder did meanwhile (its hand-off may have come before our mark).
        yield from hand_off(group, bucket.partition, now)
    return Turn(serve=False, claim_instead=shard_key(first) if first is not None else None)


def end_turn(group: str, partition: int | None, token: str, now: dt.datetime) -> Generator[GroupStep, Any, None]:
    """Give the group's lock back (fenced by our token) and hand off (the woken bucket due at ``now``). On failure
    the lock expires with the lease, and waiting buckets come back at their recheck time."""
    yield Unlock(groups.held_by(group, token))
    yield from hand_off(group, partition, now)


def hand_off(group: str, partition: int | None, now: dt.datetime) -> Generator[GroupStep, Any, None]:
    """After the lock was given back: wake the group's earliest live bucket, if it waits for a hand-off, due at
    ``now``."""
    first = yield ReadEarliestLive(*groups.earliest_live(group, partition))
    if first is not None and groups.waiting(first):
        yield Wake(*groups.wake(shard_key(first), now))
