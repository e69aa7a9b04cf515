"""Retention: ``job_events`` and ``outbox`` partitioned by day, the jobs table tuned for its
updates, and open and recent jobs indexed.

Revision ID: 0015
Revises: 0017
Create Date: 2026-12-01

Nothing was ever removed (issue #16): at 1M jobs the log and the outbox held 1.1 GB of
transitions and long-published events. Here:

- ``job_events`` and ``outbox`` become tables partitioned by range of their time (``at``,
  ``created_at``), one partition per UTC day, plus a ``_default`` partition that catches a row
  no daily partition covers yet (so a maintenance that stopped running never stops a
  transition). The existing table is not copied: it is renamed ``<table>_legacy`` and attached
  as the partition of everything before tomorrow (``MINVALUE`` .. next midnight), with a CHECK
  constraint validated first so the attach itself scans nothing. The cost is one read of each
  table (the CHECK) and, for the outbox, one index build (its key now includes the partition
  key); measured in docs/operations.md ("Retention").
- ``job_events`` loses its primary key (a partitioned table's key must include ``at``, and no
  query reads an event by id): its ids still come from one sequence, and
  ``job_events_job_id_id_idx`` is what every read uses. The outbox's key becomes
  ``(event_id, created_at)``.
- ``jobs``: autovacuum at 2 % of the table instead of 20 %, so that the dead versions each
  claim and completion leave (two or three per job) are reclaimed, and their room reused by the
  next day's rows, before the table grows past them. No ``fillfactor``: it only pays with HOT
  updates, and no transition can be one (every one changes ``status``, which
  ``jobs_batch_key_status_idx`` holds and every partial index's predicate reads); with 80 the
  table was 5 % larger for the same jobs and still 0 HOT updates (docs/performance.md).
- ``jobs_open_idx``: the jobs that are not terminal, by creation time. Reconciliation's checks
  of unfinished and reviewed work, and the maintenance's "is anything open still here", read
  this small index instead of the whole table. ``jobs_terminal_recent_idx`` and
  ``document_labels_updated_at_idx`` serve the windows of the consistency checks (only the last
  day's completions and labels are checked every 15 minutes, not history) and of the report
  (the jobs finished within its window).

The retention functions that use these partitions are revision 0019's.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0017"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
LEDGER = "triage_ledger_owner"
OPEN_STATES = "'received', 'queued', 'running', 'waiting', 'retryable_failed', 'manual_review'"
TOMORROW = "(date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'"

# The bound of the legacy partition, computed once in the database and reused by each statement.
BOUND = f"""
DO $$
BEGIN
    PERFORM set_config('triage.migration_bound', ({TOMORROW})::text, true);
END
$$
"""


def _bound() -> str:
    return "current_setting('triage.migration_bound')::timestamptz"


def _partition(table: str, column: str, columns: str, key: str, indexes: list[str], grants: list[str]) -> None:
    legacy = f"{table}_legacy"
    op.execute(f"ALTER TABLE {S}.{table} RENAME TO {legacy}")
    op.execute(
        f"DO $$ BEGIN EXECUTE format('ALTER TABLE {S}.{legacy} ADD CONSTRAINT {legacy}_bound "
        f"CHECK ({column} < %L)', {_bound()}); END $$"
    )
    op.execute(f"CREATE TABLE {S}.{table} ({columns}{key}) PARTITION BY RANGE ({column})")
    for index in indexes:
        op.execute(index)
    op.execute(
        f"DO $$ BEGIN EXECUTE format('ALTER TABLE {S}.{table} ATTACH PARTITION {S}.{legacy} "
        f"FOR VALUES FROM (MINVALUE) TO (%L)', {_bound()}); END $$"
    )
    op.execute(f"CREATE TABLE {S}.{table}_default PARTITION OF {S}.{table} DEFAULT")
    # The maintenance reports how many rows fell into it (no day partition was there for them).
    op.execute(f"GRANT SELECT ON {S}.{table}_default TO {APP}")
    for grant in grants:
        op.execute(grant)


JOB_EVENTS_COLUMNS = """
    id bigint NOT NULL DEFAULT nextval('triage.job_events_id_seq'),
    job_id uuid NOT NULL,
    from_status triage.job_status,
    to_status triage.job_status NOT NULL,
    step text NOT NULL,
    attempt integer NOT NULL,
    actor text NOT NULL,
    reason text,
    at timestamptz NOT NULL DEFAULT now()
"""

OUTBOX_COLUMNS = """
    event_id uuid NOT NULL DEFAULT gen_random_uuid(),
    job_id uuid NOT NULL,
    event_type text NOT NULL,
    schema_version integer NOT NULL,
    attempt integer NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
