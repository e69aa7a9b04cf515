"""``classifications_answers_idx`` holds the llm classifier's answers only: the cache's entries.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-05

Issue #29 (PostgreSQL's CPU a document): the content cache reuses an answer of a classifier that
calls a model (``llm``; the classify step builds no cache for keyword or learned, which answer in
microseconds), and reads its entries through ``classifications_answers_idx``. The index still took
every accepted or doubtful answer of every classifier: each keyword or learned classification was an
entry nothing read, at a random place of the index (its key leads with the SHA-256 of the input),
~3 µs of the server's CPU a document (``python -m bench pipeline-profile``, the index dropped and not,
alternating), and an index that grew with every day of in-process classification.

The predicate gains ``starts_with(classifier_version, 'llm:')``: the llm's versions begin so
(``llm:<model>:<prompt>:t<temperature>+tax-…``), keyword's with ``keyword-`` and learned's with
``learned-``. The cache's lookup (``triage.jobs.sql.reads.answers``) states the same condition, so
that the planner proves the predicate; the index is built again with only the llm's rows (one read
of ``classifications``, as 0016 did).

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

S = "triage"
INDEX = "classifications_answers_idx"
COLUMNS = ["input_sha256", "classifier_version", "id"]
ENTRY = "outcome IN ('accepted', 'inconclusive') AND reused_job_id IS NULL AND input_sha256 IS NOT NULL"


def _index(predicate: str) -> None:
    op.drop_index(INDEX, table_name="classifications", schema=S)
    op.create_index(INDEX, "classifications", COLUMNS, schema=S, postgresql_where=sa.text(predicate))


def upgrade() -> None:
    _index(f"{ENTRY} AND starts_with(classifier_version, 'llm:')")


def downgrade() -> None:
    _index(ENTRY)
