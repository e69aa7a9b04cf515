"""Model calls within a shared requests/tokens-per-minute budget, and what the provider's rate-limit
headers say.

:class:`RateLimiter` sends a call once the budget has room for it (the budget itself is shared by
every worker: :class:`triage.classifiers.budgets.ModelBudget` behind the :class:`CallBudget` protocol, so
no classifier touches the database). A 429 is not the job's failure: the limiter pushes the
budget's ``blocked_until`` by the provider's word (``retry-after-ms``, ``Retry-After``, or the
``x-ratelimit-reset-*`` of what is exhausted), so every worker's next call waits, and sends the
same call again once there is room, without spending the job's attempt. A 200 saying nothing is
left (``x-ratelimit-remaining-* = 0``) pushes the budget until the reset as well. Only a call
that would wait longer than ``max_wait_seconds`` in all gives up, with
``TransientClassifierError("budget_exhausted", retry_after=…)``: the classify step parks its job
(``waiting``, ``outage:rate_limit``, the attempt given back) until the budget has room, so
rate limiting never sends a job to review.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

import httpx

from triage.classifiers.base import TransientClassifierError
from triage.classifiers.provider_errors import retry_after

__all__ = ["BUDGET_EXHAUSTED", "CallBudget", "RateLimiter", "provider_block", "reset_seconds"]

BUDGET_EXHAUSTED: Final = "budget_exhausted"
"""The error class of a call that gave up waiting for the budget (the step parks its job)."""
DEFAULT_BLOCK_SECONDS: Final = 1.0
"""How long a 429 that names no time blocks the budget."""
MIN_BLOCK_SECONDS: Final = 0.05
MAX_BLOCK_SECONDS: Final = 900.0
"""The longest wait a provider's header is taken at (as the classify step bounds Retry-After)."""
MAX_RATE_LIMITED: Final = 20
"""429s one call takes before it gives up, however short their waits."""

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class CallBudget(Protocol):
    """A requests/tokens budget shared by every worker (:class:`triage.classifiers.budgets.ModelBudget`)."""

    def take(self, tokens: float, patience: float) -> tuple[bool, float]:
        """Reserve one request of ``tokens`` if it may start within ``patience`` seconds:
        (reserved, seconds to wait before sending)."""
        ...

    def block(self, seconds: float, *, counted: bool = True) -> None:
        """No call of anyone for ``seconds`` from now; ``counted``: the provider answered 429."""
        ...


def reset_seconds(value: str | None) -> float | None:
    """An ``x-ratelimit-reset-*`` value in seconds: OpenAI's ``1s``, ``6m0s``, ``20ms``,
    ``1m30.5s``, or plain seconds; None when absent or unreadable."""
    text = (value or "").strip().lower()
    if not text:
        return None
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT[unit] for number, unit in parts)


def _exhausted(response: httpx.Response, *, next_unit: bool) -> float | None:
    """The longest reset among the dimensions (requests, tokens) the provider says are used up.
    ``next_unit``: only until one more unit is back (a reset is until the whole limit is), i.e.
    at most 60 s / the per-minute limit when the provider gives it, else at most a second."""
    waits: list[float] = []
    for kind in ("requests", "tokens"):
        if response.headers.get(f"x-ratelimit-remaining-{kind}", "").strip() != "0":
            continue
        reset = reset_seconds(response.headers.get(f"x-ratelimit-reset-{kind}"))
        if reset is None:
            continue
        if next_unit:
            limit = reset_seconds(response.headers.get(f"x-ratelimit-limit-{kind}"))
            reset = min(reset, 60.0 / limit if limit else DEFAULT_BLOCK_SECONDS)
        waits.append(reset)
    return max(waits) if waits else None


def provider_block(response: httpx.Response) -> float | None:
    """How long the provider asks to be left alone, in seconds (bounded): on a 429 its
    ``retry-after-ms`` or ``Retry-After``, else the reset of what is exhausted, else any reset,
    else :data:`DEFAULT_BLOCK_SECONDS`; on another answer, when something is exhausted, until one
    more unit of it is back; else None."""
    if response.status_code != 429:
        seconds = _exhausted(response, next_unit=True)
    else:
        ms = response.headers.get("retry-after-ms", "").strip()
        seconds = float(ms) / 1000.0 if re.fullmatch(r"\d+(?:\.\d+)?", ms) else retry_after(response)
        if seconds is None:
            seconds = _exhausted(response, next_unit=False)
        if seconds is None:
            resets = [reset_seconds(response.headers.get(f"x-ratelimit-reset-{k}")) for k in ("requests", "tokens")]
            seconds = max((r for r in resets if r is not None), default=DEFAULT_BLOCK_SECONDS)
        seconds = max(seconds, MIN_BLOCK_SECONDS)
    return None if seconds is None else min(seconds, MAX_BLOCK_SECONDS)


class RateLimiter:
    """Sends calls within a :class:`CallBudget`; thread-safe (one per classifier).

    :param max_wait_seconds: the longest a call waits for the budget in all (its slot, 429s)
        before it gives up (:data:`BUDGET_EXHAUSTED`).
    """

    def __init__(
        self, budget: CallBudget, *, max_wait_seconds: float = 60.0, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.budget, self.max_wait_seconds, self.sleep = budget, max_wait_seconds, sleep
        self.rate_limited = 0
        """429s this limiter has seen (each one re-sent, not failed)."""
        self._correction = 0.0
        self._lock = threading.Lock()

    def call(self, send: Callable[[], httpx.Response], tokens: float) -> httpx.Response:
        """``send()`` once the budget has room for a request of about ``tokens``; again after a
        429, once the budget has room again. Returns the first answer that is not a 429."""
        waited = 0.0
        for _ in range(MAX_RATE_LIMITED + 1):
            with self._lock:
                estimate, self._correction = tokens + self._correction, 0.0
            reserved, wait = self.budget.take(estimate, max(self.max_wait_seconds - waited, 0.0))
            if not reserved:
                raise TransientClassifierError(
                    BUDGET_EXHAUSTED, f"the model budget has no room for {wait:.1f}s", retry_after=wait
                )
            if wait > 0.0:
                self.sleep(wait)
                waited += wait
            response = send()
            block = provider_block(response)
            if response.status_code == 429:
                with self._lock:
                    self.rate_limited += 1
                self.budget.block(block or DEFAULT_BLOCK_SECONDS)
                continue
            if block is not None:
                self.budget.block(block, counted=False)
            return response
        raise TransientClassifierError(
            BUDGET_EXHAUSTED, f"HTTP 429 {MAX_RATE_LIMITED + 1} times in a row", retry_after=DEFAULT_BLOCK_SECONDS
        )

    def used(self, estimated: float, actual: int | None) -> None:
        """The provider's count of a call's tokens: the difference rides on the next call's take."""
        if actual is not None:
            with self._lock:
                self._correction += actual - estimated
