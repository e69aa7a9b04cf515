"""The classify step's circuit breaker: when transient failures dominate the recent calls, the
dependency is down (an outage), not the jobs (:mod:`triage.pipeline.classify` parks them)."""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Opens when at least ``threshold`` of the last ``window`` calls (and ``min_calls`` of
    them) failed transiently. Thread-safe; once open it stays open for this run."""

    def __init__(self, window: int = 50, threshold: float = 0.5, min_calls: int = 20) -> None:
        self._calls: deque[bool] = deque(maxlen=window)
        self._threshold, self._min_calls = threshold, min_calls
        self._lock = threading.Lock()
        self.is_open = False

    def record(self, transient_failure: bool) -> None:
        with self._lock:
            self._calls.append(transient_failure)
            if len(self._calls) >= self._min_calls and sum(self._calls) / len(self._calls) >= self._threshold:
                self.is_open = True
