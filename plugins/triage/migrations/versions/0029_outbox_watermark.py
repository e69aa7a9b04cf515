"""The outbox carries its whole envelope and the relay publishes up to a watermark.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05

Issue #29 ("a relay that is not bound to the database"): relaying an event cost a join to
``jobs`` (for the envelope's correlation id and payload reference) and a second write of its
outbox row (``UPDATE … SET published_at``: a new row version, its index entries, its WAL). Here:

- ``outbox.correlation_id`` and ``outbox.payload_ref``, written with the fact (the statement
  that moves the job returns them); the unsent events are filled in from their jobs here.
- ``outbox.txid``: the writing transaction's id (``pg_current_xact_id()``). The relay reads the
  events in ``(txid, event_id)`` order, only those of transactions older than every transaction
  still running, so no event can ever commit behind a position it has read past (an id drawn at
  insert time cannot promise that: a transaction that drew a lower id may commit later).
  The unsent events get this migration's transaction id; the published ones keep ``NULL``
  (published before 0029; their ``published_at`` says when).
- ``outbox_watermark``: one row, the position of the last event published. ``published_at`` is
  no longer written; ``outbox_unpublished_idx`` gives way to ``outbox_relay_order_idx``.
- ``outbox_claims`` holds ranges (after, up to and with) instead of id arrays, and a ``sent``
  flag; the claims in flight are dropped (their events are unsent and are claimed again).
- ``drop_expired_partitions`` keeps a day holding an event after the watermark (was: one whose
  ``published_at`` is NULL), pinned as 0022 made it.

Frozen history: this file states the change as made here and imports no current code (the
function's text is 0022's, read from that revision's own file, with its one rule changed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
REVIEW = "triage_review"
MAINTENANCE = "triage_maintenance"
TXID = "(pg_current_xact_id())::text::bigint"
OLD_KEEP = "'e.published_at IS NULL'"
NEW_KEEP = "'e.txid IS NOT NULL AND (e.txid, e.event_id) > (SELECT w.txid, w.event_id FROM triage.outbox_watermark w)'"


def _revision_0022() -> ModuleType:
    """0022's module, by its path (a revision's file is no importable module name)."""
    path = Path(__file__).with_name("0022_retention_policy.py")
    spec = importlib.util.spec_from_file_location("triage_revision_0022", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_expired_partitions(keep: str) -> str:
    """0022's ``drop_expired_partitions`` as CREATE OR REPLACE (its grants and owner stay), with
    ``keep`` as the outbox's rule of what must stay."""
    text = _revision_0022().FUNCTIONS
    start = text.index(f"CREATE FUNCTION {S}.drop_expired_partitions")
    end = text.index("CREATE FUNCTION", start + 1)
    body = text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    if body.count(OLD_KEEP) != 1:
        raise RuntimeError("0022's drop_expired_partitions no longer has its outbox rule")
    return body.replace(OLD_KEEP, keep)


CLAIMS = f"""
CREATE TABLE {S}.outbox_claims (
    token uuid NOT NULL,
    claimed_until timestamptz NOT NULL,
    after_txid bigint NOT NULL,
    after_event_id uuid NOT NULL,
    upto_txid bigint NOT NULL,
    upto_event_id uuid NOT NULL,
    events integer NOT NULL,
    sent boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_claims_pkey PRIMARY KEY (token),
    -- The claims continue one another from the watermark: two never start at one position.
    CONSTRAINT outbox_claims_after_key UNIQUE (after_txid, after_event_id)
);
COMMENT ON TABLE {S}.outbox_claims IS 'A relay''s claim on a range of outbox events while it sends them';
CREATE TABLE {S}.outbox_watermark (
    id boolean NOT NULL DEFAULT true,
    txid bigint NOT NULL,
    event_id uuid NOT NULL,
    advanced_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_watermark_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_watermark_one_row_check CHECK (id)
);
COMMENT ON TABLE {S}.outbox_watermark IS
    'How far the outbox relay has published: the (txid, event_id) of its last event in order';
INSERT INTO {S}.outbox_watermark (txid, event_id) VALUES (0, '00000000-0000-0000-0000-000000000000');

-- The relay's horizon: the oldest transaction running now that may have written this database's
-- tables, as a txid (none: the next one's). A transaction of the snapshot is left out only when
-- pg_stat_activity shows it running in another database (a backend never changes database, so
-- that is never wrong; one it cannot place, or that ended since the snapshot, is kept: the
-- horizon is then lower, never higher). Without it, a long write transaction in Airflow's
-- metadata database on the same server would hold every event back.
CREATE FUNCTION {S}.outbox_horizon() RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH s AS (SELECT pg_current_snapshot() AS snap),
    elsewhere AS (
        SELECT a.backend_xid::text::bigint AS xid FROM pg_stat_activity a
         WHERE a.backend_xid IS NOT NULL
           AND a.datid IS DISTINCT FROM (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    )
    SELECT least(pg_snapshot_xmax(s.snap)::text::bigint,
                 (SELECT min(x::text::bigint) FROM pg_snapshot_xip(s.snap) AS x
                   WHERE x::text::bigint % 4294967296 NOT IN (SELECT e.xid FROM elsewhere e)))
      FROM s
$$;
"""


