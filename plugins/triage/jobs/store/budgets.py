"""The store's budget part (``JobStore.budgets``): the rows of ``triage.model_budgets`` that every
worker's model calls share, read and written by the statements of
:mod:`triage.jobs.sql.writes.budgets`, each in a short transaction of its own. The worker's side
(blocks of slots handed to its threads, patience, a 429's block) is
:class:`triage.classifiers.budgets.ModelBudget`, which asks this part by name.

What it costs: one round trip per reservation on a row every worker updates; the row lock is
held for the statement only, and the table is ``UNLOGGED`` (no WAL flush per call; after a crash
it comes back empty and the next call writes the row again, with a full budget).
"""

from __future__ import annotations

from triage.jobs.sql.writes import budgets as B
from triage.jobs.store.ledger import Part

__all__ = ["BudgetRows"]


class BudgetRows(Part):
    """The shared budget rows, by connection name: the store's part ``JobStore.budgets``."""

    def configure(
        self, name: str, *, requests_per_minute: float | None, tokens_per_minute: float | None, burst_seconds: float
    ) -> None:
        """Create the row ``name``, or set its rates to these (the last configured wins)."""
        params = {"budget": name, "rpm": requests_per_minute, "tpm": tokens_per_minute, "burst": burst_seconds}
        with self.transaction(None) as conn:
            conn.execute(B.configure_statement(), params)

    def reserve(self, name: str, *, requests: float, tokens: float, patience: float) -> tuple[bool, float] | None:
        """Reserve ``requests`` of ``tokens`` in all if they may start within ``patience`` seconds:
        (reserved, seconds to wait before sending, never below 0); not reserved: the wait they
        would have had. None: the row ``name`` is missing (the unlogged table came back empty)."""
        params = {"budget": name, "requests": requests, "tokens": tokens, "patience": patience}
        with self.transaction(None) as conn:
            row = conn.execute(B.take_statement(), params).first()
            if row is not None:
                return True, max(float(row.wait or 0.0), 0.0)
            wait = conn.execute(B.wait_statement(), params).scalar()
        return None if wait is None else (False, max(float(wait), 0.0))

    def block(self, name: str, *, seconds: float, counted: bool) -> None:
        """Push the row's ``blocked_until`` to ``seconds`` from now (never earlier than it is);
        ``counted``: a 429, added to ``rate_limited``."""
        with self.transaction(None) as conn:
            conn.execute(B.block_statement(), {"budget": name, "seconds": seconds, "counted": int(counted)})
