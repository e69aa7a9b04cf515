"""Every way a job can move, as named SQLAlchemy Core statements.

Each statement is one fenced, set-based write: ``UPDATE … WHERE <expected state and lease> …
RETURNING``. Batches travel as one JSON document (:func:`rowset`, read by
``json_to_recordset``), so a statement costs one round trip whatever its size. The trigger on ``triage.jobs`` checks each move against
``triage.job_transitions`` and logs it in ``triage.job_events``; these statements set
``status_reason``, which the trigger copies into the log.

Nothing here executes anything: :mod:`triage.jobs.store` runs these inside its transactions.
Each builder is cached: a statement is built once per process and reused (rebuilding the
constructs cost more than a round trip per call, measured).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import classifications, document_labels, job_events, job_status, jobs, manual_review, outbox
from triage.jobs.states import UNFINISHED
from triage.jobs.states import JobStatus as S

EVENT_SCHEMA_VERSION = 1
UUID = pg.UUID(as_uuid=True)
NOW = sa.func.now()


def _recordset(name: str, **columns: Any) -> Any:
    """``json_to_recordset(:name_rows) AS name(a type, b type, …)``: a batch of rows in one
    parameter. One JSON document is a tenth of the client work of one array per column
    (psycopg dumps arrays element by element in Python) and faster for the server too, measured."""
    return (
        sa.func.json_to_recordset(sa.cast(sa.bindparam(f"{name}_rows", type_=sa.Text), pg.JSON))
        .table_valued(*[sa.column(col, type_) for col, type_ in columns.items()])
        .render_derived(name=name, with_types=True)
    )


def _json_default(value: Any) -> str:
    return str(value)  # UUIDs, datetimes, decimals


def rowset(name: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The parameter of a statement that reads ``json_to_recordset(:<name>_rows) AS name(…)``
    (:func:`_recordset`): the batch's rows as one JSON document, keyed by column name."""
    return {f"{name}_rows": json.dumps(list(rows), default=_json_default, allow_nan=False)}


def seconds_param(param: str) -> ColumnElement[Any]:
    return sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.bindparam(param, type_=sa.Float))


def status_literal(value: S) -> ColumnElement[Any]:
    """A state as a typed SQL constant: the planner matches it to partial indexes, and CASE
    branches resolve to the enum rather than text."""
    return sa.literal_column(f"'{value.value}'::triage.job_status", job_status)


NO_LEASE: dict[str, Any] = {"lease_owner": None, "lease_token": None, "lease_expires_at": None}


def outbox_insert(rows: Any, event_type: str) -> Any:
    """INSERT one outbox event per row of ``rows`` (a CTE returning the job's id and attempt).

    The envelope goes into columns; :func:`triage.jobs.outbox.claim_events` joins the job's
    correlation id and payload reference when the relay claims it.
    """
    return sa.insert(outbox).from_select(
        ["job_id", "event_type", "schema_version", "attempt"],
        sa.select(rows.c.id, sa.literal(event_type), sa.literal(EVENT_SCHEMA_VERSION), rows.c.attempt),
    )


EVENT_COLUMNS = (jobs.c.id, jobs.c.attempt)
NEW_JOB_COLUMNS = dict(
    id=UUID,
    idempotency_key=sa.Text,
    source=sa.Text,
    external_id=sa.Text,
    content_sha256=sa.Text,
    payload_ref=sa.Text,
    classifier_version=sa.Text,
    correlation_id=sa.Text,
)


@cache
def register_queued() -> Any:
    """Register new jobs as ``queued`` with their ``job.registered`` outbox events.

    ``ON CONFLICT (idempotency_key) DO NOTHING``: a key seen before registers nothing, so
    re-running a date is free. Returns the ids of the new jobs only.
    """
    new = _recordset("new", **NEW_JOB_COLUMNS)
    inserted = (
        pg.insert(jobs)
        .from_select(
            [*NEW_JOB_COLUMNS, "batch_key", "step", "status", "status_reason", "max_attempts"],
            sa.select(
                *[new.c[name] for name in NEW_JOB_COLUMNS],
                sa.bindparam("batch_key", type_=sa.Text),
                sa.bindparam("step", type_=sa.Text),
                status_literal(S.QUEUED),
                sa.literal("registered"),
                sa.bindparam("max_attempts", type_=sa.Integer),
            ),
        )
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(*EVENT_COLUMNS)
        .cte("inserted")
    )
    return outbox_insert(inserted, "job.registered").returning(outbox.c.job_id)


