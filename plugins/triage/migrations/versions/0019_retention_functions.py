"""Retention's functions: the only way the DAGs' role removes anything, each by its own rule.

Revision ID: 0019
Revises: 0015
Create Date: 2026-12-01

The maintenance functions (``SECURITY DEFINER``, owned by the migrating owner, ``search_path``
pinned, EXECUTE for ``triage_app`` only): the app role still cannot DROP, TRUNCATE or DELETE
anything itself; through these it can remove only what each function's own rule allows:

- ``ensure_day_partitions(days_ahead)``: today's and the next days' partitions of both tables;
- ``drop_expired_partitions(parent, before)``: the oldest partition wholly before ``before``
  (and at least a day old), one per call: detached, its rows that must stay (the outbox's
  unsent events; the log's events of a job that is not terminal or has an open review) are
  inserted again through the parent, where they land in the default partition (no day
  partition covers their day any more), and the table is dropped; with no such partition left,
  a bounded batch of what the default partition no longer has to keep is deleted;
- ``purge_classifications(before, after_id, max_rows)``: one bounded batch of classifications
  older than ``before`` whose job is terminal with no open review (the caller loops);
- ``purge_reconciliation_runs(before)``: runs older than ``before``, never the latest.

The functions run as the owner of the tables (the migrating user), not as the powerless
``triage_ledger_owner`` of the jobs triggers: dropping a partition needs the table's owner. So
each body pins ``search_path``, names its tables, accepts only the two partitioned tables by
name and formats every identifier with ``%I``; none is a trigger function, so none can be
attached to a table of the caller's.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0015"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
OPEN_STATES = "'received', 'queued', 'running', 'waiting', 'retryable_failed', 'manual_review'"


def _if_role(role: str, statement: str) -> str:
    return (
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN "
        f"{statement}; END IF; END $$"
    )


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
    column_name text;
    day timestamptz;
    today timestamptz := (date_trunc('day', now() AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC';
BEGIN
    IF days_ahead < 0 OR days_ahead > 60 THEN
        RAISE EXCEPTION 'days_ahead must be between 0 and 60, not %', days_ahead;
    END IF;
    FOREACH parent IN ARRAY ARRAY['job_events', 'outbox'] LOOP
        column_name := CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END;
        FOR i IN 0 .. days_ahead LOOP
            day := today + make_interval(days => i);
            -- A day some partition covers already (the legacy one covers up to the migration's
            -- next midnight) is skipped.
            CONTINUE WHEN EXISTS (
                SELECT FROM pg_inherits h, LATERAL triage.day_partition_bounds(h.inhrelid) b
                 WHERE h.inhparent = format('triage.%I', parent)::regclass
                   AND b.lower_bound <= day AND b.upper_bound > day);
            partition_name := format('%s_p%s', parent, to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD'));
            -- Rows of that day in the default partition would make the new one fail: the day is
            -- left to the default, and said so.
            EXECUTE format('SELECT NOT EXISTS (SELECT FROM triage.%I WHERE %I >= %L AND %I < %L)',
                           parent || '_default', column_name, day, column_name, day + interval '1 day')
               INTO created;
            IF created THEN
                EXECUTE format('CREATE TABLE triage.%I PARTITION OF triage.%I FOR VALUES FROM (%L) TO (%L)',
                               partition_name, parent, day, day + interval '1 day');
            END IF;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

CREATE FUNCTION triage.drop_expired_partitions(parent text, before timestamptz)
RETURNS TABLE (partition_name text, dropped boolean, rows_removed bigint, bytes_removed bigint, rows_kept bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp SET lock_timeout = '5s' AS $$
DECLARE
    part record;
    time_column text := CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END;
    -- What must stay: the outbox's unsent events; the log's events of the jobs that are not
    -- terminal or have an open review (few: jobs_open_idx, manual_review_open_queue_idx).
    keep text := CASE parent WHEN 'outbox' THEN 'published_at IS NULL' ELSE 'job_id = ANY($1)' END;
    open_jobs uuid[];
    total bigint;
BEGIN
    IF parent NOT IN ('job_events', 'outbox') THEN
        RAISE EXCEPTION 'only job_events and outbox are partitioned by day, not %', parent;
    END IF;
    -- A day's partition may still be written to until its end; a day's grace on top.
    before := least(before, now() - interval '1 day');
    IF parent = 'job_events' THEN
        open_jobs := ARRAY(SELECT id FROM triage.jobs WHERE status IN ({OPEN_STATES})
                           UNION SELECT job_id FROM triage.manual_review WHERE resolved_at IS NULL);
    END IF;
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
        bytes_removed := pg_total_relation_size(format('triage.%I', part.relname)::regclass);
        EXECUTE format('SELECT count(*) FROM triage.%I', part.relname) INTO total;
        -- Detached, the day belongs to no partition: what must stay is inserted again through
        -- the parent and lands in the default partition, with its ids and times; the rest goes
        -- with the table. The detach waits for (and then blocks) the parent's readers and
        -- writers for as long as this transaction lasts: one partition per call.
        EXECUTE format('ALTER TABLE triage.%I DETACH PARTITION triage.%I', parent, part.relname);
        EXECUTE format('INSERT INTO triage.%I SELECT * FROM triage.%I WHERE ' || keep, parent, part.relname)
          USING open_jobs;
        GET DIAGNOSTICS rows_kept = ROW_COUNT;
        EXECUTE format('DROP TABLE triage.%I', part.relname);
        dropped := true;
        rows_removed := total - rows_kept;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- What the default partition kept and no longer must: it goes too, in a bounded batch.
    partition_name := parent || '_default';
    EXECUTE format('DELETE FROM triage.%I WHERE ctid = ANY(ARRAY(SELECT ctid FROM triage.%I'
                   ' WHERE %I < $2 AND NOT (' || keep || ') LIMIT 50000))',
                   partition_name, partition_name, time_column)
      USING open_jobs, before;
    GET DIAGNOSTICS rows_removed = ROW_COUNT;
    dropped := false;
    bytes_removed := 0;
    rows_kept := 0;
    IF rows_removed > 0 THEN
        RETURN NEXT;
    END IF;
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
    op.execute(FUNCTIONS)
    for signature in SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(_if_role(APP, f"GRANT EXECUTE ON FUNCTION {signature} TO {APP}"))
    op.execute(f"SELECT * FROM {S}.ensure_day_partitions(7)")


def downgrade() -> None:
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.day_partition_bounds(regclass)")
