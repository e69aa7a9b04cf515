"""The content cache reuses a doubtful answer too: ``classifications_answers_idx`` holds the
model's own ``inconclusive`` answers beside its ``accepted`` ones.

Revision ID: 0016
Revises: 0013
Create Date: 2026-12-01

Identical classifier input under the same classifier version (model, prompt, temperature,
taxonomy) is expected to get the same answer again, a doubtful one included: a repeat of a text
whose answer fell below the confidence threshold now goes to review at once, naming the answer it
reused, instead of paying for the same doubtful answer twice (issue #17). The index serves the
classify step's lookup of a claim's contents; a rejected answer (malformed output) is still no
entry, since a provider's glitch is worth asking again.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0013"
branch_labels = None
depends_on = None

S = "triage"
COLUMNS = ["input_sha256", "classifier_version", "id"]


def _index(outcomes: str) -> None:
    op.create_index(
        "classifications_answers_idx",
        "classifications",
        COLUMNS,
        schema=S,
        postgresql_where=sa.text(f"outcome IN ({outcomes}) AND reused_job_id IS NULL AND input_sha256 IS NOT NULL"),
    )


def upgrade() -> None:
    op.drop_index("classifications_answers_idx", table_name="classifications", schema=S)
    _index("'accepted', 'inconclusive'")


def downgrade() -> None:
    op.drop_index("classifications_answers_idx", table_name="classifications", schema=S)
    _index("'accepted'")
