"""Retention: ``job_events`` and ``outbox`` partitioned by day, the jobs table tuned for its
updates, open jobs indexed, and the maintenance functions that remove only what is expired.

Revision ID: 0015
Revises: 0013
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
- ``jobs``: ``fillfactor`` 80, so that a claim's and a completion's new row version finds room
  on its own page (a HOT update where no indexed column changes: a heartbeat), and autovacuum
  at 2 % of the table instead of 20 %, so dead versions are reclaimed before the table grows.
  Only new pages get the free space; nothing is rewritten here.
- ``jobs_open_idx``: the jobs that are not terminal, by creation time. Reconciliation's checks
  of unfinished and reviewed work, and the maintenance's "is anything open still here", read
  this small index instead of the whole table. ``jobs_completed_recent_idx`` and
  ``document_labels_updated_at_idx`` serve the consistency checks' window (only recent
  completions and labels are checked every 15 minutes, not history).

The maintenance functions (``SECURITY DEFINER``, owned by the migrating owner, ``search_path``
pinned, EXECUTE for ``triage_app`` only): the app role still cannot DROP, TRUNCATE or DELETE
anything itself; through these it can remove only what each function's own rule allows:

- ``ensure_day_partitions(days_ahead)``: today's and the next days' partitions of both tables;
- ``drop_expired_partitions(parent, before)``: a partition wholly before ``before`` and at least
  a day old, unless the outbox's holds an unpublished event, or the log's holds an event of a
  job that is not terminal or has an open review (kept, and named in the result);
- ``purge_classifications(before, after_id, max_rows)``: one bounded batch of classifications
  older than ``before`` whose job is terminal with no open review (the caller loops);
- ``purge_reconciliation_runs(before)``: runs older than ``before``, never the latest.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
LEDGER = "triage_ledger_owner"
OPEN_STATES = "'received', 'queued', 'running', 'waiting', 'retryable_failed', 'manual_review'"
OPEN_STATES_QUOTED = OPEN_STATES.replace("'", "''")  # inside a quoted format string
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
    for grant in grants:
        op.execute(grant)


def _if_role(role: str, statement: str) -> str:
    return (
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN "
        f"{statement}; END IF; END $$"
    )


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

FUNCTIONS = f"""
CREATE FUNCTION triage.day_partition_bounds(part regclass,
                                            OUT lower_bound timestamptz, OUT upper_bound timestamptz)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, triage, pg_temp AS $$
DECLARE
    bound text := pg_get_expr((SELECT relpartbound FROM pg_class WHERE oid = part), part);
    m text[];
