"""The job store: the public API of the ledger. No Airflow imports.

Every public method owns one transaction (``engine.begin()``), names who acts in it (the
trigger logs the actor of every transition), runs named statements (the moves of
:mod:`.transitions`, :mod:`.recovery` and :mod:`.review_transitions`, the writes of
:mod:`.outputs`, the reads of :mod:`.queries`, the settings of :mod:`.session`), and
translates database errors into :mod:`triage.jobs.errors`. The private ``_x_txn(conn, …)`` helpers never commit, so a caller
that needs several writes in one transaction composes them.

A fenced write that matches fewer rows than it was given raises: a lost or expired lease, a
stale attempt, an unknown job. The whole transaction rolls back; nothing is half-written and
nothing is silently overwritten.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from uuid6 import uuid7

from triage.contracts.events import WorkEvent
from triage.jobs import outbox as O
from triage.jobs import outputs, queries, recovery, review_transitions, session
from triage.jobs import transitions as T
from triage.jobs import usage as usage_bounds
from triage.jobs.backoff import RetryPolicy
from triage.jobs.errors import (
    JobNotFound,
    LabelNotInTaxonomy,
    LeaseExpired,
    LeaseLost,
    LedgerError,
    NotInReview,
    ReplayLimitReached,
    StaleAttempt,
    UnknownStatus,
    translate,
)
from triage.jobs.expressions import rowset
from triage.jobs.models import (
    REVIEW_RESOLUTIONS,
    Advance,
    Claim,
    ClaimedJob,
    ClassificationRecord,
    Complete,
    Fail,
    LabelWrite,
    LeaseRelease,
    NewJob,
    Outcome,
    Recorded,
    Registered,
    Release,
    RetryLater,
    ReviewCase,
    ReviewDecision,
    ReviewResult,
    SendToReview,
)
from triage.jobs.schema import jobs
from triage.jobs.states import JobStatus

DEFAULT_ACTOR = "triage"

log = logging.getLogger(__name__)


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), default=str, sort_keys=True)


class JobStore:
    """The ledger over one engine.

    :param engine: a SQLAlchemy engine on the job database (psycopg 3).
    :param retry_policy: backoff for :class:`RetryLater` outcomes that carry no delay.
    :param rng: source of jitter (seed it in tests).
    """

    def __init__(self, engine: sa.Engine, *, retry_policy: RetryPolicy | None = None,
                 rng: random.Random | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.retry_policy = retry_policy or RetryPolicy()
        self._rng = rng or random.Random()

    @contextmanager
    def transaction(self, actor: str | None = DEFAULT_ACTOR) -> Iterator[sa.Connection]:
        """One transaction with ``triage.actor`` set; ledger errors come out translated.

        ``actor=None`` sets nothing: the trigger then names the lease owner of each row, which
        is right for a lease holder's own writes and saves a round trip per batch.
        """
        try:
            with self.engine.begin() as conn:
                if actor is not None:
                    conn.execute(session.set_actor(), {"actor": actor})
                yield conn
        except sa.exc.DBAPIError as exc:
            ledger_error = translate(exc)
            if ledger_error is not None:
                raise ledger_error from exc
            raise

    # -- retrieval ------------------------------------------------------------------------

    def register(self, new_jobs: Sequence[NewJob], *, batch_key: str, step: str, max_attempts: int,
                 actor: str = DEFAULT_ACTOR) -> Registered:  # fmt: skip
        """Register documents idempotently: job and outbox event in one transaction.

        A key registered before (in this call or any earlier one) adds nothing.
        """
        with self.transaction(actor) as conn:
            return register_txn(conn, new_jobs, batch_key=batch_key, step=step, max_attempts=max_attempts)

    # -- a worker's lease -----------------------------------------------------------------

    def claim(self, *, batch_key: str, step: str, limit: int, lease_seconds: float, owner: str,
              actor: str | None = None, classifier_version: str | None = None) -> Claim:  # fmt: skip
        """Claim up to ``limit`` claimable jobs of a batch and step under one fresh lease token.

        :param classifier_version: only jobs registered for this version (the classify step
            passes its classifier's); None takes any version (a step that runs no classifier).
        """
        if limit < 1 or lease_seconds <= 0:
            raise ValueError("claim needs limit >= 1 and lease_seconds > 0")
        token = uuid.uuid4()
        with self.transaction(actor) as conn:  # None: the trigger names the new lease owner
            rows = conn.execute(
                T.claim_batch(versioned=classifier_version is not None),
                {"p_batch_key": batch_key, "p_step": step, "limit": limit, "lease_seconds": lease_seconds,
                 "owner": owner, "token": token, "p_classifier_version": classifier_version},
            ).all()  # fmt: skip
        expires = min((r.lease_expires_at for r in rows), default=None)
        # RETURNING lists ClaimedJob's fields in order; positional construction keeps a claim of
        # thousands of jobs cheap.
        claimed = tuple(ClaimedJob(*row[:13]) for row in rows)
        return Claim(token=token, owner=owner, expires_at=expires or datetime.min, jobs=claimed)

    def heartbeat(self, claim: Claim, lease_seconds: float, job_ids: Sequence[uuid.UUID] | None = None) -> datetime:
        """Extend the lease of the claim's jobs (or of ``job_ids``); returns the new expiry.

        Raises :class:`LeaseLost` or :class:`LeaseExpired` if any of them is no longer held.
        """
        ids = list(job_ids if job_ids is not None else (j.id for j in claim.jobs))
        with self.transaction(claim.owner) as conn:
            rows = conn.execute(T.extend_leases(), {"ids": ids, "token": claim.token,
                                                    "lease_seconds": lease_seconds}).all()  # fmt: skip
            _check_fenced(conn, ids, {r.id for r in rows}, claim.token, None)
        return min((r.lease_expires_at for r in rows), default=claim.expires_at)

    def record(self, claim: Claim | uuid.UUID, outcomes: Sequence[Outcome], actor: str | None = None) -> Recorded:
        """Record a batch of outcomes of jobs held under ``claim``, in one transaction.

        Given the :class:`Claim`, a retry's backoff grows with the attempt within the job's
        current budget; given only its token, with the job's attempt (never a shorter wait).
        """
        token, bases = (claim.token, {j.id: j.attempt_base for j in claim.jobs}) if isinstance(claim, Claim) \
            else (claim, None)  # fmt: skip
        with self.transaction(actor) as conn:  # None: the trigger names the lease owner
            return record_txn(conn, token, outcomes, self.retry_policy, self._rng, bases)

    # -- recovery -------------------------------------------------------------------------

    def release_expired_leases(self, *, max_rescues: int = 3, limit: int = 10_000, actor: str = "reconciliation",
                               earlier_tries_of: str | None = None, owner: str | None = None,
                               batch_key: str | None = None) -> LeaseRelease:  # fmt: skip
        """Return every job whose lease ran out (see :func:`recovery.release_expired_leases`).

        :param earlier_tries_of: an owner prefix (a task instance); its leases other than
            ``owner`` (the current try) are returned too, expired or not.
        :param batch_key: only jobs of this batch.
        """
        params = {"max_rescues": max_rescues, "limit": limit, "owner_prefix": earlier_tries_of, "owner": owner,
                  "p_batch_key": batch_key}  # fmt: skip
        with self.transaction(actor) as conn:
            rows = conn.execute(recovery.release_expired_leases(), params).all()
        to_review = sum(1 for r in rows if r.status == JobStatus.MANUAL_REVIEW.value)
        return LeaseRelease(retrying=len(rows) - to_review, to_review=to_review, job_ids=tuple(r.id for r in rows))

    def send_batch_to_review(self, batch_key: str, *, reason: str, error: str | None, owner_prefix: str,
                             context: Mapping[str, Any] | None = None, actor: str = "failure_callback",
                             take_unleased: bool = True, run_prefix: str | None = None,
                             step: str | None = None) -> int:  # fmt: skip
        """Move the batch's unfinished jobs to ``manual_review``; returns how many moved.

        :param take_unleased: also the jobs nobody holds (queued, retryable, waiting); False
            takes only the leases of ``owner_prefix`` and expired ones (a failed map index
            leaves the rest to its siblings).
        :param run_prefix: only the work of this DAG run (``dag/run/``): expired leases of its
            tasks, and unleased jobs whose latest move it made. None: every run's (for a batch
            whose runs are all over).
        :param step: only the jobs at this step. None: every step.

        Idempotent: a second call finds nothing left to move.
        """
        with self.transaction(actor) as conn:
            rows = conn.execute(
                recovery.send_batch_to_review(),
                {"p_batch_key": batch_key, "reason": reason, "error": error, "owner_prefix": owner_prefix,
                 "context": _json(context or {}), "take_unleased": take_unleased, "run_prefix": run_prefix,
                 "p_step": step},
            ).all()  # fmt: skip
        return len(rows)

    # -- review decisions ---------------------------------------------------------------
    # Each is one transaction with the reviewer as its actor. Applying the same decision again
    # changes nothing and returns ``already_applied``; a different decision on a job that is no
    # longer in review raises :class:`NotInReview`. Every refusal rolls back whole.

    def resolve_with_label(self, job_id: uuid.UUID, label: str, *, actor: str, note: str | None = None,
                           taxonomy_names: Collection[str]) -> ReviewResult:  # fmt: skip
        """Review decision: the job is done with the reviewer's ``label``.

        ``manual_review -> completed``, the review row resolved ``labelled``, a ``job.completed``
        event, and the label upserted into ``document_labels`` (classifier version
        ``human:<actor>``, no confidence) under the usual rule: a newer job's label stands.
        No ``classifications`` row: those are the model's attempts, and a human label in them
        would skew its acceptance rate, latency and cost.

        :raises LabelNotInTaxonomy: ``label`` is not in ``taxonomy_names`` (checked first).
        """
        if label not in taxonomy_names:
            raise LabelNotInTaxonomy(f"label {label!r} is not in the taxonomy ({', '.join(sorted(taxonomy_names))})")
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "p_actor": actor, "p_note": note, "p_label": label}
            if conn.execute(review_transitions.label_from_review(), params).first() is None:
                return _review_miss(conn, job_id, "label", label=label)
            written = conn.execute(
                outputs.upsert_review_label(),
                rowset("given", [{"id": job_id, "label": label, "confidence": None,
                                    "classifier_version": f"human:{actor}"}]),
            ).first()  # fmt: skip
            return _review_applied(conn, job_id, "label", label=label, label_written=written is not None)

    def reject(self, job_id: uuid.UUID, *, actor: str, note: str | None = None) -> ReviewResult:
        """Review decision: no attempt will ever succeed. ``manual_review -> terminal_failed``,
        the review row resolved ``rejected`` and a ``job.reviewed`` event."""
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "p_actor": actor, "p_note": note}
            if conn.execute(review_transitions.reject_from_review(), params).first() is None:
                return _review_miss(conn, job_id, "reject")
            return _review_applied(conn, job_id, "reject")

    def resolve_with_requeue(self, job_id: uuid.UUID, *, actor: str, note: str | None = None,
                             max_replays: int = 3) -> ReviewResult:  # fmt: skip
        """Review decision: try again. ``manual_review -> queued`` as a fresh job: a new budget
        of as many attempts as it had (numbered on from its last one, so every attempt keeps
        its classification and events), no lease rescues or last error; a replay counted up to
        ``max_replays``, the review row resolved ``requeued`` and a ``job.requeued`` event (the
        reviewer is the actor).

        :raises ReplayLimitReached: the job is in review and was requeued ``max_replays`` times.
        """
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "max_replays": max_replays, "p_actor": actor, "p_note": note}
            if conn.execute(review_transitions.requeue_from_review(), params).first() is None:
                return _review_miss(conn, job_id, "requeue", max_replays=max_replays)
            return _review_applied(conn, job_id, "requeue")

    def open_reviews(self, job_ids: Sequence[uuid.UUID] | None = None, *, limit: int = 100) -> list[ReviewCase]:
        """Jobs waiting for a reviewer (of ``job_ids``, or all), oldest review first."""
        with self.engine.connect() as conn:
            rows = conn.execute(queries.open_review_cases(),
                                {"ids": None if job_ids is None else list(job_ids), "limit": limit}).all()  # fmt: skip
        return [ReviewCase(**{**r._asdict(), "context": dict(r.context or {})}) for r in rows]

    # -- the outbox -----------------------------------------------------------------------

    def relay(self, publish: Callable[[list[WorkEvent]], None], *, limit: int = 1000,
              actor: str = "outbox_relay", claim_seconds: float = 300.0) -> int:  # fmt: skip
        """Send up to ``limit`` unsent events through ``publish`` and mark them sent.

        Three short transactions, none open while ``publish`` runs (a webhook batch may take
        long): claim the events (:func:`triage.jobs.outbox.claim_events`; other relays skip
        them for ``claim_seconds``), send them, mark them published (fenced on the claim). If
        ``publish`` raises, the claim is released and the events go out next time. If the
        process dies between sending and marking, the claim runs out and another relay sends
        them again: delivery is at least once, and the event id lets the receiver refuse a
        duplicate. ``actor`` names the relay in its log lines (the outbox has no event log).
        """
        if limit < 1 or claim_seconds <= 0:
            raise ValueError("relay needs limit >= 1 and claim_seconds > 0")
        token = uuid.uuid4()
        with self.transaction(None) as conn:  # no job moves here: no actor to set
            conn.execute(O.claim_lock())
            rows = conn.execute(O.claim_events(), {"limit": limit, "token": token,
                                                   "lease_seconds": claim_seconds}).all()  # fmt: skip
        if not rows:
            return 0
        fence = {"token": token}
        try:
            events = [event_from_row(r) for r in rows]
            publish(events)
        except BaseException:
            try:
                with self.transaction(None) as conn:
                    conn.execute(O.release_events(), fence)
            except Exception as exc:  # noqa: BLE001 - the sink's error is the one to raise; the claim runs out
                log.warning("%s: claim %s not released (%s); its events wait until it runs out",
                            actor, token, type(exc).__name__)  # fmt: skip
            raise
        with self.transaction(None) as conn:
            marked = conn.execute(O.mark_published(), fence).rowcount
        if marked < len(events):
            log.warning("%s: %d of %d events sent under claim %s were claimed again after it ran out; "
                        "they will be sent again", actor, len(events) - marked, len(events), token)  # fmt: skip
        return len(events)

    # -- reading --------------------------------------------------------------------------

    def status_counts(self, batch_key: str | None = None) -> dict[JobStatus, int]:
        query = sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)
        if batch_key is not None:
            query = query.where(jobs.c.batch_key == batch_key)
        with self.engine.connect() as conn:
            counts = {JobStatus(status): n for status, n in conn.execute(query)}
        return {s: counts.get(s, 0) for s in JobStatus}

    def next_due(
        self, batch_key: str, step: str, classifier_version: str | None = None
    ) -> tuple[datetime | None, datetime]:
        """(earliest ``next_attempt_at`` of the step's retryable jobs or None, the database's now);
        with ``classifier_version``, of that version's jobs only (those a claim of it may take)."""
        params = {"p_batch_key": batch_key, "p_step": step, "p_classifier_version": classifier_version}
        with self.engine.connect() as conn:
            due, now = conn.execute(queries.next_due(), params).one()
        return due, now

    def open_in_step(self, batch_key: str, step: str, classifier_version: str | None = None) -> int:
        params = {"p_batch_key": batch_key, "p_step": step, "p_classifier_version": classifier_version}
        with self.engine.connect() as conn:
            return int(conn.execute(queries.open_in_step(), params).scalar_one())

    def accepted_labels(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, LabelWrite]:
        """The label each job's latest accepted classification gave it."""
        with self.engine.connect() as conn:
            rows = conn.execute(queries.accepted_classifications(), {"ids": list(job_ids)}).all()
        return {r.job_id: LabelWrite(r.label, r.confidence, r.classifier_version) for r in rows}

    def get_status(self, job_id: uuid.UUID) -> JobStatus:
        with self.engine.connect() as conn:
            status = conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id)).scalar()
        if status is None:
            raise JobNotFound(f"job {job_id} does not exist")
        return parse_status(status)


