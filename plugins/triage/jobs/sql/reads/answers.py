"""The content cache's one question to the ledger, as a named statement: for each job of a claim,
may it take a reused answer, and which answer of the model is there for its input?

The key is ``input_sha256``, the SHA-256 of the text the classifier reads (subject and body), not
the payload's ``content_sha256``, which covers the external id and time too. An entry is a
classification that is the model's own (not itself reused), ``accepted`` or ``inconclusive`` (a
doubtful answer: identical input to the same classifier version gets the same doubtful answer
again, so its repeat goes to review at once, naming the answer it reused), of the same
``classifier_version`` and input: an answer of the llm, the one classifier the cache runs for
(``classifications_answers_idx`` holds no other since migration 0036). A ``rejected`` answer
(malformed output) is no entry: a provider's glitch is worth asking again. An answer with at least the run's confidence threshold
wins over one below it; among those the oldest, so every reuse of an input names the same answer.
A job may take one only if no reviewer requeued it (``replays = 0``: a reviewer who asks again
wants the model asked again) and no reviewer has labelled a job whose classification had the same
input, or corrected the model's label of one (an audit sample, resolution ``corrected``), in any
version (a person's decision about that text is never contradicted by a cached answer of the
model). A job labelled by a reviewer without any classification (its call failed
permanently) is not seen by that guard.

What invalidates an entry is what changes the classifier version: the model, the prompt
(``prompt_version``), the temperature or the taxonomy. Nothing else expires.

Nothing here executes anything: :meth:`triage.jobs.store.JobStore.reusable_answers` runs it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import CACHED_VERSIONS, DECIDED_LABEL, classifications, jobs, manual_review
from triage.jobs.sql.expressions import UUID, recordset

__all__ = ["Answer", "reusable_answers"]


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer of the model (accepted or doubtful), as the cache hands it on: the
    classification it is (``job_id``, ``attempt``) and what it said (``label`` None: no label)."""

    job_id: uuid.UUID
    attempt: int
    label: str | None
    confidence: float
    output_mode: str | None


@cache
def reusable_answers() -> Any:
    """One row per job of ``:given_rows`` (``id``, ``input_sha256``): ``job_id``, ``eligible``
    (it may take a reused answer), and the entry for its input (``from_job_id``,
    ``from_attempt``, ``label``, ``confidence``, ``output_mode``; NULL: none). Served by
    ``classifications_answers_idx`` (one probe per job) and ``manual_review_decided_label_idx``."""
    given = recordset("given", id=UUID, input_sha256=sa.Text)
    c = classifications
    batch = (
        sa.select(given.c.id, given.c.input_sha256, jobs.c.replays)
        .join_from(given, jobs, jobs.c.id == given.c.id)
        .cte("batch")
    )
    labelled = (
        sa.select(c.c.input_sha256)
        .join_from(manual_review, c, c.c.job_id == manual_review.c.job_id)
        .where(
            manual_review.c.resolution.in_(DECIDED_LABEL),
            c.c.input_sha256.in_(sa.select(batch.c.input_sha256)),
        )
        .cte("labelled")
    )
    entry = (
        sa.select(
            c.c.job_id.label("from_job_id"),
            c.c.attempt.label("from_attempt"),
            c.c.label,
            c.c.confidence,
            c.c.output_mode,
        )
        .where(
            c.c.input_sha256 == batch.c.input_sha256,
            c.c.classifier_version == sa.bindparam("classifier_version", type_=sa.Text),
            c.c.outcome.in_(("accepted", "inconclusive")),
            c.c.reused_job_id.is_(None),
            # Always true of the llm's version; said so that the planner matches the index's predicate.
            sa.func.starts_with(c.c.classifier_version, CACHED_VERSIONS),
        )
        .order_by((c.c.confidence >= sa.bindparam("threshold", type_=sa.Float)).desc().nulls_last(), c.c.id)
        .limit(1)
        .lateral("entry")
    )
    eligible = sa.and_(batch.c.replays == 0, batch.c.input_sha256.not_in(sa.select(labelled.c.input_sha256))).label(
        "eligible"
    )
    return sa.select(
        batch.c.id.label("job_id"),
        eligible,
        entry.c.from_job_id,
        entry.c.from_attempt,
        entry.c.label,
        entry.c.confidence,
        entry.c.output_mode,
    ).outerjoin_from(batch, entry, sa.true())
