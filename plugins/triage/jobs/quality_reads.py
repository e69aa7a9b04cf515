"""The ledger's reads behind the quality figures (:mod:`triage.reconciliation.quality`), as named
read-only SQLAlchemy Core statements: what each classifier version labelled per day, and what
reviewers decided of it. Nothing here writes.

Days are UTC dates. A window of ``:days`` days back from now bounds every read: classifications
by ``created_at`` (a BRIN index, migration 0026), decisions by ``resolved_at`` (the partial index
of decided reviews). The version of a decision is its job's ``classifier_version``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.audit_samples import AUDIT_REASON, CONFIRMED, CORRECTED
from triage.jobs.expressions import NOW
from triage.jobs.schema import classifications, jobs, manual_review

REVIEWER_DECISIONS = ("labelled", "requeued", "rejected", CONFIRMED, CORRECTED)
"""Resolutions a reviewer writes (``superseded`` is reconciliation's)."""
LABEL_DECISIONS = ("labelled", CONFIRMED, CORRECTED)
"""Resolutions that give the document a reviewer's label (``context ->> 'resolved_label'``)."""


def _day(at: ColumnElement[Any]) -> ColumnElement[Any]:
    return sa.cast(sa.func.timezone("UTC", at), sa.Date)


def _since() -> ColumnElement[Any]:
    return NOW - sa.func.make_interval(0, 0, 0, sa.bindparam("days", type_=sa.Integer))


def _agreed() -> ColumnElement[bool]:
    """The reviewer's label is the model's proposal (``context ->> 'label'``)."""
    return manual_review.c.context["resolved_label"].astext == manual_review.c.context["label"].astext


@cache
def classified_by_version_day() -> sa.Select[Any]:
    """Per classifier version and day: the jobs it classified (an answer of any outcome) and of
    them the jobs it auto-accepted."""
    day = _day(classifications.c.created_at).label("day")
    return (
        sa.select(
            classifications.c.classifier_version.label("version"),
            day,
            sa.func.count(sa.distinct(classifications.c.job_id)).label("classified"),
            sa.func.count(sa.distinct(classifications.c.job_id))
            .filter(classifications.c.outcome == "accepted")
            .label("accepted"),
        )
        .where(classifications.c.created_at >= _since())
        .group_by(classifications.c.classifier_version, day)
        .order_by(classifications.c.classifier_version, day)
    )


@cache
def decisions_by_version_day() -> sa.Select[Any]:
    """Per classifier version and day of the decision: audit samples confirmed and corrected,
    and inconclusive jobs a reviewer labelled, with how many got the model's proposal."""
    day = _day(manual_review.c.resolved_at).label("day")
    audit = manual_review.c.reason == AUDIT_REASON
    inconclusive_labelled = sa.and_(manual_review.c.reason == "inconclusive", manual_review.c.resolution == "labelled")
    return (
        sa.select(
            jobs.c.classifier_version.label("version"),
            day,
            sa.func.count().filter(audit, manual_review.c.resolution == CONFIRMED).label("confirmed"),
            sa.func.count().filter(audit, manual_review.c.resolution == CORRECTED).label("corrected"),
            sa.func.count().filter(inconclusive_labelled).label("inconclusive_labelled"),
            sa.func.count().filter(inconclusive_labelled, _agreed()).label("inconclusive_agreed"),
        )
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .where(
            manual_review.c.resolved_at.is_not(None),
            manual_review.c.resolved_at >= _since(),
            sa.or_(audit, inconclusive_labelled),
        )
        .group_by(jobs.c.classifier_version, day)
        .order_by(jobs.c.classifier_version, day)
    )


@cache
def open_audit_samples_by_version() -> sa.Select[Any]:
    """Audit samples waiting for a reviewer, per classifier version (the open queue's reason index)."""
    return (
        sa.select(jobs.c.classifier_version.label("version"), sa.func.count().label("open"))
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .where(manual_review.c.resolved_at.is_(None), manual_review.c.reason == AUDIT_REASON)
        .group_by(jobs.c.classifier_version)
        .order_by(jobs.c.classifier_version)
    )


@cache
def reviewers_by_day() -> sa.Select[Any]:
    """Per day: reviewers' decisions, how many reviewers made them, and of their label decisions
    on a job the model proposed a label for, how many agreed with the model."""
    day = _day(manual_review.c.resolved_at).label("day")
    proposed = sa.and_(
        manual_review.c.resolution.in_(LABEL_DECISIONS), manual_review.c.context["label"].astext.is_not(None)
    )
    return (
        sa.select(
            day,
            sa.func.count().label("decisions"),
            sa.func.count(sa.distinct(manual_review.c.resolved_by)).label("reviewers"),
            sa.func.count().filter(proposed).label("with_proposal"),
            sa.func.count().filter(proposed, _agreed()).label("agreed"),
        )
        .where(
            manual_review.c.resolved_at.is_not(None),
            manual_review.c.resolved_at >= _since(),
            manual_review.c.resolution.in_(REVIEWER_DECISIONS),
        )
        .group_by(day)
        .order_by(day)
    )
