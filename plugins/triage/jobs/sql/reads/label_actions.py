"""What the label action (:mod:`triage.ports.label_actions`) asks of the ledger, decided in SQL.

- :func:`superseded`: which of these jobs' documents already have a newer job's label in
  ``document_labels``. Their action is skipped: sending an older label after the newer one
  would leave the provider with the older, while the ledger keeps the newer. The order is the
  one every label write obeys (``job_created_at``, then ``job_id``: :func:`triage.jobs.sql.writes.outputs.upsert_labels`).
- :func:`reviewed_label`: the label a reviewer gave a job, to send through the same action
  after the decision committed, under a key of its own (the job's key and its review).

Only reads: the decisions these inform were, or will be, written by the fenced statements of
:mod:`triage.jobs.sql.moves.worker` and :mod:`triage.jobs.sql.moves.review`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import document_labels, jobs
from triage.jobs.sql.expressions import UUID, status_literal
from triage.jobs.sql.reads.queries import latest_review
from triage.jobs.vocabulary.states import JobStatus as S


def _newer_label_stands() -> ColumnElement[bool]:
    """A newer job's label is the document's (the document of the ``jobs`` row in scope)."""
    return sa.exists().where(
        document_labels.c.source == jobs.c.source,
        document_labels.c.external_id == jobs.c.external_id,
        sa.tuple_(document_labels.c.job_created_at, document_labels.c.job_id) > sa.tuple_(jobs.c.created_at, jobs.c.id),
    )


@cache
def superseded_jobs() -> Any:
    """Of the jobs ``:ids``, those whose document has a newer job's label."""
    return sa.select(jobs.c.id).where(
        jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))), _newer_label_stands()
    )


REVIEWER_LABELS = ("labelled", "confirmed", "corrected")
"""The resolutions that give a completed job a reviewer's label (the last two: an audit sample's)."""


@cache
def reviewed_label_of() -> Any:
    """The job ``:p_job_id`` if a reviewer completed it with a label (or confirmed or corrected
    its audited label), with that label, its review row and whether a newer job's label has
    since become the document's."""
    review = latest_review()
    return (
        sa.select(
            jobs.c.id,
            jobs.c.idempotency_key,
            jobs.c.created_at,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.correlation_id,
            review.c.id.label("review_id"),
            review.c.resolved_label.label("label"),
            review.c.resolution,
            review.c.resolved_by,
            _newer_label_stands().label("superseded"),
        )
        .select_from(jobs)
        .join(review, sa.true())
        .where(
            jobs.c.id == sa.bindparam("p_job_id", type_=UUID),
            jobs.c.status == status_literal(S.COMPLETED),
            review.c.resolution.in_(REVIEWER_LABELS),
            review.c.resolved_label.is_not(None),
        )
    )


def superseded(conn: sa.Connection, job_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    if not job_ids:
        return set()
    return set(conn.execute(superseded_jobs(), {"ids": list(job_ids)}).scalars())


@dataclass(frozen=True, slots=True)
class ReviewedLabel:
    """A reviewer's label of a completed job. ``idempotency_key`` is the job's with its review
    row: the same decision applied again asks for the same effect, and the model's action under
    the job's own key (if it ever reached the provider) is another effect."""

    job_id: uuid.UUID
    idempotency_key: str
    job_created_at: datetime
    source: str
    external_id: str
    correlation_id: str
    label: str
    reviewer: str
    superseded: bool
    resolution: str = "labelled"
    """``labelled`` (a job out of review), or on an audit sample ``confirmed`` or ``corrected``."""
    review_id: int = 0

    @property
    def revision(self) -> int | None:
        """A correction replaces a label the provider already has from the same job: its order
        must sort after that one's (:attr:`triage.ports.label_actions.LabelRequest.order`)."""
        return self.review_id if self.resolution == "corrected" else None


def reviewed_label(conn: sa.Connection, job_id: uuid.UUID) -> ReviewedLabel | None:
    """The reviewer's label of ``job_id``; None unless a reviewer completed it with a label."""
    row = conn.execute(reviewed_label_of(), {"p_job_id": job_id}).first()
    if row is None:
        return None
    return ReviewedLabel(
        row.id,
        f"{row.idempotency_key}/review/{row.review_id}",
        row.created_at,
        row.source,
        row.external_id,
        row.correlation_id,
        row.label,
        row.resolved_by,
        bool(row.superseded),
        row.resolution,
        row.review_id,
    )