"""


def upgrade() -> None:
    op.execute(BOUND)

    # -- job_events: the log, partitioned by the time of the transition -------------------
    # The identity's sequence goes with the identity; a plain one of the same name follows on.
    op.execute(
        f"DO $$ DECLARE next bigint := (SELECT coalesce(max(id), 0) + 1 FROM {S}.job_events); BEGIN "
        f"ALTER TABLE {S}.job_events ALTER COLUMN id DROP IDENTITY; "
        f"EXECUTE format('CREATE SEQUENCE {S}.job_events_id_seq START %s', next); END $$"
    )
    op.execute(f"ALTER INDEX {S}.job_events_pkey RENAME TO job_events_legacy_pkey")
    op.execute(f"ALTER INDEX {S}.job_events_job_id_id_idx RENAME TO job_events_legacy_job_id_id_idx")
    _partition(
        "job_events",
        "at",
        JOB_EVENTS_COLUMNS,
        "",
        [f"CREATE INDEX job_events_job_id_id_idx ON {S}.job_events (job_id, id)"],
        [
            f"ALTER SEQUENCE {S}.job_events_id_seq OWNED BY {S}.job_events.id",
            f"GRANT SELECT ON {S}.job_events TO {APP}",
            f"GRANT INSERT ON {S}.job_events TO {LEDGER}",
            f"GRANT USAGE ON SEQUENCE {S}.job_events_id_seq TO {LEDGER}",
            f"CREATE TRIGGER job_events_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {S}.job_events"
            " FOR EACH STATEMENT EXECUTE FUNCTION triage.refuse_change('the transition log is append-only')",
        ],
    )

    # -- outbox: events by the time they were recorded ------------------------------------
    # Its key on event_id alone gives way to the partitioned key (event_id, created_at), built on
    # the legacy rows when they are attached.
    op.execute(f"ALTER TABLE {S}.outbox DROP CONSTRAINT outbox_pkey")
    op.execute(f"ALTER INDEX {S}.outbox_unpublished_idx RENAME TO outbox_legacy_unpublished_idx")
    op.execute(f"ALTER INDEX {S}.outbox_job_id_idx RENAME TO outbox_legacy_job_id_idx")
    _partition(
        "outbox",
        "created_at",
        OUTBOX_COLUMNS,
        ", CONSTRAINT outbox_pkey PRIMARY KEY (event_id, created_at)",
        [
            f"CREATE INDEX outbox_unpublished_idx ON {S}.outbox (created_at) WHERE published_at IS NULL",
            f"CREATE INDEX outbox_job_id_idx ON {S}.outbox (job_id)",
            f"COMMENT ON INDEX {S}.outbox_unpublished_idx IS 'serves the outbox relay'",
        ],
        [f"GRANT SELECT, INSERT, UPDATE ON {S}.outbox TO {APP}"],
    )

    # -- jobs: room for updates, earlier vacuum, the open jobs indexed ----------------------
    op.execute(
        f"ALTER TABLE {S}.jobs SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05)"
    )
    op.execute(f"CREATE INDEX jobs_open_idx ON {S}.jobs (status, created_at) WHERE status IN ({OPEN_STATES})")
    op.execute(f"COMMENT ON INDEX {S}.jobs_open_idx IS 'serves reconciliation and retention: the jobs not terminal'")
    op.execute(
        f"CREATE INDEX jobs_terminal_recent_idx ON {S}.jobs (status, updated_at)"
        " WHERE status IN ('completed', 'terminal_failed')"
    )
    op.execute(
        f"COMMENT ON INDEX {S}.jobs_terminal_recent_idx IS "
        "'serves the consistency checks of recent completions and the report''s window of finished jobs'"
    )
    op.execute(f"CREATE INDEX document_labels_updated_at_idx ON {S}.document_labels (updated_at)")


def _unpartition(table: str, column: str) -> None:
    """Back to one plain table: the partitions' rows are copied into the legacy one."""
    legacy = f"{table}_legacy"
    op.execute(f"ALTER TABLE {S}.{table} DETACH PARTITION {S}.{legacy}")
    op.execute(f"ALTER TABLE {S}.{legacy} DROP CONSTRAINT {legacy}_bound")
    op.execute(f"ALTER TABLE {S}.{legacy} DISABLE TRIGGER USER")
    op.execute(f"INSERT INTO {S}.{legacy} SELECT * FROM {S}.{table}")
    op.execute(f"ALTER TABLE {S}.{legacy} ENABLE TRIGGER USER")
    op.execute(f"DROP TABLE {S}.{table} CASCADE")
    op.execute(f"ALTER TABLE {S}.{legacy} RENAME TO {table}")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {S}.document_labels_updated_at_idx")
    op.execute(f"DROP INDEX IF EXISTS {S}.jobs_terminal_recent_idx")
    op.execute(f"DROP INDEX IF EXISTS {S}.jobs_open_idx")
    op.execute(
        f"ALTER TABLE {S}.jobs RESET (autovacuum_vacuum_scale_factor,"
        " autovacuum_analyze_scale_factor, autovacuum_vacuum_insert_scale_factor)"
    )

    _unpartition("outbox", "created_at")
    op.execute(f"ALTER TABLE {S}.outbox DROP CONSTRAINT outbox_legacy_pkey")  # the partitioned key's
    op.execute(f"ALTER INDEX {S}.outbox_legacy_unpublished_idx RENAME TO outbox_unpublished_idx")
    op.execute(f"ALTER INDEX {S}.outbox_legacy_job_id_idx RENAME TO outbox_job_id_idx")
    op.execute(f"ALTER TABLE {S}.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (event_id)")

    op.execute(f"ALTER SEQUENCE {S}.job_events_id_seq OWNED BY NONE")
    _unpartition("job_events", "at")
    op.execute(f"ALTER INDEX {S}.job_events_legacy_pkey RENAME TO job_events_pkey")
    op.execute(f"ALTER INDEX {S}.job_events_legacy_job_id_id_idx RENAME TO job_events_job_id_id_idx")
    op.execute(
        f"DO $$ BEGIN EXECUTE format('ALTER TABLE {S}.job_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY"
        f" (START %s)', (SELECT coalesce(max(id), 0) + 1 FROM {S}.job_events)); END $$"
    )
    op.execute(f"DROP SEQUENCE {S}.job_events_id_seq")
