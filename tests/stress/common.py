"""What the stress harness's processes share: the message format, the queue options, append-only logs.

Every message is ``{"w": writer, "g": generation, "s": seq, "pad": ...}``, with dedupe key ``w.g.s`` in the
dedupe mode and no key without dedupe (so that nothing but the bucket protocol stands between a message and
its delivery: a bucket stored again or an ack not kept shows as a duplicate). A writer process that is
killed is replaced by the next *generation* of the same writer, which numbers its messages from 0 again,
so a message's identity never depends on what a killed process managed to record. ``pad`` is derived from
the identity, so a consumer can tell a corrupted or mixed-up payload from a good one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
from typing import Any

# Short leases and frequent state flushes, so that a killed consumer's buckets come back within seconds.
LEASE_S = 2.0
STATE_FLUSH_S = 0.4
# Crashes add a try to every unfinished message of the buckets a victim held; a run kills consumers many
# times, so dead-lettering after the default 5 tries would turn crashes into "left behind" messages.
MAX_ATTEMPTS = 100
# Writes retry through server restarts (a few seconds) and connection cuts well within this.
WRITE_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 10.0
# A consumer's close() returns within drain_timeout plus one write_timeout whatever the server does; SIGTERM to
# exit is allowed that and a margin for the process's own start and stop.
STOP_S = DRAIN_TIMEOUT_S + WRITE_TIMEOUT_S + 10.0


def queue_options(*, dedupe: bool, bucket_max_size: int, bucket_max_wait: float) -> dict[str, Any]:
    return {"lease": LEASE_S, "state_flush_period": STATE_FLUSH_S, "max_attempts": MAX_ATTEMPTS,
            "write_timeout": WRITE_TIMEOUT_S, "dedupe": dedupe, "bucket_max_size": bucket_max_size,
            "bucket_max_wait": bucket_max_wait, "poll_interval": 0.1, "drain_timeout": DRAIN_TIMEOUT_S}


def message_key(w: int, g: int, s: int) -> str:
    return f"{w}.{g}.{s}"


GROUPED_RUN = 50  # seqs pushed together (the writer's chunk): a grouped run fills a bucket per group


def ordered_group(w: int, g: int, s: int, groups: int) -> str | None:
    """The ordered group (``push(group=...)``) of message ``(w, g, s)`` when writers use ``groups`` groups each:
    every fourth run of ``GROUPED_RUN`` seqs is grouped, its seqs spread over the groups, so that each group
    gets several buckets of many messages (a group of one-message buckets costs a bucket's commands per
    message: a throughput matter, not what this harness is for). ``groups == 0``: none. Derived from the
    identity, so the accounting knows each message's group without storing it."""
    return f"{w}.{g}.{s % groups}" if groups and (s // GROUPED_RUN) % 4 == 0 else None


def pad(w: int, g: int, s: int, size: int) -> str:
    seed = hashlib.blake2b(message_key(w, g, s).encode(), digest_size=16).hexdigest()
    return (seed * (size // len(seed) + 1))[:size]


def payload(w: int, g: int, s: int, size: int) -> dict[str, Any]:
    return {"w": w, "g": g, "s": s, "pad": pad(w, g, s, size)}


def check_payload(value: Any, key: str | None, size: int, *, keyed: bool) -> str | None:
    """None when ``value`` is a payload this harness wrote, intact and under its own key (no key when not
    ``keyed``); else what is wrong."""
    if not isinstance(value, dict) or set(value) != {"w", "g", "s", "pad"}:
        return f"not a harness payload: {str(value)[:80]}"
    w, g, s = value["w"], value["g"], value["s"]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (w, g, s)):
        return f"bad identity {w!r}/{g!r}/{s!r}"
    if value["pad"] != pad(w, g, s, size):
        return f"payload {message_key(w, g, s)} is corrupted"
    if key != (message_key(w, g, s) if keyed else None):
        return f"payload {message_key(w, g, s)} came with key {key!r}"
    return None


class LineLog:
    """An append-only log of short lines. Each line is one ``write(2)``: the moment it returns the line is in
    the kernel and survives a SIGKILL of this process; ``sync()`` (fsync) makes it survive the machine too."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())

    def write_many(self, lines: list[str]) -> None:
        if lines:
            os.write(self.fd, ("\n".join(lines) + "\n").encode())

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def die() -> None:
    """SIGKILL this process: no cleanup, no flush, no goodbye."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent() -> None:
    """For ``preexec_fn``: the kernel SIGKILLs this child when the harness dies, so none is left behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
