"""Retry delays: exponential with jitter, for nacked messages and for failed writes; the bound of any delay."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from bucketq.errors import InvalidOption

MAX_DELAY_S = 100 * 365 * 86400.0  # a century: far enough for any schedule, near enough for datetime


def check_delay(delay: object) -> float:
    """A delay in seconds (number or timedelta), finite, from 0 to a century; else ``InvalidOption``."""
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else delay
    if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
            or not 0 <= seconds <= MAX_DELAY_S):  # also refuses NaN
        raise InvalidOption(f"delay must be a number of seconds from 0 to {MAX_DELAY_S:.0f}, got {delay!r}")
    return float(seconds)



@dataclass(frozen=True)
class Backoff:
    """``min(maximum, base * factor**attempt)``, scaled by a random factor in ``[1 - jitter, 1 + jitter]``."""

    base: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        try:
            raw = min(self.maximum, self.base * self.factor ** max(0, attempt))
        except OverflowError:  # factor**attempt beyond a float, after a thousand tries or so: the cap holds
            raw = self.maximum
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return min(self.maximum, raw * spread)