@cache
def register_for_review() -> Any:
    """Register input that was malformed on arrival straight into ``manual_review``, with its
    review row and its outbox event: nothing is lost, and a human sees why."""
    columns = dict(NEW_JOB_COLUMNS, reason=sa.Text, error=sa.Text, context=sa.Text)
    new = _recordset("new", **columns)
    inserted = (
        pg.insert(jobs)
        .from_select(
            [*NEW_JOB_COLUMNS, "batch_key", "step", "status", "status_reason", "last_error_class",
             "last_error", "max_attempts"],
            sa.select(
                *[new.c[name] for name in NEW_JOB_COLUMNS],
                sa.bindparam("batch_key", type_=sa.Text),
                sa.bindparam("step", type_=sa.Text),
                status_literal(S.MANUAL_REVIEW),
                new.c.reason,
                new.c.reason,
                new.c.error,
                sa.bindparam("max_attempts", type_=sa.Integer),
            ),
        )
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(*EVENT_COLUMNS)
        .cte("inserted")
    )  # fmt: skip
    reviews = (
        sa.insert(manual_review)
        .from_select(
            ["job_id", "reason", "error_class", "attempts", "last_error", "context"],
            sa.select(inserted.c.id, new.c.reason, new.c.reason, sa.literal(0), new.c.error,
                      sa.cast(new.c.context, pg.JSONB))
            .join_from(inserted, new, new.c.id == inserted.c.id),
        )
        .cte("reviews")
    )  # fmt: skip
    return outbox_insert(inserted, "job.registered").returning(outbox.c.job_id).add_cte(reviews)


def in_version() -> ColumnElement[bool]:
    """The job was registered for the classifier version ``:p_classifier_version`` (NULL: any)."""
    version = sa.bindparam("p_classifier_version", type_=sa.Text)
    return sa.or_(version.is_(None), jobs.c.classifier_version == version)


@cache
def claim_batch(versioned: bool = False) -> Any:
    """Claim up to ``:limit`` claimable jobs of a batch and step under a fresh lease.

    ``FOR UPDATE SKIP LOCKED`` lets many workers claim from one batch without waiting on or
    double-taking each other; the attempt is counted here, at claim time, so a worker that dies
    mid-attempt still used one. Served by ``jobs_claimable_idx``.

    ``versioned``: only jobs registered for the classifier version ``:p_classifier_version``
    (the classify step: a job is labelled only by the classifier its idempotency key names).
    The others stay as they are for a run of their own version. A filter on the rows the index
    yields: the jobs of one batch and step are nearly always of one version.
    """
    version = [jobs.c.classifier_version == sa.bindparam("p_classifier_version", type_=sa.Text)] if versioned else []
    picked = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
            sa.or_(
                jobs.c.status == status_literal(S.QUEUED),
                sa.and_(jobs.c.status == status_literal(S.RETRYABLE_FAILED), jobs.c.next_attempt_at <= NOW),
            ),
            jobs.c.attempt < jobs.c.max_attempts,
            *version,
        )
        .order_by(jobs.c.next_attempt_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    return (
        sa.update(jobs)
        # = ANY(ARRAY(…)) rather than a join: the planner cannot know the LIMIT's size and
        # hashed the whole table to join it (20 ms per claim at 50,000 jobs, measured); an
        # array of ids always goes through the primary key.
        .where(jobs.c.id == sa.any_(sa.func.array(sa.select(picked.c.id).scalar_subquery())))
        .values(
            status=status_literal(S.RUNNING),
            status_reason="claimed",
            attempt=jobs.c.attempt + 1,
            lease_owner=sa.bindparam("owner", type_=sa.Text),
            lease_token=sa.bindparam("token", type_=UUID),
            lease_expires_at=NOW + seconds_param("lease_seconds"),
            next_attempt_at=None,
            updated_at=NOW,
        )
        .returning(
            jobs.c.id, jobs.c.idempotency_key, jobs.c.source, jobs.c.external_id, jobs.c.content_sha256,
            jobs.c.payload_ref, jobs.c.classifier_version, jobs.c.correlation_id, jobs.c.step,
            jobs.c.attempt, jobs.c.max_attempts, jobs.c.created_at, jobs.c.attempt_base, jobs.c.lease_expires_at,
        )
    )  # fmt: skip


def _held(rows: Any) -> list[ColumnElement[bool]]:
    """The fence of every write by a lease holder: this job, this attempt, still ours, in time."""
    return [
        jobs.c.id == rows.c.id,
        jobs.c.attempt == rows.c.attempt,
        jobs.c.status == status_literal(S.RUNNING),
        jobs.c.lease_token == sa.bindparam("token", type_=UUID),
        jobs.c.lease_expires_at > NOW,
    ]


@cache
def extend_leases() -> Any:
    """Heartbeat: push the lease of held jobs forward; an expired or lost lease is not revived."""
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))),
            jobs.c.status == status_literal(S.RUNNING),
            jobs.c.lease_token == sa.bindparam("token", type_=UUID),
            jobs.c.lease_expires_at > NOW,
        )
        .values(lease_expires_at=NOW + seconds_param("lease_seconds"), updated_at=NOW)
        .returning(jobs.c.id, jobs.c.lease_expires_at)
    )