def upgrade() -> None:
    op.execute(
        f"ALTER TABLE {S}.outbox ADD COLUMN correlation_id text, ADD COLUMN payload_ref text, ADD COLUMN txid bigint"
    )
    op.execute(
        f"UPDATE {S}.outbox o SET correlation_id = j.correlation_id, payload_ref = j.payload_ref, txid = {TXID}"
        f" FROM {S}.jobs j WHERE j.id = o.job_id AND o.published_at IS NULL"
    )
    op.execute(f"ALTER TABLE {S}.outbox ALTER COLUMN txid SET DEFAULT {TXID}")
    op.execute(f"DROP INDEX {S}.outbox_unpublished_idx")
    op.execute(f"CREATE INDEX outbox_relay_order_idx ON {S}.outbox (txid, event_id)")
    op.execute(f"COMMENT ON INDEX {S}.outbox_relay_order_idx IS 'serves the outbox relay and the unsent counts'")
    op.execute(f"DROP TABLE {S}.outbox_claims")
    op.execute(CLAIMS)
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {S}.outbox_claims TO {APP}")
    op.execute(f"GRANT SELECT, UPDATE ON {S}.outbox_watermark TO {APP}")
    # The review role reads every table (0021) and the reports count unsent events.
    op.execute(f"GRANT SELECT ON {S}.outbox_claims, {S}.outbox_watermark TO {REVIEW}")
    op.execute(f"GRANT SELECT ON {S}.outbox_watermark TO {MAINTENANCE}")
    op.execute(f"GRANT EXECUTE ON FUNCTION {S}.outbox_horizon() TO {APP}, {REVIEW}, {MAINTENANCE}")
    op.execute(_drop_expired_partitions(NEW_KEEP))


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {S}.outbox_horizon()")
    op.execute(_drop_expired_partitions(OLD_KEEP))
    op.execute(
        f"UPDATE {S}.outbox o SET published_at = now() FROM {S}.outbox_watermark w"
        " WHERE o.published_at IS NULL AND o.txid IS NOT NULL AND (o.txid, o.event_id) <= (w.txid, w.event_id)"
    )
    op.execute(f"DROP TABLE {S}.outbox_watermark")
    op.execute(f"DROP TABLE {S}.outbox_claims")
    op.execute(
        f"""
        CREATE TABLE {S}.outbox_claims (
            token uuid NOT NULL,
            claimed_until timestamptz NOT NULL,
            event_ids uuid[] NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT outbox_claims_pkey PRIMARY KEY (token)
        );
        COMMENT ON TABLE {S}.outbox_claims IS 'A relay''s claim on a batch of unsent outbox events while it sends them';
        GRANT SELECT, INSERT, DELETE ON {S}.outbox_claims TO {APP};
        GRANT SELECT ON {S}.outbox_claims TO {REVIEW};
        """
    )
    op.execute(f"DROP INDEX {S}.outbox_relay_order_idx")
    # The legacy partition's index by the name 0015's downgrade renames back (the parent's attaches it).
    op.execute(
        f"DO $$ BEGIN IF to_regclass('{S}.outbox_legacy') IS NOT NULL THEN CREATE INDEX outbox_legacy_unpublished_idx"
        f" ON {S}.outbox_legacy (created_at) WHERE published_at IS NULL; END IF; END $$"
    )
    op.execute(f"CREATE INDEX outbox_unpublished_idx ON {S}.outbox (created_at) WHERE published_at IS NULL")
    op.execute(f"COMMENT ON INDEX {S}.outbox_unpublished_idx IS 'serves the outbox relay'")
    op.execute(f"ALTER TABLE {S}.outbox DROP COLUMN txid, DROP COLUMN payload_ref, DROP COLUMN correlation_id")
