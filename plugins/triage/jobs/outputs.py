"""What a job's work leaves behind besides its state, as named SQLAlchemy Core statements: the
model's classification of each attempt, and the business output, ``document_labels``.

Nothing here executes anything: :mod:`triage.jobs.store` runs these in the transaction of the
move they belong to.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.expressions import NOW, UUID, recordset
from triage.jobs.schema import classifications, document_labels, jobs


@cache
def upsert_labels() -> Any:
    """Write the business output. A write from an older job (by ``job_created_at``, then id)
    never replaces a newer one, so a stale retry or an older classifier version loses."""
    given = recordset("given", id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text)
    newest = (
        sa.select(
            jobs.c.source,
            jobs.c.external_id,
            given.c.label,
            given.c.confidence,
            given.c.classifier_version,
            jobs.c.content_sha256,
            jobs.c.id,
            jobs.c.created_at,
        )
        .join_from(given, jobs, jobs.c.id == given.c.id)
        .distinct(jobs.c.source, jobs.c.external_id)  # DISTINCT ON; SQLAlchemy 2.0 (Airflow's pin)
        .order_by(jobs.c.source, jobs.c.external_id, jobs.c.created_at.desc(), jobs.c.id.desc())
    )
    stmt = pg.insert(document_labels).from_select(
        [
            "source",
            "external_id",
            "label",
            "confidence",
            "classifier_version",
            "content_sha256",
            "job_id",
            "job_created_at",
        ],
        newest,
    )
    current = document_labels
    return stmt.on_conflict_do_update(
        index_elements=["source", "external_id"],
        set_={
            "label": stmt.excluded.label,
            "confidence": stmt.excluded.confidence,
            "classifier_version": stmt.excluded.classifier_version,
            "content_sha256": stmt.excluded.content_sha256,
            "job_id": stmt.excluded.job_id,
            "job_created_at": stmt.excluded.job_created_at,
            "updated_at": NOW,
        },
        where=sa.tuple_(current.c.job_created_at, current.c.job_id)
        <= sa.tuple_(stmt.excluded.job_created_at, stmt.excluded.job_id),
    )


@cache
def record_classifications() -> Any:
    """One row per job and attempt that produced a model outcome (idempotent per attempt)."""
    given = recordset(
        "given",
        job_id=UUID,
        attempt=sa.Integer,
        label=sa.Text,
        confidence=sa.Float,
        outcome=sa.Text,
        rejected_reason=sa.Text,
        classifier_version=sa.Text,
        latency_ms=sa.Float,
        prompt_tokens=sa.Integer,
        completion_tokens=sa.Integer,
        cost_usd=sa.Numeric(12, 6),
        usage_discarded=sa.Text,
        output_mode=sa.Text,
        input_sha256=sa.Text,
        reused_job_id=UUID,
        reused_attempt=sa.Integer,
        candidates=pg.JSONB,
    )
    names = [c.name for c in given.c]
    return (
        pg.insert(classifications)
        .from_select(names, sa.select(*[given.c[n] for n in names]))
        .on_conflict_do_nothing(index_elements=["job_id", "attempt"])
    )


@cache
def upsert_review_label() -> Any:
    """:func:`upsert_labels` (the same stale-write rule) returning the job id of each row it
    wrote: a reviewer's label that lost to a newer job's returns nothing."""
    return upsert_labels().returning(document_labels.c.job_id)