HELD = dict(id=UUID, attempt=sa.Integer)


@cache
def complete() -> Any:
    """``running -> completed`` with the ``job.completed`` outbox event, in one statement."""
    held = _recordset("held", **HELD)
    done = (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.COMPLETED), status_reason="completed", updated_at=NOW, **NO_LEASE)
        .returning(*EVENT_COLUMNS)
        .cte("done")
    )
    return outbox_insert(done, "job.completed").returning(outbox.c.job_id)


@cache
def upsert_labels() -> Any:
    """Write the business output. A write from an older job (by ``job_created_at``, then id)
    never replaces a newer one, so a stale retry or an older classifier version loses."""
    given = _recordset("given", id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text)
    newest = (
        sa.select(jobs.c.source, jobs.c.external_id, given.c.label, given.c.confidence,
                  given.c.classifier_version, jobs.c.content_sha256, jobs.c.id, jobs.c.created_at)
        .join_from(given, jobs, jobs.c.id == given.c.id)
        .distinct(jobs.c.source, jobs.c.external_id)  # DISTINCT ON; SQLAlchemy 2.0 (Airflow's pin)
        .order_by(jobs.c.source, jobs.c.external_id, jobs.c.created_at.desc(), jobs.c.id.desc())
    )  # fmt: skip
    stmt = pg.insert(document_labels).from_select(
        ["source", "external_id", "label", "confidence", "classifier_version", "content_sha256", "job_id",
         "job_created_at"],
        newest,
    )  # fmt: skip
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


def fresh_budget() -> dict[str, Any]:
    """A new attempt budget of the same size, starting at the job's current attempt. The
    attempt itself is never reset: each one keeps its own number, so its classification and
    its events stay apart from every earlier attempt's."""
    return {
        "attempt_base": jobs.c.attempt,
        "max_attempts": jobs.c.attempt + (jobs.c.max_attempts - jobs.c.attempt_base),
    }


@cache
def advance() -> Any:
    """``running -> queued`` at the next step, with a fresh attempt budget."""
    held = _recordset("held", **HELD, next_step=sa.Text)
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.QUEUED), status_reason="advanced", step=held.c.next_step, updated_at=NOW,
                **fresh_budget(), **NO_LEASE)
        .returning(jobs.c.id)
    )  # fmt: skip


