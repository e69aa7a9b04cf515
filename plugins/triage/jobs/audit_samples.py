"""Audit samples: a share of auto-accepted jobs checked by a reviewer, and the named statements of
that check (issue #27, "quality in production"; migration 0026).

An audit sample does not hold its job back. The job completes as any other (its label persisted
and published), and in the same transaction an open ``manual_review`` row with reason
``audit_sample`` is written beside it; its context keeps what the model said (``label``,
``confidence``, ``classifier_version``). The job stays ``completed``: an open review row of a
completed job is therefore normal when, and only when, it is an audit sample, which the
consistency checks know (:func:`triage.jobs.checks.open_review_of_job_in`).

Which jobs are sampled is a pure function of the job id (:func:`is_audit_sample`): a retried
attempt, another worker or a replayed batch samples exactly the same jobs, and the rate is the
expected share.

A reviewer's ``label`` decision on a sample either confirms the model's label (the same label:
resolution ``confirmed``, nothing else changes) or corrects it (another label: resolution
``corrected``). A correction is the move ``completed -> completed`` (the review role's; the jobs
trigger takes a change of ``jobs.corrections`` as a move and logs it): the job's log says who
changed which label to which and why, the document's label is rewritten under the usual order
(a newer job's label still wins), a ``job.completed`` event carries the new label, and the label
goes to the provider afterwards (:func:`triage.review.decisions.send_reviewed_label`). Both
decisions make a labelled example (source ``review``): a person looked at the document.

Statements only: :class:`~triage.jobs.decisions.ReviewDecisions` runs them in the reviewer's
transaction, :func:`triage.jobs.recording.record_txn` runs :func:`open_audit_samples` in the
completion's.
"""

from __future__ import annotations

import hashlib
import uuid
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.expressions import EVENT_SCHEMA_VERSION, NOW, UUID, recordset, status_literal
from triage.jobs.schema import jobs, manual_review, outbox
from triage.jobs.states import EventType
from triage.jobs.states import JobStatus as S

AUDIT_REASON = "audit_sample"
"""The review reason of an audit sample."""

CONFIRMED = "confirmed"
CORRECTED = "corrected"
AUDIT_RESOLUTIONS = frozenset({CONFIRMED, CORRECTED})
"""How a reviewer resolves an audit sample (``manual_review.resolution``)."""

_SCALE = float(1 << 64)


def audit_fraction(job_id: uuid.UUID) -> float:
    """Where ``job_id`` falls in [0, 1): the first 64 bits of a SHA-256 of its bytes. Uniform
    for any id (UUIDv7's time-ordered prefix included), the same on every machine and try."""
    digest = hashlib.sha256(b"triage.audit_sample\x00" + job_id.bytes).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def is_audit_sample(job_id: uuid.UUID, rate: float) -> bool:
    """Whether an auto-accepted ``job_id`` goes to review as an audit sample at ``rate``
    (0: none, 1: all)."""
    return rate > 0.0 and audit_fraction(job_id) < rate


def is_open_audit_sample() -> ColumnElement[bool]:
    """The ``manual_review`` row in scope is an audit sample of the completed ``jobs`` row in
    scope: the one kind of open review whose job is not in ``manual_review``."""
    return sa.and_(manual_review.c.reason == AUDIT_REASON, jobs.c.status == status_literal(S.COMPLETED))


@cache
def open_audit_samples() -> Any:
    """The open audit row of each just-completed job of ``given`` (id, label, confidence,
    classifier_version, uncertainty), in the completion's transaction; a job with an open review keeps it
    (a retry writes nothing twice)."""
    given = recordset(
        "given", id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text, uncertainty=sa.Float
    )
    # ``uncertainty``: the queue's key least sure first (:mod:`.review_uncertainty`), left out
    # when there is none, as for every review row.
    context = sa.func.jsonb_strip_nulls(
        sa.func.jsonb_build_object(
            "label",
            given.c.label,
            "confidence",
            given.c.confidence,
            "classifier_version",
            given.c.classifier_version,
            "uncertainty",
            given.c.uncertainty,
        )
    )
    chosen = sa.select(jobs.c.id, sa.literal(AUDIT_REASON), jobs.c.attempt, context).join_from(
        given, jobs, sa.and_(jobs.c.id == given.c.id, jobs.c.status == status_literal(S.COMPLETED))
    )
    return (
        pg.insert(manual_review)
        .from_select(["job_id", "reason", "attempts", "context"], chosen)
        .on_conflict_do_nothing(index_elements=["job_id"], index_where=manual_review.c.resolved_at.is_(None))
    )


def _text(name: str) -> ColumnElement[Any]:
    """A text parameter typed in the SQL (``jsonb_build_object`` and ``format`` take ``"any"``)."""
    return sa.cast(sa.bindparam(name, type_=sa.Text), sa.Text)


