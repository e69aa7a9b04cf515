"""Labelled examples and the learned classifier's model registry.

Revision ID: 0025
Revises: 0022
Create Date: 2026-12-05

Issue #27 (the learning loop): human ground truth in the ledger, and model versions as data.

- ``labelled_examples``: one row per labelled document, idempotent by (source, external_id):
  imported history (``triage labels import``, ``POST /triage/api/labels``) and every reviewer
  ``label`` decision (source ``review``, the job id as external id, written in the decision's
  transaction). The text is a claim check (payload reference and content hash), as a job's.
- ``classifier_models``: each trained version with its training set hash, counts per label,
  held-out metrics, per-label thresholds, the artifact (arrays and vocabulary, never pickle)
  and its SHA-256; at most one ``champion`` (an exclusion constraint checked at commit).

The worker role reads and writes both: the classify operators read the champion, the
``train_classifier`` DAG adds candidates and promotes them, ``triage labels import`` adds
examples. The review role (0021) adds the examples its ``label`` decisions and the labels
endpoint write; the maintenance role reads the examples' payload references, which payload
retention keeps. Nobody deletes through any of them.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0025"
down_revision = "0022"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
REVIEW = "triage_review"
MAINTENANCE = "triage_maintenance"


def upgrade() -> None:
    op.create_table(
        "labelled_examples",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("external_id", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("content_sha256", sa.Text, nullable=False),
        sa.Column("payload_ref", sa.Text, nullable=False),
        sa.Column("labelled_by", sa.Text, nullable=False),
        sa.Column("labelled_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("job_id", pg.UUID(as_uuid=True)),
        sa.PrimaryKeyConstraint("id", name="labelled_examples_pkey"),
        sa.UniqueConstraint("source", "external_id", name="labelled_examples_source_external_id_key"),
        sa.CheckConstraint("length(content_sha256) = 64", name="labelled_examples_content_sha256_check"),
        sa.CheckConstraint("label ~ '^[a-z][a-z0-9_]{0,63}$'", name="labelled_examples_label_check"),
        schema=S,
        comment="Labelled examples: human ground truth the learned classifier trains on",
    )
    op.create_index(
        "labelled_examples_content_sha256_idx", "labelled_examples", ["content_sha256", "labelled_at"], schema=S
    )
    op.create_table(
        "classifier_models",
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'candidate'")),
        sa.Column("taxonomy_sha256", sa.Text, nullable=False),
        sa.Column("training_set_sha256", sa.Text, nullable=False),
        sa.Column("label_counts", pg.JSONB, nullable=False),
        sa.Column("metrics", pg.JSONB, nullable=False),
        sa.Column("thresholds", pg.JSONB, nullable=False),
        sa.Column("target_precision", sa.Float, nullable=False),
        sa.Column("params", pg.JSONB, nullable=False),
        sa.Column("artifact", sa.LargeBinary, nullable=False),
        sa.Column("artifact_sha256", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True)),
        sa.Column("promoted_by", sa.Text),
        sa.Column("promotion_reason", sa.Text),
        sa.PrimaryKeyConstraint("version", name="classifier_models_pkey"),
        sa.CheckConstraint("status IN ('candidate', 'champion', 'retired')", name="classifier_models_status_check"),
        sa.CheckConstraint("length(artifact_sha256) = 64", name="classifier_models_artifact_sha256_check"),
        sa.CheckConstraint(
            "target_precision > 0 AND target_precision <= 1", name="classifier_models_target_precision_check"
        ),
        schema=S,
        comment="Learned classifier versions: training set, held-out metrics, thresholds, artifact, status",
    )
    # At most one champion, checked at commit, so that one statement can promote and retire.
    op.execute(
        f"ALTER TABLE {S}.classifier_models ADD CONSTRAINT classifier_models_one_champion "
        "EXCLUDE USING btree (status WITH =) WHERE (status = 'champion') DEFERRABLE INITIALLY DEFERRED"
    )
    op.create_index("classifier_models_created_at_idx", "classifier_models", ["created_at"], schema=S)
    op.execute(f"GRANT SELECT, INSERT ON {S}.labelled_examples TO {APP}")
    op.execute(f"GRANT SELECT, INSERT ON {S}.classifier_models TO {APP}")
    op.execute(f"GRANT UPDATE (status, promoted_at, promoted_by, promotion_reason) ON {S}.classifier_models TO {APP}")
    op.execute(f"GRANT SELECT, INSERT ON {S}.labelled_examples TO {REVIEW}")
    op.execute(f"GRANT SELECT ON {S}.classifier_models TO {REVIEW}")
    op.execute(f"GRANT SELECT ON {S}.labelled_examples TO {MAINTENANCE}")


def downgrade() -> None:
    op.drop_table("classifier_models", schema=S)
    op.drop_table("labelled_examples", schema=S)