def _review_rows(moved: Any, reason: ColumnElement[Any], context: ColumnElement[Any]) -> Any:
    """INSERT the open review row of each moved job that is now in ``manual_review``."""
    return (
        pg.insert(manual_review)
        .from_select(
            ["job_id", "reason", "error_class", "attempts", "last_error", "context"],
            sa.select(moved.c.id, reason, moved.c.last_error_class, moved.c.attempt, moved.c.last_error, context)
            .where(moved.c.status == status_literal(S.MANUAL_REVIEW)),
        )
        .on_conflict_do_nothing(index_elements=["job_id"], index_where=manual_review.c.resolved_at.is_(None))
        .cte("reviews")
    )  # fmt: skip


MOVED = (jobs.c.id, jobs.c.status, jobs.c.status_reason, jobs.c.attempt, jobs.c.last_error_class, jobs.c.last_error)


@cache
def retry_later() -> Any:
    """A transient failure: ``retryable_failed`` until ``now + delay``, or, when the attempts
    are spent, ``manual_review`` with reason ``retries_exhausted`` and its review row."""
    held = _recordset("held", **HELD, error_class=sa.Text, error=sa.Text, delay_seconds=sa.Float)
    spent = jobs.c.attempt >= jobs.c.max_attempts
    moved = (
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=sa.case((spent, status_literal(S.MANUAL_REVIEW)), else_=status_literal(S.RETRYABLE_FAILED)),
            status_reason=sa.case((spent, "retries_exhausted"), else_=held.c.error_class),
            next_attempt_at=sa.case(
                (spent, None), else_=NOW + sa.func.make_interval(0, 0, 0, 0, 0, 0, held.c.delay_seconds)
            ),
            last_error_class=held.c.error_class,
            last_error=held.c.error,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
        .cte("moved")
    )
    reviews = _review_rows(moved, moved.c.status_reason, sa.func.jsonb_build_object("retryable", True))
    return sa.select(moved.c.id, moved.c.status).add_cte(reviews)


@cache
def send_to_review() -> Any:
    """``running -> manual_review`` with a reason and context, and its review row."""
    held = _recordset("held", **HELD, reason=sa.Text, error_class=sa.Text, error=sa.Text, context=sa.Text)
    moved = (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.MANUAL_REVIEW), status_reason=held.c.reason, last_error_class=held.c.error_class,
                last_error=held.c.error, updated_at=NOW, **NO_LEASE)
        .returning(*MOVED, sa.cast(held.c.context, pg.JSONB).label("context"))
        .cte("moved")
    )  # fmt: skip
    # The context comes back through RETURNING: a subquery per moved row would re-read the batch.
    reviews = _review_rows(moved, moved.c.status_reason, moved.c.context)
    return sa.select(moved.c.id, moved.c.status).add_cte(reviews)


@cache
def fail() -> Any:
    """``running -> terminal_failed``: permanent, and no human needs to look."""
    held = _recordset("held", **HELD, reason=sa.Text, error_class=sa.Text, error=sa.Text)
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.TERMINAL_FAILED), status_reason=held.c.reason, last_error_class=held.c.error_class,
                last_error=held.c.error, updated_at=NOW, **NO_LEASE)
        .returning(jobs.c.id)
    )  # fmt: skip


@cache
def release() -> Any:
    """``running -> queued`` for claimed work that never started: the attempt is given back."""
    held = _recordset("held", **HELD)
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.QUEUED), status_reason="released", attempt=jobs.c.attempt - 1, updated_at=NOW,
                **NO_LEASE)
        .returning(jobs.c.id)
    )  # fmt: skip


@cache
def record_classifications() -> Any:
    """One row per job and attempt that produced a model outcome (idempotent per attempt)."""
    given = _recordset(
        "given", job_id=UUID, attempt=sa.Integer, label=sa.Text, confidence=sa.Float, outcome=sa.Text,
        rejected_reason=sa.Text, classifier_version=sa.Text, latency_ms=sa.Float, prompt_tokens=sa.Integer,
        completion_tokens=sa.Integer, cost_usd=sa.Numeric(12, 6), usage_discarded=sa.Text,
    )  # fmt: skip
    names = [c.name for c in given.c]
    return (
        pg.insert(classifications)
        .from_select(names, sa.select(*[given.c[n] for n in names]))
        .on_conflict_do_nothing(index_elements=["job_id", "attempt"])
    )


