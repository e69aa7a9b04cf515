"""Bounded exponential backoff with jitter, for retryable failures."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``delay(n)`` is drawn from [d/2, d] with ``d = min(cap, base * multiplier**(n-1))``.

    "Equal jitter": half the delay is guaranteed, so a retry never comes back at once, and the
    other half is random, so retries of a batch that failed together spread out.
    """

    base_seconds: float = 2.0
    cap_seconds: float = 300.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.base_seconds < 0 or self.cap_seconds < self.base_seconds or self.multiplier < 1:
            raise ValueError(f"invalid retry policy: {self}")

    def ceiling(self, attempt: int) -> float:
        """The largest delay after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt, 1) - 1
        if exponent > 64:  # multiplier**exponent would overflow; the cap has long been reached
            return self.cap_seconds
        return min(self.cap_seconds, self.base_seconds * self.multiplier**exponent)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)
