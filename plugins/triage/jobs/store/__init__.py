"""The job store: the public API of the ledger. No Airflow imports.

Every public method owns one transaction (:meth:`~triage.jobs.store.ledger.Ledger.transaction`),
names who acts in it (the trigger logs the actor of every transition), runs named statements
(the moves of :mod:`triage.jobs.sql.moves`, the writes of :mod:`triage.jobs.sql.writes`, the
reads of :mod:`triage.jobs.sql.reads`), and translates
database errors into :mod:`triage.jobs.vocabulary.errors`. A reviewer's decisions (a job's label, reject
or requeue; a replay by filter) are its part ``store.review``
(:class:`~triage.jobs.store.review.ReviewDecisions`); intake, outage probes, dead last tries,
provider batches, model call budgets and retention are parts likewise: no code outside this
package opens a transaction on the ledger. The transaction bodies (``register_txn``, ``record_txn`` of :mod:`.recording`;
:mod:`.review_results`) never commit, so a caller that needs several writes in one transaction
composes them; the outbox relay is :mod:`.relay`.

A fenced write that matches fewer rows than it was given raises: a lost or expired lease, a stale attempt, an unknown
job. The whole transaction rolls back; nothing is half-written and nothing is silently overwritten.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import jobs
from triage.jobs.sql.expressions import context_json, rowset
from triage.jobs.sql.moves import outages, recovery, repairs
from triage.jobs.sql.moves import worker as T
from triage.jobs.sql.reads import answers, queries
from triage.jobs.sql.reads.alerts import RunMoves, run_moves
from triage.jobs.sql.reads.answers import Answer
from triage.jobs.sql.reads.label_actions import superseded
from triage.jobs.store.batches import BatchLedger
from triage.jobs.store.budgets import BudgetRows
from triage.jobs.store.intake import IntakeLedger
from triage.jobs.store.last_tries import DeadLastTries
from triage.jobs.store.learning import LearningRows
from triage.jobs.store.ledger import DEFAULT_ACTOR, Ledger
from triage.jobs.store.one_transaction import Chunks
from triage.jobs.store.probes import OutageProbes
from triage.jobs.store.recording import check_fenced, record_txn, register_txn
from triage.jobs.store.relay import SETTLE_SECONDS, Publish, relay_events
from triage.jobs.store.retention import LedgerRetention
from triage.jobs.store.review import ReviewDecisions
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.errors import JobNotFound
from triage.jobs.vocabulary.models import (
    REPAIRER,
    Claim,
    ClaimedJob,
    LabelWrite,
    LeaseRelease,
    NewJob,
    Outcome,
    Recorded,
    Registered,
)
from triage.jobs.vocabulary.states import JobStatus, parse_status


class JobStore(Ledger):
    """The ledger over one engine: a worker's moves, recovery, repairs, the relay and reads here;
    the rest in named parts over its transactions, each a :class:`~triage.jobs.store.ledger.Part`:
    ``review`` (a reviewer's decisions), ``intake``, ``probes`` (outage probes), ``last_tries``
    (dead last tries), ``batches`` (provider batches), ``budgets`` (model call budgets),
    ``retention``, ``learning`` (labelled examples, the model registry) and ``chunks`` (claim,
    classify and complete in one transaction).

    :param engine: a SQLAlchemy engine on the job database (psycopg 3).
    :param retry_policy: backoff for :class:`RetryLater` outcomes that carry no delay.
    :param rng: source of jitter (seed it in tests).
    """

    def __init__(
        self, engine: sa.Engine, *, retry_policy: RetryPolicy | None = None, rng: random.Random | None = None
    ) -> None:
        super().__init__(engine)
        self.retry_policy = retry_policy or RetryPolicy()
        self._rng = rng or random.Random()
        self.review = ReviewDecisions(self)
        """A reviewer's decisions: label, reject, requeue, a replay by filter (:mod:`.review`)."""
        self.intake = IntakeLedger(self)
        """Documents posted over HTTP: accept them, the work they wait behind (:mod:`.intake`)."""
        self.probes = OutageProbes(self)
        """The half-open probe of an outage (:mod:`.probes`)."""
        self.last_tries = DeadLastTries(self)
        """The jobs a task's dead final try held (:mod:`.last_tries`)."""
        self.batches = BatchLedger(self)
        """The provider batches a backfill's jobs wait on (:mod:`.batches`)."""
        self.budgets = BudgetRows(self)
        """The model connections' shared call budgets (:mod:`.budgets`)."""
        self.retention = LedgerRetention(self)
        """Retention's removals, for an engine of the maintenance role (:mod:`.retention`)."""
        self.learning = LearningRows(self)
        """Labelled examples and the model registry's rows (:mod:`.learning`)."""
        self.chunks = Chunks(self)
        """Chunks claimed, classified and completed in one transaction, no lease (:mod:`.one_transaction`)."""

    # -- retrieval ------------------------------------------------------------------------

    def register(
        self, new_jobs: Sequence[NewJob], *, batch_key: str, step: str, max_attempts: int, actor: str = DEFAULT_ACTOR
    ) -> Registered:
        """Register documents idempotently: job and outbox event in one transaction.

        A key registered before (in this call or any earlier one) adds nothing.
        """
        with self.transaction(actor) as conn:
            return register_txn(conn, new_jobs, batch_key=batch_key, step=step, max_attempts=max_attempts)

    # -- a worker's lease -----------------------------------------------------------------

    def claim(
        self,
        *,
        batch_key: str,
        step: str,
        limit: int,
        lease_seconds: float,
        owner: str,
        actor: str | None = None,
        classifier_version: str | None = None,
    ) -> Claim:
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
                {
                    "p_batch_key": batch_key,
                    "p_step": step,
                    "limit": limit,
                    "lease_seconds": lease_seconds,
                    "owner": owner,
                    "token": token,
                    "p_classifier_version": classifier_version,
                },
            ).all()
        # One expiry for the whole claim: now() is the transaction's start, the same for every row.
        expires = rows[0].lease_expires_at if rows else datetime.min
        # RETURNING lists ClaimedJob's fields in order; positional construction keeps a claim of
        # thousands of jobs cheap.
        claimed = tuple(ClaimedJob(*row[:13]) for row in rows)
        return Claim(token=token, owner=owner, expires_at=expires, jobs=claimed)

    def heartbeat(self, claim: Claim, lease_seconds: float, job_ids: Sequence[uuid.UUID] | None = None) -> datetime:
        """Extend the lease of the claim's jobs (or of ``job_ids``); returns the new expiry.

        Raises :class:`LeaseLost` or :class:`LeaseExpired` if any of them is no longer held.
        """
        ids = list(job_ids if job_ids is not None else (j.id for j in claim.jobs))
        with self.transaction(claim.owner) as conn:
            rows = conn.execute(
                T.extend_leases(), {"ids": ids, "token": claim.token, "lease_seconds": lease_seconds}
            ).all()
            check_fenced(conn, ids, {r.id for r in rows}, claim.token, None)
        return min((r.lease_expires_at for r in rows), default=claim.expires_at)

    def record(self, claim: Claim | uuid.UUID, outcomes: Sequence[Outcome], actor: str | None = None) -> Recorded:
        """Record a batch of outcomes of jobs held under ``claim``, in one transaction.

        Given the :class:`Claim`, a retry's backoff grows with the attempt within the job's
        current budget; given only its token, with the job's attempt (never a shorter wait).
        """
        # Only the jobs with a requeued budget (a base above 0, the default): a fresh claim has none.
        token, bases = (
            (claim.token, {j.id: j.attempt_base for j in claim.jobs if j.attempt_base})
            if isinstance(claim, Claim)
            else (claim, None)
        )
        with self.transaction(actor) as conn:  # None: the trigger names the lease owner
            return record_txn(conn, token, outcomes, self.retry_policy, self._rng, bases, last_in_transaction=True)

    # -- recovery -------------------------------------------------------------------------

    def release_expired_leases(
        self,
        *,
        max_rescues: int = 3,
        limit: int = 10_000,
        actor: str = REPAIRER,
        earlier_tries_of: str | None = None,
        owner: str | None = None,
        batch_key: str | None = None,
    ) -> LeaseRelease:
        """Return every job whose lease ran out (see :func:`recovery.release_expired_leases`).

        :param earlier_tries_of: an owner prefix (a task instance); its leases other than
            ``owner`` (the current try) are returned too, expired or not.
        :param batch_key: only jobs of this batch.
        """
        params = {
            "max_rescues": max_rescues,
            "limit": limit,
            "owner_prefix": earlier_tries_of,
            "owner": owner,
            "p_batch_key": batch_key,
        }
        with self.transaction(actor) as conn:
            rows = conn.execute(recovery.release_expired_leases(), params).all()
        to_review = sum(1 for r in rows if r.status == JobStatus.MANUAL_REVIEW.value)
        return LeaseRelease(retrying=len(rows) - to_review, to_review=to_review, job_ids=tuple(r.id for r in rows))

    def park_unstarted(
        self,
        batch_key: str,
        step: str,
        *,
        dependency: str,
        delay_seconds: float,
        error_class: str | None,
        error: str | None,
        actor: str,
        classifier_version: str | None = None,
        give_back: Mapping[uuid.UUID, int] | None = None,
        backoff: bool = False,
    ) -> int:
        """Park the batch's unclaimed jobs at ``step`` in ``waiting`` on an outage of
        ``dependency`` for ``delay_seconds`` (:func:`triage.jobs.sql.moves.outages.park_unstarted`); how many.

        :param give_back: job id -> attempt that failed on the outage before it was recognised
            as one: that attempt is given back if it is still the job's latest.
        :param backoff: grow the delay with each job's earlier outage parkings (no ``Retry-After``)."""
        params = {
            "p_batch_key": batch_key,
            "p_step": step,
            "p_classifier_version": classifier_version,
            "dependency": dependency,
            "delay_seconds": delay_seconds,
            "backoff": backoff,
            "error_class": error_class,
            "error": error,
            **rowset("given", ({"id": i, "attempt": a} for i, a in (give_back or {}).items())),
        }
        with self.transaction(actor) as conn:
            return len(conn.execute(outages.park_unstarted(), params).all())

    def resume_parked(
        self,
        batch_key: str,
        step: str,
        *,
        actor: str,
        classifier_version: str | None = None,
    ) -> tuple[int, datetime | None]:
        """Queue the batch's jobs parked on an outage whose time has come; (how many, when the
        earliest still parked is due or None)."""
        params = {"p_batch_key": batch_key, "p_step": step, "p_classifier_version": classifier_version}
        with self.transaction(actor) as conn:
            resumed = len(conn.execute(outages.resume_parked(), params).all())
            due, _ = conn.execute(outages.next_parked_due(), params).one()
        return resumed, due

    def send_batch_to_review(
        self,
        batch_key: str,
        *,
        reason: str,
        error: str | None,
        owner_prefix: str,
        context: Mapping[str, Any] | None = None,
        actor: str = "failure_callback",
        take_unleased: bool = True,
        run_prefix: str | None = None,
        step: str | None = None,
    ) -> int:
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
                {
                    "p_batch_key": batch_key,
                    "reason": reason,
                    "error": error,
                    "owner_prefix": owner_prefix,
                    "context": context_json(context or {}),
                    "take_unleased": take_unleased,
                    "run_prefix": run_prefix,
                    "p_step": step,
                },
            ).all()
        return len(rows)

    # -- reconciliation's repairs -------------------------------------------------------
    # One transaction each, under the repairs' lock, actor ``reconciliation``, fenced on the very condition its check
    # counts (:mod:`triage.jobs.sql.moves.repairs`, :mod:`triage.jobs.sql.reads.checks`): a job that moved on since is not matched. Each returns the ids it moved.

    def queue_stuck_received(self, *, older_than_seconds: float) -> list[uuid.UUID]:
        """``received -> queued`` (``reconciliation_queued``) with the ``job.registered`` event,
        for jobs received more than ``older_than_seconds`` ago: retrieval's own last step."""
        return self._repair(repairs.queue_stuck_received(), threshold=older_than_seconds)

    def send_spent_retries_to_review(self, *, grace_seconds: float) -> list[uuid.UUID]:
        """``retryable_failed -> manual_review`` (``retries_exhausted``, with its review row) for
        jobs whose attempts are spent: no claim can ever take them."""
        return self._repair(repairs.send_spent_retries_to_review(), grace=grace_seconds)

    def open_missing_reviews(self, *, grace_seconds: float) -> list[uuid.UUID]:
        """The open review row of jobs in ``manual_review`` that have none."""
        return self._repair(repairs.open_missing_reviews(), grace=grace_seconds)

    def supersede_reviews_of_terminal_jobs(self, *, grace_seconds: float) -> list[uuid.UUID]:
        """Resolve as ``superseded`` the open review rows of jobs already terminal."""
        return self._repair(repairs.supersede_reviews_of_terminal_jobs(), grace=grace_seconds)

    def append_missing_completion_events(self, *, grace_seconds: float) -> list[uuid.UUID]:
        """The ``job.completed`` event of completed jobs that have none."""
        return self._repair(repairs.append_missing_completion_events(), grace=grace_seconds)

    def send_orphans_to_review(self, *, idle_seconds: float) -> list[uuid.UUID]:
        """``queued``/``retryable_failed -> manual_review`` (``orphaned``, with its review row)
        for claimable jobs of batches nobody has touched for ``idle_seconds``: a run that died
        with no failure callback and no Airflow API to tell (:func:`repairs.send_orphans_to_review`)."""
        return self._repair(repairs.send_orphans_to_review(), threshold=idle_seconds)

    def _repair(self, statement: Any, **params: float) -> list[uuid.UUID]:
        with self.transaction(REPAIRER) as conn:
            conn.execute(repairs.lock())
            return list(conn.execute(statement, params).scalars())

    # -- the outbox -----------------------------------------------------------------------

    def relay(
        self,
        publish: Publish,
        *,
        limit: int = 1000,
        actor: str = "outbox_relay",
        claim_seconds: float = 300.0,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> int:
        """Send up to ``limit`` unsent events through ``publish`` and advance the watermark past them.

        Two short transactions, none open while ``publish`` runs (a webhook batch may take
        long): claim the next range of events (:func:`triage.jobs.sql.writes.outbox.claim_events`;
        other relays skip it for ``claim_seconds``), send them, mark the claim sent and advance
        the watermark (fenced on the claim). If ``publish`` raises, the claim is released and
        the events go out next time. If the process dies between sending and marking, the claim
        runs out and another relay takes it over and sends them again: delivery is at least
        once, and the event id lets the receiver refuse a duplicate. ``actor`` names the relay
        in its log lines (the outbox has no event log). Committed events held back by a
        transaction still running are waited for up to ``settle_seconds`` (0: not at all, they
        are the next call's; :func:`~triage.jobs.store.relay.relay_events`)."""
        return relay_events(
            self.transaction,
            publish,
            limit=limit,
            actor=actor,
            claim_seconds=claim_seconds,
            settle_seconds=settle_seconds,
        )

    def relay_all(
        self,
        publish: Publish,
        *,
        limit: int = 5000,
        actor: str = "outbox_relay",
        claim_seconds: float = 300.0,
    ) -> int:
        """:meth:`relay` until no unsent event is left (``limit`` a batch, each batch's mark and
        the next one's claim in one transaction); returns how many were sent."""
        return relay_events(
            self.transaction, publish, limit=limit, actor=actor, claim_seconds=claim_seconds, batches=None
        )

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

    def reusable_answers(
        self, inputs: Mapping[uuid.UUID, str], *, classifier_version: str, threshold: float
    ) -> tuple[frozenset[uuid.UUID], dict[uuid.UUID, Answer]]:
        """The content cache (:mod:`triage.jobs.sql.reads.answers`) for jobs and the hash of their classifier input:
        the jobs that may take a reused answer, and the entry each of those has now."""
        given = rowset("given", ({"id": job_id, "input_sha256": key} for job_id, key in inputs.items()))
        params = {**given, "classifier_version": classifier_version, "threshold": threshold}
        with self.engine.connect() as conn:
            rows = conn.execute(answers.reusable_answers(), params).all()
        eligible = frozenset(r.job_id for r in rows if r.eligible)
        found = {
            r.job_id: Answer(r.from_job_id, r.from_attempt, r.label, r.confidence or 0.0, r.output_mode)
            for r in rows
            if r.eligible and r.from_job_id is not None
        }
        return eligible, found

    def open_review_reasons(self) -> list[tuple[str, int]]:
        """Open reviews by reason, most first."""
        with self.engine.connect() as conn:
            return [(reason, n) for reason, n in conn.execute(queries.open_review_reasons())]

    def payload_of(self, job_id: uuid.UUID) -> tuple[str, str] | None:
        """The job's payload reference and content hash; None: no such job."""
        with self.engine.connect() as conn:
            row = conn.execute(queries.payload_of(), {"p_job_id": job_id}).first()
        return None if row is None else (row.payload_ref, row.content_sha256)

    def superseded(self, job_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Of ``job_ids``, those whose document has a newer job's label (:mod:`triage.jobs.sql.reads.label_actions`)."""
        with self.engine.connect() as conn:
            return superseded(conn, job_ids)

    def run_moves(self, *, batch_key: str, run_prefix: str, since: datetime | None = None) -> RunMoves:
        """What one DAG run moved into the states that need a person (:mod:`triage.jobs.sql.reads.alerts`)."""
        with self.engine.connect() as conn:
            return run_moves(conn, batch_key=batch_key, run_prefix=run_prefix, since=since)

    def get_status(self, job_id: uuid.UUID) -> JobStatus:
        with self.engine.connect() as conn:
            status = conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id)).scalar()
        if status is None:
            raise JobNotFound(f"job {job_id} does not exist")
        return parse_status(status)