@cache
def release_expired_leases() -> Any:
    """Return jobs whose lease ran out: ``retryable_failed`` (due now), or ``manual_review``
    when their attempts are spent (``retries_exhausted``) or they were rescued too often
    (``lease_expired_repeatedly``).

    With ``:owner_prefix`` set, leases of that prefix other than ``:owner`` count as expired too:
    a retried Airflow task (``dag/run/task/map_index/tryN``) takes back what its own earlier
    tries held without waiting for their leases to run out. Airflow starts a new try once it has
    given the old one up; the old process is normally dead (SIGKILL, OOM), and if it is not (a
    heartbeat timeout while it still runs) its late writes are refused by the lease token, so
    at worst it repeats a model call or an action that carries the same idempotency key.
    ``:p_batch_key`` (optional) limits the release to one batch.

    Fenced twice: ``SKIP LOCKED`` passes over a job a live worker is writing right now, and the
    UPDATE re-checks ``running`` and the expiry under the row lock, so a job that finished in
    the meantime is never touched.
    """
    earlier_try = sa.and_(sa.func.starts_with(jobs.c.lease_owner, sa.bindparam("owner_prefix", type_=sa.Text)),
                          jobs.c.lease_owner != sa.bindparam("owner", type_=sa.Text))  # fmt: skip
    in_batch = sa.or_(sa.bindparam("p_batch_key", type_=sa.Text).is_(None),
                      jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text))  # fmt: skip
    expired_now = sa.and_(jobs.c.status == status_literal(S.RUNNING), in_batch,
                          sa.or_(jobs.c.lease_expires_at < NOW, sa.func.coalesce(earlier_try, False)))  # fmt: skip
    expired = (
        sa.select(jobs.c.id)
        .where(expired_now)
        .order_by(jobs.c.lease_expires_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    spent = jobs.c.attempt >= jobs.c.max_attempts
    too_often = jobs.c.lease_rescues >= sa.bindparam("max_rescues", type_=sa.Integer)
    review_reason = sa.case((spent, "retries_exhausted"), (too_often, "lease_expired_repeatedly"), else_=None)
    moved = (
        sa.update(jobs)
        .where(jobs.c.id == expired.c.id, expired_now)
        .values(
            status=sa.case((review_reason.is_not(None), status_literal(S.MANUAL_REVIEW)),
                           else_=status_literal(S.RETRYABLE_FAILED)),
            status_reason=sa.func.coalesce(review_reason, "lease_expired"),
            next_attempt_at=sa.case((review_reason.is_not(None), None), else_=NOW),
            lease_rescues=jobs.c.lease_rescues + 1,
            last_error_class="lease_expired",
            last_error=sa.case(
                (jobs.c.lease_expires_at < NOW,
                 sa.func.concat("lease of ", jobs.c.lease_owner, " expired at ", jobs.c.lease_expires_at)),
                else_=sa.func.concat("lease of ", jobs.c.lease_owner, " taken back by a retry of its task"),
            ),
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
        .cte("moved")
    )  # fmt: skip
    reviews = _review_rows(moved, moved.c.status_reason, sa.func.jsonb_build_object("lease_expired", True))
    return sa.select(moved.c.id, moved.c.status).add_cte(reviews)


def _last_actor() -> Any:
    """Who made the job's latest move (``job_events``, newest first by its index)."""
    return (
        sa.select(job_events.c.actor)
        .where(job_events.c.job_id == jobs.c.id)
        .order_by(job_events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


@cache
def send_batch_to_review() -> Any:
    """Move a batch's unfinished jobs to ``manual_review`` (the failure callback; reconciliation
    for a batch whose runs are all over).

    Takes running jobs whose lease belongs to ``:owner_prefix`` (the task that failed) or has
    expired, and, with ``:take_unleased``, the jobs nobody holds; a live lease of another
    worker is left alone. A failed map index of a mapped task passes ``take_unleased=false``:
    the unleased jobs are its siblings' work while any of them still runs.

    ``:run_prefix`` (``dag/run/``; NULL: any run) confines it to one DAG run's work, since
    several runs of one date share a batch: an expired lease only of that run, an unleased job
    only if that run made its latest move (registered, released, retried or advanced it). A job
    another run touched last, or a reviewer requeued, is not this run's to give up.
    ``:p_step`` (NULL: every step) keeps it to the step of the task that failed.
    """
    open_states = [status_literal(s) for s in (S.RECEIVED, S.QUEUED, S.RETRYABLE_FAILED, S.WAITING)]
    run_prefix = sa.bindparam("run_prefix", type_=sa.Text)
    step = sa.bindparam("p_step", type_=sa.Text)
    target = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            sa.or_(step.is_(None), jobs.c.step == step),
            sa.or_(
                sa.and_(sa.bindparam("take_unleased", type_=sa.Boolean), jobs.c.status.in_(open_states),
                        sa.or_(run_prefix.is_(None), sa.func.starts_with(_last_actor(), run_prefix))),
                sa.and_(
                    jobs.c.status == status_literal(S.RUNNING),
                    sa.or_(sa.func.starts_with(jobs.c.lease_owner, sa.bindparam("owner_prefix", type_=sa.Text)),
                           sa.and_(jobs.c.lease_expires_at < NOW,
                                   sa.or_(run_prefix.is_(None), sa.func.starts_with(jobs.c.lease_owner, run_prefix)))),
                ),
            ),
        )
        .with_for_update(skip_locked=True)
        .cte("target")
    )  # fmt: skip
    moved = (
        sa.update(jobs)
        .where(jobs.c.id == target.c.id)
        .values(status=status_literal(S.MANUAL_REVIEW), status_reason=sa.bindparam("reason", type_=sa.Text),
                last_error_class=sa.bindparam("reason", type_=sa.Text),
                last_error=sa.bindparam("error", type_=sa.Text), next_attempt_at=None, updated_at=NOW, **NO_LEASE)
        .returning(*MOVED)
        .cte("moved")
    )  # fmt: skip
    reviews = _review_rows(moved, moved.c.status_reason, sa.cast(sa.bindparam("context", type_=sa.Text), pg.JSONB))
    return sa.select(moved.c.id, moved.c.status).add_cte(reviews)


@cache
def requeue_from_review() -> Any:
    """Review decision "requeue": ``manual_review -> queued`` as a fresh job (a new attempt
    budget, no lease rescues, no last error: the review row and the log keep those), a replay
    counted (bounded by ``:max_replays``), the review row resolved and a ``job.requeued`` event."""
    moved = (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID), jobs.c.status == status_literal(S.MANUAL_REVIEW),
               jobs.c.replays < sa.bindparam("max_replays", type_=sa.Integer))
        .values(status=status_literal(S.QUEUED), status_reason="requeued", replays=jobs.c.replays + 1,
                lease_rescues=0, last_error_class=None, last_error=None, updated_at=NOW, **fresh_budget())
        .returning(*EVENT_COLUMNS)
        .cte("moved")
    )  # fmt: skip
    resolved = (
        sa.update(manual_review)
        .where(manual_review.c.job_id == sa.select(moved.c.id).scalar_subquery(), manual_review.c.resolved_at.is_(None))
        .values(resolved_at=NOW, resolution="requeued", resolved_by=sa.bindparam("p_actor", type_=sa.Text),
                note=sa.bindparam("p_note", type_=sa.Text))
        .cte("resolved")
    )  # fmt: skip
    return outbox_insert(moved, "job.requeued").returning(outbox.c.job_id).add_cte(resolved)


@cache
def describe_jobs() -> Any:
    """What the fence saw, for the jobs a write missed: to name the error."""
    return sa.select(
        jobs.c.id, jobs.c.status, jobs.c.attempt, jobs.c.lease_token, (jobs.c.lease_expires_at > NOW).label("in_time")
    ).where(jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))))


