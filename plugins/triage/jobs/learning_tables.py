"""The learning loop's tables (migration 0025), in the job tables' metadata (:mod:`.schema`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import NOW, metadata

__all__ = ["classifier_models", "labelled_examples"]

# Human ground truth for the learned classifier (migration 0025, triage.learning): one row per
# labelled document, idempotent by (source, external_id). Imported history names its file's
# source; a reviewer's ``label`` decision is source ``review`` with the job id as external id,
# written in the decision's transaction. The text is a claim check like a job's: the payload
# store's reference and the content hash it is verified against. A model's own labels never
# come here.
labelled_examples = sa.Table(
    "labelled_examples",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("external_id", sa.Text, nullable=False),
    # A label the taxonomy has or had (0026): labels are retired, never deleted, so an example of
    # a retired label stays as history, and training skips it (label_outside_taxonomy).
    sa.Column("label", sa.Text, sa.ForeignKey("triage.taxonomy_labels.name"), nullable=False),
    sa.Column("content_sha256", sa.Text, nullable=False),
    sa.Column("payload_ref", sa.Text, nullable=False),
    sa.Column("labelled_by", sa.Text, nullable=False),
    sa.Column("labelled_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("job_id", pg.UUID(as_uuid=True)),  # the reviewed job (source review); NULL when imported
    sa.UniqueConstraint("source", "external_id", name="labelled_examples_source_external_id_key"),
    sa.CheckConstraint("length(content_sha256) = 64", name="content_sha256"),
    sa.CheckConstraint("label ~ '^[a-z][a-z0-9_]{0,63}$'", name="label"),
    # Serves training's read of the newest label of each content.
    sa.Index("labelled_examples_content_sha256_idx", "content_sha256", "labelled_at"),
    comment="Labelled examples: human ground truth the learned classifier trains on",
)

# The learned classifier's registry (migration 0025, triage.learning.registry): a model version
# is data. Its artifact (arrays and vocabulary, never pickle) is kept here beside its SHA-256,
# which loading verifies; at most one champion, the model runs of classifier ``learned`` use.
classifier_models = sa.Table(
    "classifier_models",
    metadata,
    sa.Column("version", sa.Text, primary_key=True),
    sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'candidate'")),
    sa.Column("taxonomy_sha256", sa.Text, nullable=False),
    sa.Column("training_set_sha256", sa.Text, nullable=False),
    sa.Column("label_counts", pg.JSONB, nullable=False),  # training examples per label
    sa.Column("metrics", pg.JSONB, nullable=False),  # held-out metrics (triage.learning.metrics)
    sa.Column("thresholds", pg.JSONB, nullable=False),  # label -> confidence to accept, null: never
    sa.Column("target_precision", sa.Float, nullable=False),
    sa.Column("params", pg.JSONB, nullable=False),  # how it was trained (features, model, split)
    sa.Column("artifact", sa.LargeBinary, nullable=False),
    sa.Column("artifact_sha256", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("promoted_at", sa.DateTime(timezone=True)),
    sa.Column("promoted_by", sa.Text),
    sa.Column("promotion_reason", sa.Text),
    sa.CheckConstraint("status IN ('candidate', 'champion', 'retired')", name="status"),
    sa.CheckConstraint("length(artifact_sha256) = 64", name="artifact_sha256"),
    sa.CheckConstraint("target_precision > 0 AND target_precision <= 1", name="target_precision"),
    # At most one champion, checked at commit: a promotion retires the old one in the same statement.
    pg.ExcludeConstraint(
        (sa.column("status"), "="),
        name="classifier_models_one_champion",
        where=sa.text("status = 'champion'"),
        deferrable=True,
        initially="DEFERRED",
    ),
    sa.Index("classifier_models_created_at_idx", "created_at"),
    comment="Learned classifier versions: training set, held-out metrics, thresholds, artifact, status",
)
