"""The tables of who may do what, on :data:`triage.jobs.schema.metadata`: which role owns each
move, which labels exist, how long the ledger keeps what (migrations 0021, 0022;
docs/security.md). Only the owner writes them: no deployment role has more than SELECT.
"""

from __future__ import annotations

import sqlalchemy as sa

from triage.jobs.schema import NOW, job_status, metadata

# Which role owns each move (migration 0021; triage.jobs.vocabulary.states.TRANSITION_ROLES, tested equal): the
# jobs triggers refuse a move to a login that is no member of its role. Frozen like job_transitions.
transition_roles = sa.Table(
    "transition_roles",
    metadata,
    sa.Column("from_status", job_status),  # NULL: a state a job may be created in
    sa.Column("to_status", job_status, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.UniqueConstraint("from_status", "to_status", postgresql_nulls_not_distinct=True),
    sa.CheckConstraint("role IN ('triage_app', 'triage_review')", name="role"),
    comment="Which role owns each move of job_transitions: the jobs triggers refuse it to any other login",
)

# The taxonomy file's labels (migration 0021), kept in step by ``triage migrate``
# (triage.jobs.sql.writes.taxonomy): document_labels and reviewers' decisions accept only active ones.
taxonomy_labels = sa.Table(
    "taxonomy_labels",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("added_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("retired_at", sa.DateTime(timezone=True)),  # NULL: in the taxonomy file now
    sa.CheckConstraint("name ~ '^[a-z][a-z0-9_]{0,63}$'", name="name"),
    comment="The taxonomy file's labels, kept in step by triage migrate; retired ones stay for old rows",
)

# How long each kind is kept at least (migration 0022): only the owner changes it; the floors are a CHECK.
retention_policy = sa.Table(
    "retention_policy",
    metadata,
    sa.Column("kind", sa.Text, primary_key=True),
    sa.Column("keep_days", sa.Numeric),  # NULL: forever
    sa.CheckConstraint("kind IN ('job_events', 'outbox', 'classifications', 'reconciliation_runs')", name="kind"),
    sa.CheckConstraint(
        "keep_days IS NULL OR keep_days >= CASE kind WHEN 'job_events' THEN 8 WHEN 'outbox' THEN 2 ELSE 1 END",
        name="floor",
    ),
    comment="Days each kind is kept at least (NULL: forever); only the owner changes it, floors by CHECK",
)