@cache
def fenced_write_joins() -> Any:
    """Hash joins for the fenced writes of this transaction, until :func:`default_joins`.

    A fenced write joins the batch's rows (``json_to_recordset``: the planner guesses 100) to
    the jobs held under the lease (the partial lease index: estimated from statistics taken
    when few jobs were running, often 1 row). With those guesses the planner picks a nested
    loop that re-reads the batch's JSON once per held job: quadratic, 140 ms to complete 1,000
    jobs instead of 20 (EXPLAIN ANALYZE, docs/performance.md). The held jobs are reached
    through the lease index whatever the join, and it holds only running jobs (live leases,
    and expired ones until they are taken back), a number bounded by the workers' batches, so
    a hash join is right at every size: the same reasoning as the ``enable_nestloop = off`` of
    the jobs triggers.
    """
    return sa.text("SET LOCAL enable_nestloop = off")


@cache
def default_joins() -> Any:
    """Undo :func:`fenced_write_joins`: later statements join jobs by primary key, where a
    nested loop over the index is the right plan."""
    return sa.text("SET LOCAL enable_nestloop TO DEFAULT")


@cache
def set_actor() -> Any:
    """Who moves jobs in this transaction; the trigger writes it into ``job_events.actor``."""
    return sa.select(sa.func.set_config("triage.actor", sa.bindparam("actor", type_=sa.Text), True))


