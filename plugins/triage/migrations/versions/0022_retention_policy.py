"""Retention that cannot be bent: the owner's policy, the maintenance role alone, no bounds read
as text in the caller's session, and a day holding an open job's events kept whole.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05

Issue #25, finding 1: ``triage_app`` (every worker, and the API server) could execute 0019's
functions with a horizon of its choosing (floors of a day and an hour; the 30-day policy and its
8-day floor lived only in Python), and ``day_partition_bounds`` read partition bounds back as text
in the caller's session: with ``TimeZone = 'LINT+167'`` and ``DateStyle = 'SQL'`` every bound
looked 181 hours older and today's partition was dropped. Here:

- ``retention_policy``: the days each kind is kept at least (``NULL``: forever), one row per kind,
  changed only by the owner (no role is granted more than SELECT), with the floors as a CHECK:
  job_events 8 days, outbox 2, classifications and reconciliation runs 1. Defaults: 30, 7, 30, 30.
  A caller's ``before`` can only keep more: each function removes nothing younger than
  ``now() - keep_days``.
- EXECUTE on the four functions is the maintenance role's alone (revoked from ``triage_app``);
  the role reads what ``triage_maintenance`` reports (the jobs' payload references, the default
  partitions' counts) and nothing else.
- Every function pins ``search_path``, ``TimeZone = 'UTC'`` and ``DateStyle = 'ISO, YMD'``. A day
  partition's day comes from the name ``ensure_day_partitions`` gives it (``<table>_pYYYYMMDD``),
  never from its bound; only the one legacy partition's end (0015) is read from its bound, under
  those pinned settings. ``day_partition_bounds`` is gone.
- ``drop_expired_partitions`` keeps a day partition that holds an event of an open job (or, for
  the outbox, an unsent event) whole, as the docs always said, instead of copying those rows
  while it held the parent's lock. The check runs before the DETACH, so transitions are not
  blocked while it reads; it holds an advisory lock that the one move that reopens a closed job
  (out of ``terminal_failed``: a replay) takes shared without waiting (0021's jobs trigger), so
  no job reopens between the check and the drop. A partition is dropped with its rows; what the
  default partition holds is deleted in bounded batches by the same rule.
- Partitions made from now on, and the day partitions that exist, grant nothing to the
  deployment roles (a docker-compose database's default privileges gave the app role DELETE on
  each new day); the two default partitions stay readable to the app and maintenance roles.

Frozen history: this file states the change as made here and imports no current code (its
downgrade reads 0019's functions from that revision's own file).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
REVIEW = "triage_review"
MAINTENANCE = "triage_maintenance"
ROLES = (APP, REVIEW, MAINTENANCE)
OPEN_STATES = "'received', 'queued', 'running', 'waiting', 'retryable_failed', 'manual_review'"
QUOTED_OPEN_STATES = OPEN_STATES.replace("'", "''")  # inside a string literal of the function body
REOPEN_LOCK = 2520250001  # 0021's jobs trigger takes it shared for a move out of a terminal state
PINNED = "SET search_path = pg_catalog, triage, pg_temp SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD'"

SIGNATURES = (
    f"{S}.ensure_day_partitions(integer)",
    f"{S}.drop_expired_partitions(text, timestamptz)",
    f"{S}.purge_classifications(timestamptz, bigint, integer)",
    f"{S}.purge_reconciliation_runs(timestamptz)",
)


def _if_role(role: str, statement: str) -> str:
    return (
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN "
        f"{statement}; END IF; END $$"
    )


POLICY = f"""
CREATE TABLE {S}.retention_policy (
    kind text NOT NULL,
    keep_days numeric,
    CONSTRAINT retention_policy_pkey PRIMARY KEY (kind),
    CONSTRAINT retention_policy_kind_check
        CHECK (kind IN ('job_events', 'outbox', 'classifications', 'reconciliation_runs')),
    CONSTRAINT retention_policy_floor_check
        CHECK (keep_days IS NULL OR keep_days >= CASE kind WHEN 'job_events' THEN 8 WHEN 'outbox' THEN 2 ELSE 1 END)
);
COMMENT ON TABLE {S}.retention_policy IS
    'Days each kind is kept at least (NULL: forever); only the owner changes it, floors by CHECK';
