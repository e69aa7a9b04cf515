"""The model's top candidate labels on each classification, and the queue least sure first.

Revision ID: 0028
Revises: 0026
Create Date: 2026-12-05

Issue #27, item 6 (review that teaches the model fast): a reviewer sees what the model hesitated
between, and works through the queue in the order of what the model is least sure of.

- ``classifications.candidates``: JSONB, at most three ``{"label": ..., "score": ...}`` objects,
  best first, written with the row by the classifiers that score every label (the learned
  classifier's probabilities, the keyword classifier's per-label confidences); NULL where the
  classifier gave none (an LLM names one label) and on older rows. A CHECK keeps it an array of
  at most three.
- The review row carries the uncertainty of the answer that opened it in ``context``
  (``uncertainty``: the margin between the first two candidates, else the confidence), written
  with the row; two partial indexes on that key then ``created_at, id`` serve the queue least sure
  first, as a whole and per reason (a key of one table: the candidates live in another). The
  reviews open now get their key from their job's latest classification (its confidence: no
  candidates existed before this revision).

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0028"
down_revision = "0026"
branch_labels = None
depends_on = None

S = "triage"
CHECK = "candidates IS NULL OR (jsonb_typeof(candidates) = 'array' AND jsonb_array_length(candidates) <= 3)"
UNCERTAINTY = (
    "(CASE WHEN jsonb_typeof(context -> 'uncertainty') = 'number'"
    " THEN GREATEST(LEAST((context -> 'uncertainty')::numeric, 2), -1)::double precision"
    " ELSE 2::double precision END)"
)
OPEN = "resolved_at IS NULL"
BACKFILL = f"""
UPDATE {S}.manual_review m
   SET context = m.context || jsonb_build_object('uncertainty', latest.confidence)
  FROM (SELECT DISTINCT ON (c.job_id) c.job_id, c.confidence
          FROM {S}.classifications c
          JOIN {S}.manual_review r ON r.job_id = c.job_id AND r.resolved_at IS NULL
         ORDER BY c.job_id, c.attempt DESC) latest
 WHERE m.job_id = latest.job_id AND m.resolved_at IS NULL AND latest.confidence IS NOT NULL
   AND NOT m.context ? 'uncertainty'
"""


def upgrade() -> None:
    op.add_column("classifications", sa.Column("candidates", pg.JSONB), schema=S)
    op.create_check_constraint("classifications_candidates_shape_check", "classifications", CHECK, schema=S)
    op.execute(BACKFILL)
    op.execute(
        f"CREATE INDEX manual_review_open_uncertainty_idx ON {S}.manual_review ({UNCERTAINTY}, created_at, id)"
        f" WHERE {OPEN}"
    )
    op.execute(
        f"CREATE INDEX manual_review_open_reason_uncertainty_idx ON {S}.manual_review"
        f" (reason, {UNCERTAINTY}, created_at, id) WHERE {OPEN}"
    )


def downgrade() -> None:
    op.drop_index("manual_review_open_reason_uncertainty_idx", table_name="manual_review", schema=S)
    op.drop_index("manual_review_open_uncertainty_idx", table_name="manual_review", schema=S)
    op.drop_constraint("classifications_candidates_shape_check", "classifications", schema=S, type_="check")
    op.drop_column("classifications", "candidates", schema=S)