@cache
def next_due() -> Any:
    """When the earliest retryable job of a batch and step (of ``:p_classifier_version``, when
    given: the jobs this step may claim) may be claimed again."""
    return sa.select(sa.func.min(jobs.c.next_attempt_at), sa.func.now()).where(
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        jobs.c.status == status_literal(S.RETRYABLE_FAILED),
        jobs.c.attempt < jobs.c.max_attempts,
        in_version(),
    )


@cache
def open_in_step() -> Any:
    """How many jobs of a batch and step (of ``:p_classifier_version``, when given) an
    automatic step still owes work to."""
    return sa.select(sa.func.count()).where(
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        jobs.c.status.in_([status_literal(s) for s in sorted(UNFINISHED)]),
        in_version(),
    )


@cache
def accepted_classifications() -> Any:
    """The latest accepted classification of each given job: what persistence writes."""
    return (
        sa.select(classifications.c.job_id, classifications.c.label, classifications.c.confidence,
                  classifications.c.classifier_version)
        .where(classifications.c.job_id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))),
               classifications.c.outcome == "accepted")
        .distinct(classifications.c.job_id)  # DISTINCT ON; SQLAlchemy 2.0 has no .ext(distinct_on)
        .order_by(classifications.c.job_id, classifications.c.attempt.desc())
    )  # fmt: skip


# -- review decisions -----------------------------------------------------------------------
# Each decision is one fenced UPDATE of a job in ``manual_review`` (zero rows: not in review, or
# a concurrent decision won), chained with the resolution of its open review row and its outbox
# event. The reviewer is the transaction's actor, so ``job_events`` names them.


def _text(name: str) -> ColumnElement[Any]:
    """A text parameter typed in the SQL (``jsonb_build_object`` takes ``"any"``)."""
    return sa.cast(sa.bindparam(name, type_=sa.Text), sa.Text)


def _decided(to: S, reason: str) -> Any:
    """``manual_review -> to`` for the job ``:p_job_id``, fenced on its state."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID), jobs.c.status == status_literal(S.MANUAL_REVIEW))
        .values(status=status_literal(to), status_reason=reason, updated_at=NOW)
        .returning(*EVENT_COLUMNS)
        .cte("moved")
    )


def _resolve_review(moved: Any, resolution: str, context: ColumnElement[Any] | None = None) -> Any:
    """Resolve the open review row of the moved job, naming the reviewer and their note."""
    values: dict[str, Any] = {"resolved_at": NOW, "resolution": resolution, "resolved_by": _text("p_actor"),
                              "note": sa.bindparam("p_note", type_=sa.Text)}  # fmt: skip
    if context is not None:
        values["context"] = manual_review.c.context.op("||")(context)
    return (
        sa.update(manual_review)
        .where(manual_review.c.job_id == sa.select(moved.c.id).scalar_subquery(), manual_review.c.resolved_at.is_(None))
        .values(**values)
        .cte("resolved")
    )


def _review_event(moved: Any, event_type: str, payload: ColumnElement[Any]) -> Any:
    """The decision's outbox event; its payload says what was decided and by whom (never a document)."""
    return sa.insert(outbox).from_select(
        ["job_id", "event_type", "schema_version", "attempt", "payload"],
        sa.select(moved.c.id, sa.literal(event_type), sa.literal(EVENT_SCHEMA_VERSION), moved.c.attempt, payload),
    )


