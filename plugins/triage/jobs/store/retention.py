"""The store's retention part (``JobStore.retention``): the statements ``triage_maintenance`` runs
(:mod:`triage.jobs.sql.writes.retention`), each in a transaction of its own, as the maintenance
role (the only one that may: migration 0022).

The removals are the database's own functions: each checks its own rule (expired under the
owner's ``triage.retention_policy``, and nothing open in what it removes), so this module only
asks for them by name and loops over the bounded ones. A ``before`` given here can only keep
more than the policy, never less. Partitions are dropped whole, and a day partition holding an
open job's events (an unsent event, for the outbox) is kept whole; classifications go in batches
of :data:`BATCH` rows, one short transaction each, never one long DELETE.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from triage.jobs.sql.writes.retention import (
    BATCH,
    DEFAULT_ROWS,
    DROP_EXPIRED,
    ENSURE_PARTITIONS,
    PARTITIONED,
    POLICY,
    PURGE_CLASSIFICATIONS,
    PURGE_RUNS,
    TABLE_BYTES,
    open_payload_refs,
)
from triage.jobs.store.ledger import Part

__all__ = ["PARTITIONED", "LedgerRetention", "PartitionOutcome"]


@dataclass(frozen=True)
class PartitionOutcome:
    """What one expired partition came to: ``dropped`` (its rows and bytes removed), ``kept_open``
    (kept whole: it holds an open job's event, or an unsent one), or ``purged`` (a batch of the
    default partition's expired rows deleted)."""

    table: str
    partition: str
    action: str
    rows: int
    bytes: int

    @property
    def dropped(self) -> bool:
        return self.action == "dropped"


class LedgerRetention(Part):
    """Runs the retention statements: the store's part ``JobStore.retention`` (on an engine
    whose login is the maintenance role's: 0022)."""

    def ensure_partitions(self, days_ahead: int) -> list[str]:
        """Make today's and the next ``days_ahead`` days' partitions; the names made now.
        A day whose rows already sit in a default partition is left to it (named with ``!``)."""
        with self.transaction(None) as conn:
            rows = conn.execute(ENSURE_PARTITIONS, {"days_ahead": days_ahead}).all()
        return [r.partition_name if r.created else f"!{r.partition_name}" for r in rows]

    def drop_expired_partitions(self, table: str, before: datetime | None = None) -> list[PartitionOutcome]:
        """Drop the day partitions of ``table`` wholly before the cutoff (the policy's, or
        ``before`` where that keeps more), one per transaction (each holds the table's lock only
        that long), keeping whole those that hold open work; then the default partition's
        expired rows, in batches. Each partition kept is named once."""
        if table not in PARTITIONED:
            raise ValueError(f"{table} is not partitioned by day")
        removed: list[PartitionOutcome] = []
        while True:
            with self.transaction(None) as conn:
                rows = conn.execute(DROP_EXPIRED, {"parent": table, "before": before}).all()
            outcomes = [
                PartitionOutcome(table, r.partition_name, r.action, r.rows_removed, r.bytes_removed) for r in rows
            ]
            done = [o for o in outcomes if o.action != "kept_open"]
            removed += done
            if not done:  # the kept ones are the same in every call: the last call's say it
                return removed + outcomes

    def policy(self) -> dict[str, float | None]:
        """Days each kind is kept at least (``triage.retention_policy``; None: forever)."""
        with self.engine.connect() as conn:
            return {r.kind: None if r.keep_days is None else float(r.keep_days) for r in conn.execute(POLICY)}

    def purge_classifications(self, before: datetime | None = None, batch: int = BATCH) -> int:
        """Delete the classifications of terminal jobs older than ``before``, ``batch`` rows per
        transaction; how many went."""
        deleted, after = 0, 0
        while True:
            with self.transaction(None) as conn:
                row = conn.execute(
                    PURGE_CLASSIFICATIONS, {"before": before, "after_id": after, "max_rows": batch}
                ).one()
            if row.last_id is None:
                return deleted
            deleted += row.deleted
            after = row.last_id

    def purge_reconciliation_runs(self, before: datetime | None = None) -> int:
        with self.transaction(None) as conn:
            return int(conn.execute(PURGE_RUNS, {"before": before}).scalar_one())

    def open_payload_refs(self) -> set[str]:
        with self.engine.connect() as conn:
            return set(conn.execute(open_payload_refs()).scalars())

    def rows_in_default_partitions(self) -> int:
        """Rows no day partition covered when written (the maintenance did not run ahead)."""
        with self.engine.connect() as conn:
            return int(conn.execute(DEFAULT_ROWS).scalar_one())

    def table_bytes(self, table: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(TABLE_BYTES, {"table": f"triage.{table}"}).scalar_one())
