"""The model's top candidate labels, with their scores, on each classification.

Revision ID: 0028
Revises: 0025
Create Date: 2026-12-05

Issue #27, item 6 (review that teaches the model fast): a reviewer sees what the model hesitated
between, and the queue can be worked in the order of what the model is least sure of.

- ``classifications.candidates``: JSONB, at most three ``{"label": ..., "score": ...}`` objects,
  best first, written with the row by the classifiers that score every label (the learned
  classifier's probabilities, the keyword classifier's per-label confidences); NULL where the
  classifier gave none (an LLM names one label only; rows older than this revision). A CHECK
  keeps it an array of at most three, so the queue's margin reads ``candidates -> 0`` and
  ``-> 1`` only.

No index: the queue ordered by uncertainty joins each open review to its latest classification
by ``(job_id, attempt)`` (the unique index) and sorts the open reviews; measured at 100,000 open
reviews in docs/review.md.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0028"
down_revision = "0025"
branch_labels = None
depends_on = None

S = "triage"
CHECK = "candidates IS NULL OR (jsonb_typeof(candidates) = 'array' AND jsonb_array_length(candidates) <= 3)"


def upgrade() -> None:
    op.add_column("classifications", sa.Column("candidates", pg.JSONB), schema=S)
    op.create_check_constraint("classifications_candidates_shape_check", "classifications", CHECK, schema=S)


def downgrade() -> None:
    op.drop_constraint("classifications_candidates_shape_check", "classifications", schema=S, type_="check")
    op.drop_column("classifications", "candidates", schema=S)
