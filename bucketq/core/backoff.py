"""Retry delays: exponential with jitter, for nacked messages and for failed writes."""

from __future__ import annotations

import random
from dataclasses import dataclass


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