BEGIN
    m := regexp_match(bound, 'FROM \\((.*)\\) TO \\((.*)\\)');
    IF m IS NULL THEN
        RETURN;  -- the default partition
    END IF;
    lower_bound := CASE WHEN m[1] = 'MINVALUE' THEN '-infinity' ELSE btrim(m[1], '''')::timestamptz END;
    upper_bound := btrim(m[2], '''')::timestamptz;
END
$$;

CREATE FUNCTION triage.ensure_day_partitions(days_ahead integer)
RETURNS TABLE (partition_name text, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    parent text;
    day timestamptz;
    first_day timestamptz;
    name text;
BEGIN
    IF days_ahead < 0 OR days_ahead > 60 THEN
        RAISE EXCEPTION 'days_ahead must be between 0 and 60, not %', days_ahead;
    END IF;
    FOREACH parent IN ARRAY ARRAY['job_events', 'outbox'] LOOP
        -- From the end of the newest partition (the legacy one ends at the migration's next
        -- midnight), never before today.
        SELECT max(b.upper_bound) INTO first_day
          FROM pg_inherits i, LATERAL triage.day_partition_bounds(i.inhrelid) b
         WHERE i.inhparent = format('triage.%I', parent)::regclass;
        first_day := greatest(coalesce(first_day, '-infinity'),
                              (date_trunc('day', now() AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC');
        day := first_day;
        WHILE day < (date_trunc('day', now() AT TIME ZONE 'UTC') + make_interval(days => days_ahead + 1))
                    AT TIME ZONE 'UTC' LOOP
            name := format('%s_p%s', parent, to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD'));
            -- Rows of that day in the default partition would make the new one fail: leave the
            -- day to the default and say so.
            IF EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'triage' AND c.relname = name) THEN
                day := day + interval '1 day';
                CONTINUE;
            END IF;
            EXECUTE format('SELECT EXISTS (SELECT FROM triage.%I WHERE %I >= %L AND %I < %L)',
                           parent || '_default',
                           CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END, day,
                           CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END, day + interval '1 day')
               INTO created;
            IF created THEN
                partition_name := name;
                created := false;
                RETURN NEXT;
            ELSE
                EXECUTE format('CREATE TABLE triage.%I PARTITION OF triage.%I FOR VALUES FROM (%L) TO (%L)',
                               name, parent, day, day + interval '1 day');
                partition_name := name;
                created := true;
                RETURN NEXT;
            END IF;
            day := day + interval '1 day';
        END LOOP;
    END LOOP;
END
$$;

CREATE FUNCTION triage.drop_expired_partitions(parent text, before timestamptz)
RETURNS TABLE (partition_name text, dropped boolean, rows_removed bigint, bytes_removed bigint, kept_because text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    part record;
    blocked boolean;
BEGIN
    IF parent NOT IN ('job_events', 'outbox') THEN
        RAISE EXCEPTION 'only job_events and outbox are partitioned by day, not %', parent;
    END IF;
    -- A day's partition may still be written to until its end; a day's grace on top.
    before := least(before, now() - interval '1 day');
    FOR part IN
        SELECT c.relname, b.upper_bound
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid,
               LATERAL triage.day_partition_bounds(i.inhrelid) b
         WHERE i.inhparent = format('triage.%I', parent)::regclass
           AND b.upper_bound IS NOT NULL AND b.upper_bound <= before
         ORDER BY b.upper_bound
    LOOP
        partition_name := part.relname;
        IF parent = 'outbox' THEN
            EXECUTE format('SELECT EXISTS (SELECT FROM triage.%I WHERE published_at IS NULL)', part.relname)
               INTO blocked;
            kept_because := CASE WHEN blocked THEN 'unpublished events' END;
        ELSE
            -- Only jobs created before the partition ends can have an event in it; the open
            -- ones are few (jobs_open_idx), and each is looked up in the partition's index.
            EXECUTE format(
                'SELECT EXISTS (SELECT FROM triage.jobs j WHERE j.status IN ({OPEN_STATES_QUOTED})'
                ' AND j.created_at < %L AND EXISTS (SELECT FROM triage.%I e WHERE e.job_id = j.id))'
                ' OR EXISTS (SELECT FROM triage.manual_review r WHERE r.resolved_at IS NULL'
                ' AND EXISTS (SELECT FROM triage.%I e WHERE e.job_id = r.job_id))',
                part.upper_bound, part.relname, part.relname) INTO blocked;
            kept_because := CASE WHEN blocked THEN 'events of open jobs' END;
        END IF;
        IF blocked THEN
            dropped := false;
            rows_removed := 0;
            bytes_removed := 0;
        ELSE
            EXECUTE format('SELECT count(*) FROM triage.%I', part.relname) INTO rows_removed;
            bytes_removed := pg_total_relation_size(format('triage.%I', part.relname)::regclass);
            EXECUTE format('ALTER TABLE triage.%I DETACH PARTITION triage.%I', parent, part.relname);
            EXECUTE format('DROP TABLE triage.%I', part.relname);
            dropped := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION triage.purge_classifications(before timestamptz, after_id bigint, max_rows integer,
                                             OUT deleted bigint, OUT last_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp AS $$
BEGIN
    IF max_rows < 1 OR max_rows > 100000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 100000, not %', max_rows;
    END IF;
    before := least(before, now() - interval '1 hour');
    -- One bounded run of the oldest rows after after_id, by id (the rows' insertion order).
    WITH batch AS (
        SELECT c.id, c.job_id FROM triage.classifications c
         WHERE c.id > after_id AND c.created_at < before
         ORDER BY c.id LIMIT max_rows
    ), gone AS (
        DELETE FROM triage.classifications c USING batch b, triage.jobs j
         WHERE c.id = b.id AND j.id = b.job_id
           AND j.status IN ('completed', 'terminal_failed')
           AND NOT EXISTS (SELECT FROM triage.manual_review r
                            WHERE r.job_id = b.job_id AND r.resolved_at IS NULL)
        RETURNING c.id
    )
    SELECT (SELECT count(*) FROM gone), (SELECT max(id) FROM batch) INTO deleted, last_id;
END
$$;

CREATE FUNCTION triage.purge_reconciliation_runs(before timestamptz) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp AS $$
    WITH gone AS (
        DELETE FROM triage.reconciliation_runs
         WHERE started_at < least(before, now() - interval '1 hour')
           AND id < (SELECT max(id) FROM triage.reconciliation_runs)
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
"""

SIGNATURES = (
    "triage.ensure_day_partitions(integer)",
    "triage.drop_expired_partitions(text, timestamptz)",
    "triage.purge_classifications(timestamptz, bigint, integer)",
    "triage.purge_reconciliation_runs(timestamptz)",
)


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
        f"ALTER TABLE {S}.jobs SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05)"
    )
    op.execute(f"CREATE INDEX jobs_open_idx ON {S}.jobs (status, created_at) WHERE status IN ({OPEN_STATES})")
    op.execute(f"COMMENT ON INDEX {S}.jobs_open_idx IS 'serves reconciliation and retention: the jobs not terminal'")
    op.execute(f"CREATE INDEX jobs_completed_recent_idx ON {S}.jobs (updated_at) WHERE status = 'completed'")
    op.execute(
        f"COMMENT ON INDEX {S}.jobs_completed_recent_idx IS "
        "'serves the consistency checks of recent completions (their lookback window)'"
    )
    op.execute(f"CREATE INDEX document_labels_updated_at_idx ON {S}.document_labels (updated_at)")

    # -- the maintenance functions -----------------------------------------------------------
    op.execute(FUNCTIONS)
    for signature in SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(_if_role(APP, f"GRANT EXECUTE ON FUNCTION {signature} TO {APP}"))
    op.execute(f"SELECT * FROM {S}.ensure_day_partitions(7)")


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
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.day_partition_bounds(regclass)")
    op.execute(f"DROP INDEX IF EXISTS {S}.document_labels_updated_at_idx")
    op.execute(f"DROP INDEX IF EXISTS {S}.jobs_completed_recent_idx")
    op.execute(f"DROP INDEX IF EXISTS {S}.jobs_open_idx")
    op.execute(
        f"ALTER TABLE {S}.jobs RESET (fillfactor, autovacuum_vacuum_scale_factor,"
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
