"""Model answers: how each was asked for, and an accepted answer reused for the same content.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01

``classifications.output_mode``: how the answer's shape was asked for (``json_schema``, a strict
schema whose label is an enum of the taxonomy, or ``json_object``); NULL for a classifier that
calls no model, and for the rows of earlier revisions.

The content cache (issue #17): an accepted model answer is reused for another job whose classifier
input is the same, under the same classifier version. ``classifications.input_sha256`` is the
SHA-256 of the text the classifier read (subject and body; not ``jobs.content_sha256``, the
payload's hash, which covers its external id and time too, so that the same text under two ids
differs there); ``reused_job_id``/``reused_attempt`` name the classification
(its unique ``(job_id, attempt)``) a reused answer was copied from, NULL for an answer of the
model itself. ``classifications_answers_idx`` holds only the cache's entries (accepted answers of
the model itself) and serves the classify step's lookup of a claim's contents.
``manual_review_labelled_idx`` serves the lookup's refusal to answer for content a reviewer has
labelled.

The answers of earlier revisions are no entries (their input hash is unknown without reading
every payload): the cache starts empty.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None

S = "triage"


def upgrade() -> None:
    op.add_column("classifications", sa.Column("output_mode", sa.Text), schema=S)
    op.add_column("classifications", sa.Column("input_sha256", sa.Text), schema=S)
    op.add_column("classifications", sa.Column("reused_job_id", pg.UUID(as_uuid=True)), schema=S)
    op.add_column("classifications", sa.Column("reused_attempt", sa.Integer), schema=S)
    op.create_check_constraint(
        op.f("classifications_output_mode_known_check"),
        "classifications",
        "output_mode IS NULL OR output_mode IN ('json_schema', 'json_object')",
        schema=S,
    )
    op.create_check_constraint(
        op.f("classifications_reused_whole_check"),
        "classifications",
        "(reused_job_id IS NULL) = (reused_attempt IS NULL)",
        schema=S,
    )
    op.create_index(
        "classifications_answers_idx",
        "classifications",
        ["input_sha256", "classifier_version", "id"],
        schema=S,
        postgresql_where=sa.text("outcome = 'accepted' AND reused_job_id IS NULL AND input_sha256 IS NOT NULL"),
    )
    op.create_index(
        "manual_review_labelled_idx",
        "manual_review",
        ["job_id"],
        schema=S,
        postgresql_where=sa.text("resolution = 'labelled'"),
    )


def downgrade() -> None:
    op.drop_index("manual_review_labelled_idx", table_name="manual_review", schema=S)
    op.drop_index("classifications_answers_idx", table_name="classifications", schema=S)
    op.drop_constraint(op.f("classifications_reused_whole_check"), "classifications", schema=S)
    op.drop_constraint(op.f("classifications_output_mode_known_check"), "classifications", schema=S)
    for column in ("reused_attempt", "reused_job_id", "input_sha256", "output_mode"):
        op.drop_column("classifications", column, schema=S)