def event_from_row(row: Any) -> WorkEvent:
    """The event of an outbox row (its ``payload`` as JSON text or already decoded); an empty
    payload is none (see :meth:`WorkEvent.to_json`)."""
    payload = row.payload
    if isinstance(payload, str):
        payload = None if payload == "{}" else json.loads(payload)
    return WorkEvent(event_id=row.event_id, job_id=row.job_id, event_type=row.event_type,
                     schema_version=row.schema_version, attempt=row.attempt, occurred_at=row.occurred_at,
                     correlation_id=row.correlation_id, payload_ref=row.payload_ref, payload=payload or None)  # fmt: skip


def parse_status(value: str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise UnknownStatus(f"{value!r} is not a job state; states: {', '.join(s.value for s in JobStatus)}") from None


# -- review decisions (never commit) ------------------------------------------------------------

_DECISION_ENDS = {"label": JobStatus.COMPLETED, "reject": JobStatus.TERMINAL_FAILED}


def _review_applied(conn: sa.Connection, job_id: uuid.UUID, decision: ReviewDecision, *, label: str | None = None,
                    label_written: bool | None = None) -> ReviewResult:  # fmt: skip
    row = conn.execute(queries.review_state(), {"p_job_id": job_id}).one()
    return ReviewResult(job_id, decision, already_applied=False, status=parse_status(row.status),
                        resolved_by=row.resolved_by, resolved_at=row.resolved_at, label=label,
                        label_written=label_written)  # fmt: skip


def _review_miss(conn: sa.Connection, job_id: uuid.UUID, decision: ReviewDecision, *, label: str | None = None,
                 max_replays: int | None = None) -> ReviewResult:  # fmt: skip
    """Why a decision's fenced write matched nothing: the same decision stands already (returned
    as ``already_applied``), or a named refusal. Only reads; the transaction wrote nothing."""
    row = conn.execute(queries.review_state(), {"p_job_id": job_id}).first()
    if row is None:
        raise JobNotFound(f"job {job_id} does not exist")
    status = parse_status(row.status)
    if status == JobStatus.MANUAL_REVIEW:
        if decision == "requeue" and max_replays is not None and row.replays >= max_replays:
            raise ReplayLimitReached(f"job {job_id} was requeued {row.replays} times (limit {max_replays})")
        raise NotInReview(f"job {job_id} changed while the decision was applied; apply it again")  # a lost race
    same = (
        row.resolution == REVIEW_RESOLUTIONS[decision]
        and _DECISION_ENDS.get(decision, status) == status
        and (decision != "label" or row.resolved_label == label)
    )
    if same:
        return ReviewResult(job_id, decision, already_applied=True, status=status, resolved_by=row.resolved_by,
                            resolved_at=row.resolved_at, label=label)  # fmt: skip
    if row.resolution is None:
        raise NotInReview(f"job {job_id} is {status.value}, not in manual_review")
    earlier = f"{row.resolution}" + (f" as {row.resolved_label!r}" if row.resolved_label else "")
    raise NotInReview(f"job {job_id} is {status.value}, not in manual_review: its review was already resolved "
                      f"({earlier} by {row.resolved_by} at {row.resolved_at:%Y-%m-%d %H:%M:%S %Z})")  # fmt: skip


# -- transaction bodies (never commit) ------------------------------------------------------


def register_txn(conn: sa.Connection, new_jobs: Sequence[NewJob], *, batch_key: str, step: str,
                 max_attempts: int) -> Registered:  # fmt: skip
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    queued = [j for j in new_jobs if j.status == JobStatus.QUEUED]
    review = [j for j in new_jobs if j.status == JobStatus.MANUAL_REVIEW]
    if len(queued) + len(review) != len(new_jobs):
        bad = next(j for j in new_jobs if j not in queued and j not in review)
        raise LedgerError(f"a job is registered as queued or manual_review, not {bad.status}")
    scalars = {"batch_key": batch_key, "step": step, "max_attempts": max_attempts}
    new_ids: list[uuid.UUID] = []
    if queued:
        rows = rowset("new", (_new_job_row(j) for j in queued))
        new_ids += conn.execute(T.register_queued(), {**scalars, **rows}).scalars().all()
    if review:
        rows = rowset("new", ({**_new_job_row(j), "reason": j.reason or "malformed_input", "error": j.error,
                                 "context": _json(j.review_context)} for j in review))  # fmt: skip
        new_ids += conn.execute(T.register_for_review(), {**scalars, **rows}).scalars().all()
    return Registered(new=len(new_ids), existing=len(new_jobs) - len(new_ids), new_ids=tuple(new_ids))


def _new_job_row(job: NewJob) -> dict[str, Any]:
    # Time-ordered ids (UUIDv7): a batch registered together sits together in every index
    # keyed by job id (jobs, job_events, outbox), instead of touching a random page per row.
    job_id = uuid7()
    return {"id": job_id, "idempotency_key": job.idempotency_key, "source": job.source,
            "external_id": job.external_id, "content_sha256": job.content_sha256, "payload_ref": job.payload_ref,
            "classifier_version": job.classifier_version, "correlation_id": job.correlation_id or str(job_id)}  # fmt: skip


def record_txn(conn: sa.Connection, token: uuid.UUID, outcomes: Sequence[Outcome], policy: RetryPolicy,
               rng: random.Random, bases: Mapping[uuid.UUID, int] | None = None) -> Recorded:  # fmt: skip
    """Record outcomes set-based: one statement per kind, all fenced on (job, attempt, token);
    then, once the fence held for every job, the classifications and the labels.

    :param bases: each job's ``attempt_base`` (from its claim): the backoff of a retry counts
        the attempts of the current budget only, so a requeued job starts from the short waits.
    """
    ids = [o.job_id for o in outcomes]
    if len(set(ids)) != len(ids):
        raise LedgerError("one outcome per job in a batch")
    attempts = {o.job_id: o.attempt for o in outcomes}
    by_kind: dict[type, list[Any]] = {}
    for outcome in outcomes:
        by_kind.setdefault(type(outcome), []).append(outcome)

    counts: dict[str, int] = {}
    touched: set[uuid.UUID] = set()

    def run(statement: Any, kind: type, extra: Callable[[Any], dict[str, Any]] | None = None) -> Sequence[Any]:
        """The fenced statement over the outcomes of ``kind``: one row each (id, attempt, and
        what ``extra`` adds); the ids it touched are kept for the fence check."""
        rows = rowset("held", ({"id": o.job_id, "attempt": o.attempt, **(extra(o) if extra else {})}
                                 for o in by_kind[kind]))  # fmt: skip
        moved = conn.execute(statement, {"token": token, **rows}).all()
        touched.update(r[0] for r in moved)
        return moved

    def retry_row(o: RetryLater) -> dict[str, Any]:
        base = bases.get(o.job_id, 0) if bases else 0
        delay = o.delay_seconds if o.delay_seconds is not None else policy.delay(o.attempt - base, rng)
        return {"error_class": o.error_class, "error": o.error, "delay_seconds": delay}

    conn.execute(session.fenced_write_joins())
    if Complete in by_kind:
        counts["completed"] = len(run(T.complete(), Complete))
    if Advance in by_kind:
        counts["advanced"] = len(run(T.advance(), Advance, lambda o: {"next_step": o.next_step}))
    if RetryLater in by_kind:
        moved = run(T.retry_later(), RetryLater, retry_row)
        exhausted = sum(1 for r in moved if r.status == JobStatus.MANUAL_REVIEW.value)
        counts["exhausted"], counts["retrying"] = exhausted, len(moved) - exhausted
    if SendToReview in by_kind:
        counts["to_review"] = len(run(T.send_to_review(), SendToReview, lambda o: {
            "reason": o.reason, "error_class": o.error_class, "error": o.error, "context": _json(o.context)}))  # fmt: skip
    if Fail in by_kind:
        counts["failed"] = len(run(T.fail(), Fail, lambda o: {
            "reason": o.reason, "error_class": o.error_class, "error": o.error}))  # fmt: skip
    if Release in by_kind:
        counts["released"] = len(run(T.release(), Release))
    _check_fenced(conn, ids, touched, token, attempts)
    conn.execute(session.default_joins())

    classified = [o for o in outcomes if not isinstance(o, Release) and o.classification is not None]
    if classified:
        conn.execute(outputs.record_classifications(), rowset("given", map(_classification_row, classified)))
    if labelled := [o for o in by_kind.get(Complete, ()) if o.label is not None]:
        conn.execute(outputs.upsert_labels(), rowset("given", (
            {"id": o.job_id, "label": o.label.label, "confidence": o.label.confidence,
             "classifier_version": o.label.classifier_version} for o in labelled)))  # fmt: skip
    return Recorded(**counts)


def _classification_row(outcome: Any) -> dict[str, Any]:
    """The row of an outcome's classification. Usage figures are bounded here too, whoever made
    the record: one the columns cannot hold would fail the whole batch (:mod:`triage.jobs.usage`)."""
    record: ClassificationRecord = outcome.classification
    usage, discarded = usage_bounds.bounded(latency_ms=record.latency_ms, prompt_tokens=record.prompt_tokens,
                                            completion_tokens=record.completion_tokens, cost_usd=record.cost_usd)  # fmt: skip
    named = [n for n in (record.usage_discarded or "").split(",") if n]
    named += [n for n in discarded if n not in named]
    return {"job_id": outcome.job_id, "attempt": outcome.attempt, "label": record.label,
            "confidence": record.confidence, "outcome": record.outcome, "rejected_reason": record.rejected_reason,
            "classifier_version": record.classifier_version, **usage,
            "usage_discarded": ",".join(named) or None}  # fmt: skip


def _check_fenced(conn: sa.Connection, wanted: Sequence[uuid.UUID], got: set[uuid.UUID], token: uuid.UUID,
                  attempts: Mapping[uuid.UUID, int] | None) -> None:  # fmt: skip
    """Raise the named error for the first job a fenced write missed."""
    missing = [i for i in wanted if i not in got]
    if not missing:
        return
    seen = {r.id: r for r in conn.execute(queries.describe_jobs(), {"ids": missing})}
    first = missing[0]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    row = seen.get(first)
    if row is None:
        raise JobNotFound(f"job {first} does not exist{more}")
    if row.status != JobStatus.RUNNING.value or row.lease_token != token:
        raise LeaseLost(f"job {first} is {row.status} and no longer held under lease {token}{more}")
    if attempts is not None and row.attempt != attempts.get(first):
        raise StaleAttempt(f"job {first} is at attempt {row.attempt}, not {attempts.get(first)}{more}")
    if not row.in_time:
        raise LeaseExpired(f"the lease {token} on job {first} has expired{more}")
    raise LeaseLost(f"job {first} was not written under lease {token}{more}")