def _open_sample(same_label: bool) -> Any:
    """The open audit row of the completed job ``:p_job_id`` whose model label is (or is not)
    ``:p_label``, locked: a concurrent decision on it waits, then finds it resolved."""
    model_label = manual_review.c.context["label"].astext
    differs = model_label.is_distinct_from(_text("p_label"))
    return (
        sa.select(manual_review.c.id, manual_review.c.job_id, model_label.label("model_label"))
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .where(
            manual_review.c.job_id == sa.bindparam("p_job_id", type_=UUID),
            manual_review.c.resolved_at.is_(None),
            is_open_audit_sample(),
            ~differs if same_label else differs,
        )
        .with_for_update(of=manual_review)
        .cte("sample")
    )


def _resolve(sample: Any, resolution: str, only_if: Any = None) -> Any:
    """Resolve the sample's row as ``resolution``, the reviewer's label kept as ``resolved_label``.
    ``resolved_at IS NULL`` is checked again on the row as updated (a concurrent decision won)."""
    where = [manual_review.c.id == sa.select(sample.c.id).scalar_subquery(), manual_review.c.resolved_at.is_(None)]
    if only_if is not None:
        where.append(sa.exists(sa.select(only_if.c.id)))
    return (
        sa.update(manual_review)
        .where(*where)
        .values(
            resolved_at=NOW,
            resolution=resolution,
            resolved_by=_text("p_actor"),
            note=sa.bindparam("p_note", type_=sa.Text),
            context=manual_review.c.context.op("||")(sa.func.jsonb_build_object("resolved_label", _text("p_label"))),
        )
        .returning(manual_review.c.job_id)
    )


@cache
def confirm_audit_sample() -> Any:
    """A reviewer's ``label`` decision that agrees with the model on the audit sample of
    ``:p_job_id``: the row resolved ``confirmed``; the job, its label and the provider are left
    as they are. Returns the job id; no row: no such open sample with that model label."""
    return _resolve(_open_sample(same_label=True), CONFIRMED)


def correction_reason(model_label: ColumnElement[Any]) -> ColumnElement[Any]:
    """What ``job_events.reason`` says of a correction: the labels and the reviewer's note (who
    made it is the event's actor and login)."""
    return sa.func.format(
        "corrected: label %s -> %s; note: %s",
        sa.func.quote_literal(model_label),
        sa.func.quote_literal(_text("p_label")),
        sa.func.coalesce(_text("p_note"), "(none)"),
    )


@cache
def correct_audit_sample() -> Any:
    """A reviewer's ``label`` decision that differs from the model's on the audit sample of
    ``:p_job_id``: the move ``completed -> completed`` (``corrections`` + 1, status reason
    ``corrected``), the log's reason naming the old and new label and the note, the row resolved
    ``corrected`` and a ``job.completed`` event with the new label. The document's label is
    written by :func:`triage.jobs.outputs.upsert_review_label` in the same transaction.

    The log's reason is ``triage.reason`` for the rest of the transaction (set by an InitPlan of
    the move, before the jobs trigger reads it at the statement's end); the decision's
    transaction moves no other job. Returns the job id; no row: no such open sample, or its job
    is not completed."""
    sample = _open_sample(same_label=False)
    logged = sa.select(sa.func.set_config("triage.reason", correction_reason(sample.c.model_label), True))
    moved = (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.select(sample.c.job_id).scalar_subquery(),
            jobs.c.status == status_literal(S.COMPLETED),
            logged.select_from(sample).scalar_subquery().is_not(None),
        )
        .values(corrections=jobs.c.corrections + 1, status_reason=CORRECTED, updated_at=NOW)
        .returning(jobs.c.id, jobs.c.attempt)
        .cte("moved")
    )
    resolved = _resolve(sample, CORRECTED, only_if=moved).cte("resolved")
    payload = sa.func.jsonb_build_object(
        "resolution",
        CORRECTED,
        "label",
        _text("p_label"),
        "previous_label",
        sa.select(sample.c.model_label).scalar_subquery(),
        "confidence",
        sa.null(),
        "classifier_version",
        sa.func.concat("human:", _text("p_actor")),
        "resolved_by",
        _text("p_actor"),
    )
    event = sa.select(
        moved.c.id, sa.literal(EventType.COMPLETED.value), sa.literal(EVENT_SCHEMA_VERSION), moved.c.attempt, payload
    )
    return (
        sa.insert(outbox)
        .from_select(["job_id", "event_type", "schema_version", "attempt", "payload"], event)
        .returning(outbox.c.job_id)
        .add_cte(resolved)
    )


def awaits_decision() -> ColumnElement[bool]:
    """The open review row in scope waits for a reviewer: its job is in ``manual_review``, or
    it is an audit sample of a completed job (the review queue shows both)."""
    return sa.or_(jobs.c.status == status_literal(S.MANUAL_REVIEW), is_open_audit_sample())