INSERT INTO {S}.retention_policy (kind, keep_days)
VALUES ('job_events', 30), ('outbox', 7), ('classifications', 30), ('reconciliation_runs', 30);
"""

FUNCTIONS = f"""
CREATE FUNCTION {S}.retention_cutoff(kind text, asked timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE {PINNED} AS $$
    -- No row, or NULL days: forever. A caller's cutoff counts only when it keeps more.
    SELECT CASE WHEN p.keep_days IS NULL THEN '-infinity'::timestamptz
                ELSE least(asked, now() - p.keep_days * interval '1 day') END
      FROM (SELECT $1 AS kind) k LEFT JOIN triage.retention_policy p ON p.kind = k.kind
$$;

-- The UTC day of a partition named <parent>_pYYYYMMDD (as ensure_day_partitions names them);
-- NULL for any other name. Its bounds are never read back as text.
CREATE FUNCTION {S}.partition_day(partition_name text, parent text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE {PINNED} AS $$
DECLARE
    m text[] := regexp_match(partition_name, '^' || parent || '_p([0-9]{{4}})([0-9]{{2}})([0-9]{{2}})$');
BEGIN
    IF m IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN make_timestamptz(m[1]::int, m[2]::int, m[3]::int, 0, 0, 0, 'UTC');
END
$$;

-- Where 0015's legacy partition (MINVALUE .. the migration's next midnight) ends: read from its
-- bound under the settings pinned here, whatever the calling session's; -infinity without one.
CREATE FUNCTION {S}.legacy_partition_end(parent text) RETURNS timestamptz
LANGUAGE plpgsql STABLE {PINNED} AS $$
DECLARE
    bound text;
    m text[];
BEGIN
    SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = format('triage.%I', parent)::regclass AND c.relname = parent || '_legacy';
    IF bound IS NULL THEN
        RETURN '-infinity';
    END IF;
    m := regexp_match(bound, '^FOR VALUES FROM \\(MINVALUE\\) TO \\(''([0-9: +-]+)''\\)$');
    IF m IS NULL THEN
        RAISE EXCEPTION 'the bound of triage.%_legacy is not MINVALUE to a time: %', parent, bound;
    END IF;
    RETURN m[1]::timestamptz;
END
$$;

CREATE FUNCTION {S}.ensure_day_partitions(days_ahead integer)
RETURNS TABLE (partition_name text, created boolean)
LANGUAGE plpgsql SECURITY DEFINER {PINNED} SET lock_timeout = '5s' AS $$
DECLARE
    parent text;
    column_name text;
    day timestamptz;
    today timestamptz := date_trunc('day', now());  -- TimeZone is UTC here
    legacy_end timestamptz;
    grantee text;
BEGIN
    IF days_ahead IS NULL OR days_ahead < 0 OR days_ahead > 60 THEN
        RAISE EXCEPTION 'days_ahead must be between 0 and 60, not %', days_ahead;
    END IF;
    FOREACH parent IN ARRAY ARRAY['job_events', 'outbox'] LOOP
        column_name := CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END;
        legacy_end := triage.legacy_partition_end(parent);
        FOR i IN 0 .. days_ahead LOOP
            day := today + make_interval(days => i);
            partition_name := format('%s_p%s', parent, to_char(day, 'YYYYMMDD'));
            -- A day the legacy partition or a partition of its own covers already is skipped.
            CONTINUE WHEN day < legacy_end OR to_regclass(format('triage.%I', partition_name)) IS NOT NULL;
            -- Rows of that day in the default partition would make the new one fail: the day is
            -- left to the default, and said so.
            EXECUTE format('SELECT NOT EXISTS (SELECT FROM triage.%I WHERE %I >= %L AND %I < %L)',
                           parent || '_default', column_name, day, column_name, day + interval '1 day')
               INTO created;
            IF created THEN
                EXECUTE format('CREATE TABLE triage.%I PARTITION OF triage.%I FOR VALUES FROM (%L) TO (%L)',
                               partition_name, parent, day, day + interval '1 day');
                -- Read and written through the parent only (default privileges may grant more).
                EXECUTE format('REVOKE ALL ON triage.%I FROM PUBLIC', partition_name);
                FOR grantee IN SELECT rolname FROM pg_roles WHERE rolname IN ('{APP}', '{REVIEW}', '{MAINTENANCE}') LOOP
                    EXECUTE format('REVOKE ALL ON triage.%I FROM %I', partition_name, grantee);
                END LOOP;
            END IF;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

CREATE FUNCTION {S}.drop_expired_partitions(parent text, before timestamptz)
RETURNS TABLE (partition_name text, action text, rows_removed bigint, bytes_removed bigint)
LANGUAGE plpgsql SECURITY DEFINER {PINNED} SET lock_timeout = '5s' AS $$
DECLARE
    part record;
    cutoff timestamptz;
    holds_open boolean;
    time_column text := CASE parent WHEN 'outbox' THEN 'created_at' ELSE 'at' END;
    -- What must stay: the outbox's unsent events; the log's events of jobs not terminal or with
    -- an open review. Uncorrelated, so each set is read once (jobs_open_idx,
    -- manual_review_open_queue_idx) into a hash that every event of a day is probed against.
    keep text := CASE parent WHEN 'outbox' THEN 'e.published_at IS NULL'
                 ELSE 'e.job_id IN (SELECT j.id FROM triage.jobs j WHERE j.status IN ({QUOTED_OPEN_STATES}))'
                      ' OR e.job_id IN (SELECT r.job_id FROM triage.manual_review r WHERE r.resolved_at IS NULL)' END;
BEGIN
    IF parent IS NULL OR parent NOT IN ('job_events', 'outbox') THEN
        RAISE EXCEPTION 'only job_events and outbox are partitioned by day, not %', parent;
    END IF;
    cutoff := triage.retention_cutoff(parent, before);
    -- No job reopens (a move out of terminal_failed) until this transaction ends; a reopening
    -- in flight is waited for, so the checks below see it.
    PERFORM pg_advisory_xact_lock({REOPEN_LOCK});
    FOR part IN
        SELECT c.relname,
               coalesce(triage.partition_day(c.relname, parent) + interval '1 day',
                        CASE WHEN c.relname = parent || '_legacy' THEN triage.legacy_partition_end(parent) END)
                 AS upper_bound
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = format('triage.%I', parent)::regclass
         ORDER BY 2
    LOOP
        CONTINUE WHEN part.upper_bound IS NULL OR part.upper_bound > cutoff;
        partition_name := part.relname;
        -- Read before the DETACH, so no transition waits for it; nothing new lands in a past day.
        EXECUTE format('SELECT EXISTS (SELECT FROM triage.%I e WHERE ' || keep || ')', part.relname) INTO holds_open;
        IF holds_open THEN
            action := 'kept_open';
            rows_removed := 0;
            bytes_removed := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        bytes_removed := pg_total_relation_size(format('triage.%I', part.relname)::regclass);
        EXECUTE format('SELECT count(*) FROM triage.%I', part.relname) INTO rows_removed;
        -- The parent's lock is held from here to the end of this transaction: one partition per call.
        EXECUTE format('ALTER TABLE triage.%I DETACH PARTITION triage.%I', parent, part.relname);
        EXECUTE format('DROP TABLE triage.%I', part.relname);
        action := 'dropped';
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- What the default partition holds and no longer must: it goes too, in a bounded batch.
    partition_name := parent || '_default';
    EXECUTE format('DELETE FROM triage.%I WHERE ctid = ANY(ARRAY(SELECT e.ctid FROM triage.%I e'
                   ' WHERE e.%I < $1 AND NOT (' || keep || ') LIMIT 50000))',
                   partition_name, partition_name, time_column)
      USING cutoff;
    GET DIAGNOSTICS rows_removed = ROW_COUNT;
    IF rows_removed > 0 THEN
        action := 'purged';
        bytes_removed := 0;
        RETURN NEXT;
    END IF;
END
$$;

CREATE FUNCTION {S}.purge_classifications(before timestamptz, after_id bigint, max_rows integer,
                                          OUT deleted bigint, OUT last_id bigint)
LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE
    cutoff timestamptz := triage.retention_cutoff('classifications', before);
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 100000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 100000, not %', max_rows;
    END IF;
    -- One bounded run of the oldest rows after after_id, by id (the rows' insertion order).
    WITH batch AS (
        SELECT c.id, c.job_id FROM triage.classifications c
         WHERE c.id > coalesce(after_id, 0) AND c.created_at < cutoff
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

CREATE FUNCTION {S}.purge_reconciliation_runs(before timestamptz) RETURNS bigint
LANGUAGE sql SECURITY DEFINER {PINNED} AS $$
    WITH gone AS (
        DELETE FROM triage.reconciliation_runs
         WHERE started_at < triage.retention_cutoff('reconciliation_runs', before)
           AND id < (SELECT max(id) FROM triage.reconciliation_runs)
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
"""

MAINTENANCE_GRANTS = (
    f"GRANT USAGE ON SCHEMA {S} TO {MAINTENANCE}",
    f"GRANT SELECT ON {S}.jobs, {S}.retention_policy, {S}.job_events_default, {S}.outbox_default TO {MAINTENANCE}",
)

PARTITION_PRIVILEGES = f"""
DO $$
DECLARE
    part text;
    grantee text;
BEGIN
    -- Not the legacy partitions: they are the tables of 0001, with 0003's narrow grants, and
    -- their tables again after a downgrade of 0015.
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent IN ('{S}.job_events'::regclass, '{S}.outbox'::regclass)
                   AND right(c.relname, 7) <> '_legacy' LOOP
        EXECUTE format('REVOKE ALL ON {S}.%I FROM PUBLIC', part);
        FOR grantee IN SELECT rolname FROM pg_roles WHERE rolname IN ('{APP}', '{REVIEW}', '{MAINTENANCE}') LOOP
            EXECUTE format('REVOKE ALL ON {S}.%I FROM %I', part, grantee);
        END LOOP;
    END LOOP;
END
$$
"""


def upgrade() -> None:
    op.execute(POLICY)
    for role in ROLES:
        op.execute(_if_role(role, f"REVOKE ALL ON {S}.retention_policy FROM {role}"))
    op.execute(f"GRANT SELECT ON {S}.retention_policy TO {APP}, {REVIEW}")
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION {signature}")
    op.execute(f"DROP FUNCTION {S}.day_partition_bounds(regclass)")
    op.execute(FUNCTIONS)
    for signature in SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {MAINTENANCE}")
    op.execute(PARTITION_PRIVILEGES)
    op.execute(f"GRANT SELECT ON {S}.job_events_default, {S}.outbox_default TO {APP}")
    for grant in MAINTENANCE_GRANTS:
        op.execute(grant)


def _revision_0019() -> ModuleType:
    """0019's module, by its path (a revision's file is no importable module name)."""
    path = Path(__file__).with_name("0019_retention_functions.py")
    spec = importlib.util.spec_from_file_location("triage_revision_0019", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    for helper in ("retention_cutoff(text, timestamptz)", "partition_day(text, text)", "legacy_partition_end(text)"):
        op.execute(f"DROP FUNCTION IF EXISTS {S}.{helper}")
    op.execute(f"DROP TABLE IF EXISTS {S}.retention_policy")
    # 0019's functions and grants, in that revision's own words.
    v0019 = _revision_0019()
    op.execute(v0019.FUNCTIONS)
    for signature in v0019.SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(_if_role(APP, f"GRANT EXECUTE ON FUNCTION {signature} TO {APP}"))
    op.execute(_if_role(MAINTENANCE, f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {MAINTENANCE}"))
    op.execute(_if_role(MAINTENANCE, f"REVOKE ALL ON SCHEMA {S} FROM {MAINTENANCE}"))
