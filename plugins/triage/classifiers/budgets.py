"""A model connection's requests-per-minute and tokens-per-minute budget, shared by every worker
through one row of ``triage.model_budgets`` (migration 0017).

The row is a generic cell rate algorithm (GCRA) for requests and one for tokens: ``request_tat``
is when the request budget would be full again if no call came ("theoretical arrival time"); a
call of ``n`` requests moves it on by ``n × 60 / requests_per_minute`` seconds, and may start as
soon as it is at most ``burst_seconds`` ahead of now. Tokens likewise, with the call's estimated
tokens (corrected by the next call once the provider reported what it used). ``blocked_until`` is
the provider's word: a 429's ``Retry-After`` or an ``x-ratelimit-reset-*`` when nothing is left,
pushed by the worker that got it and honoured by every worker's next call.

A call's slot is taken by one ``UPDATE`` of the row that returns how long to wait before sending
(:meth:`ModelBudget.take`, through the :class:`BudgetRows` the job store's budget part is: the
statements are :mod:`triage.jobs.sql.writes.budgets`); it reserves the slot only if that wait is within the caller's
patience, so a worker that gives up (the job is parked until the budget has room) has spent
nothing of the budget. Waits are computed by the database's clock only: hosts' clocks never meet.

What it costs: one round trip per call on a row every worker updates; the row lock is held for
the statement only, and the table is ``UNLOGGED`` (no WAL flush per call; after a crash it comes
back empty and the next call writes the row again, with a full budget). Measured in
``make bench`` (``docs/model-calls.md``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BudgetRows", "BudgetSettings", "ModelBudget"]

BLOCK_SECONDS = 0.1
"""How much of the budget's rate a worker reserves at once (see :class:`ModelBudget`)."""
MAX_BLOCK = 64
"""The most slots reserved at once, however high the rate."""


class BudgetRows(Protocol):
    """The shared budget rows, by connection name (the job store's ``budgets`` part)."""

    def configure(
        self, name: str, *, requests_per_minute: float | None, tokens_per_minute: float | None, burst_seconds: float
    ) -> None: ...

    def reserve(self, name: str, *, requests: float, tokens: float, patience: float) -> tuple[bool, float] | None: ...

    def block(self, name: str, *, seconds: float, counted: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """A connection's budget as configured (the ``triage_llm`` connection's extra).

    :param requests_per_minute: None: no request budget.
    :param tokens_per_minute: None: no token budget.
    :param burst_seconds: how far ahead of its rate the budget may run (a burst of
        ``burst_seconds × rate``); providers meter over short windows, so keep it small.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst_seconds: float = 1.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number or unset")
        if not self.burst_seconds >= 0:
            raise ValueError("burst_seconds must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


class ModelBudget:
    """The shared budget of one model connection (``name``, its Airflow connection id), as one
    worker process sees it; thread-safe.

    A worker reserves slots in blocks of up to :data:`BLOCK_SECONDS` of the budget's rate (one
    ``UPDATE`` for the block) and hands them out to its threads one rate interval apart: at
    1,000 calls/s that is one round trip per 100 calls, at 50/s one per 5 calls, at 10/s or less
    one per call. A worker holds at most that much of the budget ahead of the others; a 429 drops
    what it holds (the block pushed ``blocked_until`` past it).
    """

    def __init__(self, rows: BudgetRows, name: str, settings: BudgetSettings) -> None:
        self.rows, self.name, self.settings = rows, name, settings
        self._configured = False
        self._lock = threading.Lock()  # the fields below
        self._reserving = threading.Lock()  # one block reserved at a time per process
        self._left, self._next_start, self._spacing = 0, 0.0, 0.0
        self.reservations = 0
        """Blocks reserved (round trips to the row) by this worker, for the benchmark."""

    def configure(self) -> None:
        """Write this worker's rates to the row (once per instance; the last configured wins)."""
        with self._lock:
            if self._configured:
                return
        s = self.settings
        self.rows.configure(
            self.name,
            requests_per_minute=s.requests_per_minute,
            tokens_per_minute=s.tokens_per_minute,
            burst_seconds=s.burst_seconds,
        )
        with self._lock:
            self._configured = True

    def _interval(self, tokens: float) -> float:
        """Seconds between two calls of ``tokens`` at the budget's rates."""
        s = self.settings
        by_requests = 60.0 / s.requests_per_minute if s.requests_per_minute else 0.0
        by_tokens = 60.0 * tokens / s.tokens_per_minute if s.tokens_per_minute else 0.0
        return max(by_requests, by_tokens)

    def _held(self, patience: float) -> float | None:
        """The wait of the next slot this worker holds, if it has one within ``patience``."""
        with self._lock:
            now = time.monotonic()
            if self._left <= 0 or self._next_start - now > patience:
                return None
            start, self._next_start, self._left = self._next_start, self._next_start + self._spacing, self._left - 1
            return max(start - now, 0.0)

    def take(self, tokens: float, patience: float) -> tuple[bool, float]:
        """Reserve one request of ``tokens`` if it may start within ``patience`` seconds:
        (reserved, seconds to wait before sending); not reserved: the wait it would have had."""
        held = self._held(patience)
        if held is not None:
            return True, held
        with self._reserving:
            held = self._held(patience)  # another thread reserved a block meanwhile
            if held is not None:
                return True, held
            interval = self._interval(max(tokens, 0.0))
            size = max(1, min(MAX_BLOCK, int(BLOCK_SECONDS / interval))) if interval > 0 else MAX_BLOCK
            reserved, wait = self._reserve(size, max(tokens, 0.0) * size, patience)
            if reserved:
                with self._lock:
                    self.reservations += 1
                    self._left, self._spacing = size - 1, interval
                    self._next_start = time.monotonic() + wait + interval
            return reserved, wait

    def _reserve(self, requests: int, tokens: float, patience: float) -> tuple[bool, float]:
        for _ in range(2):
            self.configure()
            answer = self.rows.reserve(self.name, requests=float(requests), tokens=tokens, patience=patience)
            if answer is not None:
                return answer
            with self._lock:  # no row: the unlogged table came back empty after a crash
                self._configured = False
        raise RuntimeError(f"model budget {self.name!r} could not be written")

    def block(self, seconds: float, *, counted: bool = True) -> None:
        """Push ``blocked_until`` to ``seconds`` from now (never earlier than it is), dropping
        the slots this worker holds; ``counted``: a 429, added to ``rate_limited``."""
        with self._lock:
            self._left = 0
        self.configure()
        self.rows.block(self.name, seconds=seconds, counted=counted)
