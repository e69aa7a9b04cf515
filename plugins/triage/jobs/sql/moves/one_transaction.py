"""The moves of a chunk claimed, classified and completed in one transaction (no lease).

An in-process classifier (keyword, learned) answers in microseconds: leasing its jobs
(``queued -> running``) only to complete them milliseconds later writes every job and its log
once more for nothing. Here a chunk of queued jobs is picked ``FOR UPDATE SKIP LOCKED``
(:func:`pick_chunk`: the row locks are the chunk's ownership, the transaction its lease) and each
picked job is moved once, from ``queued`` straight to its outcome, in the same transaction
(:func:`complete_picked`, :func:`review_picked`). A crash rolls the whole chunk back: the jobs
are queued again as if never picked, their attempt not spent. Why that is safe and what
``running`` still means: ``docs/adr/0009-claim-classify-complete-in-one-transaction.md``.

Each move is fenced like a lease holder's (:mod:`.worker`): this job, still ``queued``, at the
attempt before the one the chunk counts; the attempt is counted in the move itself. The trigger
checks ``queued -> completed`` / ``queued -> manual_review`` against ``triage.job_transitions``
and ``triage.transition_roles`` (the app role's; migration 0030) and logs it.

Nothing here executes anything: :mod:`triage.jobs.store.one_transaction` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import jobs, outbox
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import EVENT_COLUMNS, NOW, UUID, outbox_insert, recordset, status_literal
from triage.jobs.sql.moves.worker import HELD, review_rows, to_review
from triage.jobs.vocabulary.states import EventType
from triage.jobs.vocabulary.states import JobStatus as S


@cache
def pick_chunk() -> Any:
    """Lock up to ``:limit`` queued jobs of a batch, step and classifier version, skipping those
    another transaction holds; the rows of :class:`~triage.jobs.vocabulary.models.ClaimedJob`,
    with the attempt the chunk counts (``attempt + 1``, written by the move that settles the job).

    Only ``queued`` jobs that no claim ever died under: a retry (``retryable_failed``), a suspect
    of poison isolation (``suspect_cap``) and a job parked on an outage go through the leased
    claim (:func:`triage.jobs.sql.moves.worker.claim_batch`), whose attempt counting finds a
    poison document. Served by ``jobs_claimable_idx``.
    """
    return (
        sa.select(
            jobs.c.id,
            jobs.c.idempotency_key,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.content_sha256,
            jobs.c.payload_ref,
            jobs.c.classifier_version,
            jobs.c.correlation_id,
            jobs.c.step,
            (jobs.c.attempt + 1).label("attempt"),
            jobs.c.max_attempts,
            jobs.c.created_at,
            jobs.c.attempt_base,
        )
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
            jobs.c.status == status_literal(S.QUEUED),
            jobs.c.attempt < jobs.c.max_attempts,
            jobs.c.suspect_cap.is_(None),
            jobs.c.classifier_version == sa.bindparam("p_classifier_version", type_=sa.Text),
        )
        .order_by(jobs.c.next_attempt_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )


def _parsed_once(name: str, rows: Any) -> Any:
    """The chunk's row set (a :func:`~triage.jobs.sql.expressions.recordset`) as a CTE: the move
    reads it twice (the ids of :func:`_picked`'s init plan, then the join), and a function in
    FROM is called again at each read: the chunk's JSON was parsed twice (and validated twice,
    by its cast), ~1.5 µs a job each time. A CTE read twice is materialized once."""
    return sa.select(rows).cte(name)


def _picked(rows: Any) -> list[ColumnElement[bool]]:
    """The fence of every move of a picked job: this job, still queued, one attempt before the chunk's.

    The jobs are reached through the primary key (``id = ANY(ARRAY(…))`` of the batch's own ids,
    an init plan), not by joining the batch to every queued job: ``status = 'queued'`` matches
    the whole rest of the day, and the planner read all of it for each chunk (a bitmap scan of
    the batch's queued rows: 35-40 ms a chunk of 1,000 at the start of a 100,000-document day).

    The state is checked on the row the key found, never looked up in an index: written as a
    plain ``status = 'queued'``, the planner (guessing a few hundred queued jobs) still ANDed the
    key's bitmap with one of ``jobs_open_idx``'s entries for ``queued``, the whole rest of the
    day (100,000 entries read for each chunk at the start of a 100,000-document day, ~3.7 ms of
    a chunk's completion and as much of its move to review). ``IS TRUE`` says the same of a
    NOT NULL column and matches no index."""
    ids = sa.select(rows.c.id).correlate(None).scalar_subquery()
    return [
        jobs.c.id == sa.any_(sa.func.array(ids)),
        jobs.c.id == rows.c.id,
        (jobs.c.status == status_literal(S.QUEUED)).is_(sa.true()),
        jobs.c.attempt == rows.c.attempt - 1,
    ]


@cache
def complete_picked() -> Any:
    """``queued -> completed`` with the attempt counted and the ``job.completed`` event (its id
    from the batch, its payload the label), as :func:`~triage.jobs.sql.moves.worker.complete`."""
    held = _parsed_once(
        "to_complete",
        recordset("held", **HELD, event_id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text),
    )
    done = (
        sa.update(jobs)
        .where(*_picked(held))
        .values(status=status_literal(S.COMPLETED), status_reason="completed", attempt=held.c.attempt, updated_at=NOW)
        .returning(*EVENT_COLUMNS, held.c.event_id, held.c.label, held.c.confidence, held.c.classifier_version)
        .cte("done")
    )
    return outbox_insert(done, EventType.COMPLETED, E.label_payload(done)).returning(outbox.c.job_id)


@cache
def review_picked() -> Any:
    """``queued -> manual_review`` with the attempt counted, a reason and context, its review row
    and its ``job.needs_review`` event, as :func:`~triage.jobs.sql.moves.worker.send_to_review`."""
    held = _parsed_once("to_review", review_rows())
    return to_review(held, _picked(held), attempt=held.c.attempt)
