"""The ledger's side of retention: the statements ``triage_maintenance`` runs, each in a
transaction of its own.

The removals are the database's own functions (migration 0015): each checks its own rule
(expired, and nothing open left in what it removes), so this module only asks for them by name
and loops over the bounded ones. Partitions are dropped whole; classifications go in batches
of :data:`BATCH` rows, one short transaction each, never one long DELETE.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from triage.jobs.learning_tables import labelled_examples
from triage.jobs.schema import jobs
from triage.jobs.states import OPEN

BATCH = 10_000
"""Classifications examined per transaction (each removes at most this many rows)."""

PARTITIONED = ("job_events", "outbox")

ENSURE_PARTITIONS = sa.text("SELECT partition_name, created FROM triage.ensure_day_partitions(:days_ahead)")
DROP_EXPIRED = sa.text(
    "SELECT partition_name, dropped, rows_removed, bytes_removed, rows_kept"
    " FROM triage.drop_expired_partitions(:parent, :before)"
)
PURGE_CLASSIFICATIONS = sa.text(
    "SELECT deleted, last_id FROM triage.purge_classifications(:before, :after_id, :max_rows)"
)
PURGE_RUNS = sa.text("SELECT triage.purge_reconciliation_runs(:before)")
TABLE_BYTES = sa.text("SELECT pg_total_relation_size(CAST(:table AS regclass))")
DEFAULT_ROWS = sa.text(
    "SELECT (SELECT count(*) FROM triage.job_events_default) + (SELECT count(*) FROM triage.outbox_default)"
)


def open_payload_refs() -> Any:
    """The payload references still needed: those of the jobs that are not terminal
    (``jobs_open_idx``) and those of the labelled examples, the learned classifier's training
    set, kept as long as the examples are (a reviewed job's example points at its document)."""
    open_jobs = sa.select(jobs.c.payload_ref).where(jobs.c.status.in_(sorted(s.value for s in OPEN)))
    return sa.union(open_jobs, sa.select(labelled_examples.c.payload_ref))


@dataclass(frozen=True)
class PartitionOutcome:
    """One expired day partition dropped (or a batch of the default partition's expired rows
    deleted: ``dropped`` False): its rows removed and bytes, and the rows that had to stay
    (moved into the default partition)."""

    table: str
    partition: str
    dropped: bool
    rows: int
    bytes: int
    kept: int


class LedgerRetention:
    """Runs the retention statements on ``engine`` (the DAGs' role may: migration 0015)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def ensure_partitions(self, days_ahead: int) -> list[str]:
        """Make today's and the next ``days_ahead`` days' partitions; the names made now.
        A day whose rows already sit in a default partition is left to it (named with ``!``)."""
        with self.engine.begin() as conn:
            rows = conn.execute(ENSURE_PARTITIONS, {"days_ahead": days_ahead}).all()
        return [r.partition_name if r.created else f"!{r.partition_name}" for r in rows]

    def drop_expired_partitions(self, table: str, before: datetime) -> list[PartitionOutcome]:
        """Drop the day partitions of ``table`` wholly before ``before``, one per transaction
        (each holds the table's lock only that long), keeping what is open; then the default
        partition's expired rows, in batches."""
        if table not in PARTITIONED:
            raise ValueError(f"{table} is not partitioned by day")
        outcomes: list[PartitionOutcome] = []
        while True:
            with self.engine.begin() as conn:
                rows = conn.execute(DROP_EXPIRED, {"parent": table, "before": before}).all()
            if not rows:
                return outcomes
            outcomes += [
                PartitionOutcome(table, r.partition_name, r.dropped, r.rows_removed, r.bytes_removed, r.rows_kept)
                for r in rows
            ]

    def purge_classifications(self, before: datetime, batch: int = BATCH) -> int:
        """Delete the classifications of terminal jobs older than ``before``, ``batch`` rows per
        transaction; how many went."""
        deleted, after = 0, 0
        while True:
            with self.engine.begin() as conn:
                row = conn.execute(
                    PURGE_CLASSIFICATIONS, {"before": before, "after_id": after, "max_rows": batch}
                ).one()
            if row.last_id is None:
                return deleted
            deleted += row.deleted
            after = row.last_id

    def purge_reconciliation_runs(self, before: datetime) -> int:
        with self.engine.begin() as conn:
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