@cache
def label_from_review() -> Any:
    """Review decision "label": ``manual_review -> completed``, the review row resolved
    ``labelled`` (the label kept in its context as ``resolved_label``) and a ``job.completed``
    event. The business output is written by :func:`upsert_labels` in the same transaction, so a
    newer job's label is never overwritten by a reviewer either."""
    moved = _decided(S.COMPLETED, "labelled")
    resolved = _resolve_review(moved, "labelled", sa.func.jsonb_build_object("resolved_label", _text("p_label")))
    payload = sa.func.jsonb_build_object("resolution", "labelled", "label", _text("p_label"),
                                         "resolved_by", _text("p_actor"))  # fmt: skip
    return _review_event(moved, "job.completed", payload).returning(outbox.c.job_id).add_cte(resolved)


@cache
def reject_from_review() -> Any:
    """Review decision "reject": ``manual_review -> terminal_failed``, the review row resolved
    ``rejected`` and a ``job.reviewed`` event."""
    moved = _decided(S.TERMINAL_FAILED, "rejected")
    resolved = _resolve_review(moved, "rejected")
    payload = sa.func.jsonb_build_object("resolution", "rejected", "resolved_by", _text("p_actor"))
    return _review_event(moved, "job.reviewed", payload).returning(outbox.c.job_id).add_cte(resolved)


@cache
def review_state() -> Any:
    """A job's state and its latest review row: why a decision matched nothing (unknown job,
    not in review, already decided the same way or otherwise, replays spent)."""
    latest = (
        sa.select(manual_review.c.resolution, manual_review.c.resolved_by, manual_review.c.resolved_at,
                  manual_review.c.context["resolved_label"].astext.label("resolved_label"))
        .where(manual_review.c.job_id == jobs.c.id)
        .order_by(manual_review.c.id.desc())
        .limit(1)
        .lateral("latest")
    )  # fmt: skip
    return (
        sa.select(jobs.c.status, jobs.c.replays, latest.c.resolution, latest.c.resolved_by, latest.c.resolved_at,
                  latest.c.resolved_label)
        .select_from(jobs)
        .outerjoin(latest, sa.true())
        .where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID))
    )  # fmt: skip


@cache
def open_review_cases() -> Any:
    """Open reviews, oldest first, with what a reviewer needs to decide: the job's ids and
    references, why it is here, and the model's latest label and confidence. Never the document.

    ``:ids`` NULL: every open review (up to ``:limit``)."""
    model = (
        sa.select(classifications.c.label, classifications.c.confidence, classifications.c.outcome)
        .where(classifications.c.job_id == jobs.c.id)
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("model")
    )
    ids = sa.bindparam("ids", type_=pg.ARRAY(UUID))
    return (
        sa.select(
            jobs.c.id.label("job_id"), jobs.c.correlation_id, jobs.c.source, jobs.c.external_id, jobs.c.payload_ref,
            jobs.c.classifier_version, jobs.c.batch_key, jobs.c.step, jobs.c.attempt, jobs.c.max_attempts,
            jobs.c.replays, jobs.c.attempt_base, manual_review.c.reason, manual_review.c.error_class, manual_review.c.last_error,
            manual_review.c.context, manual_review.c.created_at.label("opened_at"),
            model.c.label.label("model_label"), model.c.confidence.label("model_confidence"),
            model.c.outcome.label("model_outcome"),
        )
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .outerjoin(model, sa.true())
        .where(manual_review.c.resolved_at.is_(None), jobs.c.status == status_literal(S.MANUAL_REVIEW),
               sa.or_(ids.is_(None), jobs.c.id == sa.any_(ids)))
        .order_by(manual_review.c.created_at, manual_review.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )  # fmt: skip


@cache
def upsert_review_label() -> Any:
    """:func:`upsert_labels` (the same stale-write rule) returning the job id of each row it
    wrote: a reviewer's label that lost to a newer job's returns nothing."""
    return upsert_labels().returning(document_labels.c.job_id)
