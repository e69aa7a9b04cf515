"""The ledger's retention, as named statements: the database's own removal functions
(migration 0022), each checking its own rule, and the reads that size what they keep.

Nothing here executes anything: the store's retention part (:mod:`triage.jobs.store.retention`)
runs these, as the maintenance role.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import jobs
from triage.jobs.schema.learning import labelled_examples
from triage.jobs.vocabulary.states import OPEN

BATCH = 10_000
"""Classifications examined per transaction (each removes at most this many rows)."""

PARTITIONED = ("job_events", "outbox")

ENSURE_PARTITIONS = sa.text("SELECT partition_name, created FROM triage.ensure_day_partitions(:days_ahead)")
DROP_EXPIRED = sa.text(
    "SELECT partition_name, action, rows_removed, bytes_removed FROM triage.drop_expired_partitions(:parent, :before)"
)
POLICY = sa.text("SELECT kind, keep_days FROM triage.retention_policy")
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
