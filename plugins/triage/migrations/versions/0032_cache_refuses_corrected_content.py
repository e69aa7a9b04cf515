"""The content cache refuses content a reviewer corrected, as it refuses content a reviewer labelled.

Revision ID: 0032
Revises: 0030
Create Date: 2026-12-05

Issue #27: a corrected audit sample (``manual_review.resolution = 'corrected'``, migration 0026)
is a person's decision that the model's answer for that text was wrong, as a ``labelled``
review is; the content cache's lookup now refuses to reuse an answer for either. The partial
index that serves that refusal, ``manual_review_labelled_idx`` (0013, ``resolution =
'labelled'``), gives way to ``manual_review_decided_label_idx`` over both resolutions, so the
lookup's condition still matches an index predicate.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0030"
branch_labels = None
depends_on = None

S = "triage"


def upgrade() -> None:
    op.create_index(
        "manual_review_decided_label_idx",
        "manual_review",
        ["job_id"],
        schema=S,
        postgresql_where=sa.text("resolution IN ('labelled', 'corrected')"),
    )
    op.drop_index("manual_review_labelled_idx", table_name="manual_review", schema=S)


def downgrade() -> None:
    op.create_index(
        "manual_review_labelled_idx",
        "manual_review",
        ["job_id"],
        schema=S,
        postgresql_where=sa.text("resolution = 'labelled'"),
    )
    op.drop_index("manual_review_decided_label_idx", table_name="manual_review", schema=S)
