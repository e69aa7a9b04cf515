"""A worker's transaction bodies: register documents, record the outcomes of a claim, and
name the error of a fenced write that missed. They never commit: :class:`~triage.jobs.store.JobStore`
owns the transaction (``_x_txn(conn, …)``), so a caller that needs several writes in one
transaction composes them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import sqlalchemy as sa

from triage.contracts import usage as usage_bounds
from triage.jobs.sql import audit_samples, session
from triage.jobs.sql.expressions import context_json, event_ids, rowset
from triage.jobs.sql.moves import registration
from triage.jobs.sql.moves import worker as T
from triage.jobs.sql.reads import queries
from triage.jobs.sql.reads.review_uncertainty import answer_uncertainty
from triage.jobs.sql.writes import outputs
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.errors import JobNotFound, LeaseExpired, LeaseLost, LedgerError, StaleAttempt
from triage.jobs.vocabulary.models import (
    Advance,
    ClassificationRecord,
    Complete,
    Fail,
    NewJob,
    Outcome,
    Park,
    Recorded,
    Registered,
    Release,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import JobStatus

_PLAIN_JSON = msgspec.json.Encoder()


def plain_rowset(name: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """:func:`~triage.jobs.sql.expressions.rowset` for rows of plain values: text, whole numbers,
    finite floats, None, UUIDs, and lists and dicts of them. Encoded by msgspec (a dependency of
    Airflow's own), about eight times faster than ``json.dumps``: ~4 µs a document of a chunk's
    row sets and ~3 of registration's (measured). The JSON values are the same and PostgreSQL
    reads them alike: a float as its shortest round-trip digits (``1e-05`` written ``0.00001``),
    text as UTF-8 where json escapes it, a UUID as ``str()`` writes it.

    Not for a datetime (``json.dumps``'s hook writes ``str()``, a space before the time; msgspec a
    ``T``) nor a float that is not finite (json refuses it; msgspec writes null): every float of
    the rows given here is a confidence or score in [0, 1] (a
    :class:`~triage.classifiers.base.ModelOutput` checks it, ``classifications``' CHECK holds it),
    an uncertainty made of them (None unless finite), or a usage figure
    :mod:`triage.contracts.usage` bounded."""
    listed = list(rows)
    try:
        return {f"{name}_rows": _PLAIN_JSON.encode(listed).decode()}
    except UnicodeEncodeError:  # a lone surrogate: json escapes it, for PostgreSQL to refuse as before
        return rowset(name, listed)


def register_txn(
    conn: sa.Connection, new_jobs: Sequence[NewJob], *, batch_key: str, step: str, max_attempts: int
) -> Registered:
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
        rows = plain_rowset("new", map(_new_job_row, queued, event_ids(len(queued))))
        new_ids += execute_compiled(conn, registration.register_queued(), {**scalars, **rows}).scalars().all()
    if review:
        rows = plain_rowset(
            "new",
            (
                {
                    **_new_job_row(j, job_id),
                    "reason": j.reason or "malformed_input",
                    "error": j.error,
                    "context": context_json(j.review_context),
                }
                for j, job_id in zip(review, event_ids(len(review)), strict=True)
            ),
        )
        new_ids += execute_compiled(conn, registration.register_for_review(), {**scalars, **rows}).scalars().all()
    return Registered(new=len(new_ids), existing=len(new_jobs) - len(new_ids), new_ids=tuple(new_ids))


def _new_job_row(job: NewJob, job_id: str) -> dict[str, Any]:
    # Time-ordered ids (UUIDv7, drawn for the batch at once: event_ids): a batch registered
    # together sits together in every index keyed by job id (jobs, job_events, outbox), instead
    # of touching a random page per row. uuid6.uuid7() cost ~4 µs an id, a tenth of this.
    return {
        "id": job_id,
        "idempotency_key": job.idempotency_key,
        "source": job.source,
        "external_id": job.external_id,
        "content_sha256": job.content_sha256,
        "payload_ref": job.payload_ref,
        "classifier_version": job.classifier_version,
        # The id as PostgreSQL (and str() of a Python UUID) writes it.
        "correlation_id": job.correlation_id
        or f"{job_id[:8]}-{job_id[8:12]}-{job_id[12:16]}-{job_id[16:20]}-{job_id[20:]}",
    }


def execute_compiled(conn: sa.Connection, statement: Any, params: Mapping[str, Any]) -> sa.CursorResult[Any]:
    """Run ``statement`` from its form compiled once per process
    (:func:`~triage.jobs.sql.moves.registration.compiled`): SQLAlchemy compiles a statement with
    an ``INSERT … ON CONFLICT`` again at every execution (~1 ms for each of a chunk's three,
    about 2.5 µs a document of the classify step's CPU). ``params`` must name every parameter
    the statement takes beside its constants, with plain values (text, numbers)."""
    sql, constants = registration.compiled(statement)
    return conn.exec_driver_sql(sql, {**constants, **params})


def record_txn(
    conn: sa.Connection,
    token: uuid.UUID,
    outcomes: Sequence[Outcome],
    policy: RetryPolicy,
    rng: random.Random,
    bases: Mapping[uuid.UUID, int] | None = None,
    *,
    last_in_transaction: bool = False,
) -> Recorded:
    """Record outcomes set-based: one statement per kind, all fenced on (job, attempt, token);
    then, once the fence held for every job, the classifications and the labels.

    :param bases: each job's ``attempt_base`` (from its claim): the backoff of a retry counts
        the attempts of the current budget only, so a requeued job starts from the short waits.
    :param last_in_transaction: the caller commits right after (:meth:`JobStore.record`): with
        no classification or label to write, the planner setting of the fenced writes is left
        to end with the transaction (``SET LOCAL``), a round trip less.
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

    def execute(statement: Any, kind: type, extra: Callable[[Any], dict[str, Any]] | None) -> sa.CursorResult[Any]:
        # The id as 32 hex digits (PostgreSQL reads uuid that way too): half the cost of str()
        # through json's default hook, per job.
        rows = rowset(
            "held", ({"id": o.job_id.hex, "attempt": o.attempt, **(extra(o) if extra else {})} for o in by_kind[kind])
        )
        return conn.execute(statement, {"token": token, **rows})

    def run(statement: Any, kind: type, extra: Callable[[Any], dict[str, Any]] | None = None) -> int:
        """The fenced statement over the outcomes of ``kind``: one row each (id, attempt, and
        what ``extra`` adds); how many jobs it moved.

        The ids are distinct and each statement moves a job at most once, so moving as many
        jobs as it was given means it moved every one of them: the rows it returns are read
        only when it moved fewer (to name the first job missed). Decoding a thousand returned
        ids cost more than the statement's round trip."""
        given = by_kind[kind]
        result = execute(statement, kind, extra)
        if result.rowcount == len(given):
            touched.update(o.job_id for o in given)
            return len(given)
        moved = result.all()
        touched.update(r[0] for r in moved)
        return len(moved)

    def retry_row(o: RetryLater) -> dict[str, Any]:
        base = bases.get(o.job_id, 0) if bases else 0
        delay = o.delay_seconds if o.delay_seconds is not None else policy.delay(o.attempt - base, rng)
        return {"error_class": o.error_class, "error": o.error, "delay_seconds": delay}

    conn.execute(session.fenced_write_joins())
    if Complete in by_kind:
        events = iter(event_ids(len(by_kind[Complete])))
        counts["completed"] = run(T.complete(), Complete, lambda o: {"event_id": next(events), **label_row(o)})
    if Advance in by_kind:
        counts["advanced"] = run(T.advance(), Advance, lambda o: {"next_step": o.next_step})
    if RetryLater in by_kind:
        moved = execute(T.retry_later(), RetryLater, retry_row).all()  # the statuses are needed
        touched.update(r.id for r in moved)
        exhausted = sum(1 for r in moved if r.status == JobStatus.MANUAL_REVIEW.value)
        counts["exhausted"], counts["retrying"] = exhausted, len(moved) - exhausted
    if SendToReview in by_kind:
        counts["to_review"] = run(
            T.send_to_review(),
            SendToReview,
            lambda o: {
                "reason": o.reason,
                "error_class": o.error_class,
                "error": o.error,
                "context": context_json(review_context(o)),
            },
        )
    if Fail in by_kind:
        counts["failed"] = run(
            T.fail(), Fail, lambda o: {"reason": o.reason, "error_class": o.error_class, "error": o.error}
        )
    if Release in by_kind:
        counts["released"] = run(T.release(), Release)
    if Park in by_kind:
        counts["parked"] = run(
            T.park(),
            Park,
            lambda o: {
                "dependency": o.dependency,
                "delay_seconds": o.delay_seconds,
                "backoff": o.backoff,
                "error_class": o.error_class,
                "error": o.error,
            },
        )
    check_fenced(conn, ids, touched, token, attempts)

    if not last_in_transaction or any(_has_output(o) for o in outcomes):
        conn.execute(session.default_joins())
    record_outputs_txn(conn, outcomes)
    return Recorded(**counts)


def _has_output(outcome: Outcome) -> bool:
    return (not isinstance(outcome, (Release, Park)) and outcome.classification is not None) or (
        isinstance(outcome, Complete) and outcome.label is not None
    )


def record_outputs_txn(conn: sa.Connection, outcomes: Sequence[Outcome]) -> None:
    """What the outcomes of a batch leave beside the moves of their jobs, once those moves held:
    the classifications, the labels of completed jobs and the audit rows of audit samples."""
    classified = [o for o in outcomes if not isinstance(o, (Release, Park)) and o.classification is not None]
    labelled = [o for o in outcomes if isinstance(o, Complete) and o.label is not None]
    if classified:
        rows = plain_rowset("given", map(_classification_row, classified))
        execute_compiled(conn, outputs.record_classifications(), rows)
    if labelled:
        execute_compiled(conn, outputs.upsert_labels(), plain_rowset("given", map(_label_write_row, labelled)))
    audited = [o for o in labelled if o.audit]
    if audited:  # the completion's transaction opens their audit rows (issue #27)
        execute_compiled(conn, audit_samples.open_audit_samples(), plain_rowset("given", map(_audit_row, audited)))


def _label_write_row(outcome: Complete) -> dict[str, Any]:
    """A labelled completion as a row of ``given`` (id, label, confidence, classifier_version)."""
    assert outcome.label is not None
    return {
        "id": outcome.job_id.hex,  # as PostgreSQL reads a uuid too: str() through json's default hook cost ~1 µs
        "label": outcome.label.label,
        "confidence": outcome.label.confidence,
        "classifier_version": outcome.label.classifier_version,
    }


def _audit_row(outcome: Complete) -> dict[str, Any]:
    """An audited completion as a row of ``given``: its label row and the answer's uncertainty, so
    that an audit sample takes its place in the queue least sure first like any review."""
    assert outcome.label is not None
    record = outcome.classification
    candidates = record.candidates if record is not None else None
    return {**_label_write_row(outcome), "uncertainty": answer_uncertainty(candidates, outcome.label.confidence)}


def review_context(outcome: SendToReview) -> Mapping[str, Any]:
    """The review row's context, with the uncertainty of the answer that sent the job there: the
    key of the queue least sure first (:mod:`triage.jobs.sql.reads.review_uncertainty`)."""
    record = outcome.classification
    if record is None or record.outcome == "rejected":  # no answer to be unsure of: it comes last
        return outcome.context
    value = answer_uncertainty(record.candidates, record.confidence)
    return outcome.context if value is None else {**outcome.context, "uncertainty": value}


def label_row(outcome: Complete) -> dict[str, Any]:
    """What a completion's event says of its label (none: ``{}``, the keys left out)."""
    label = outcome.label
    if label is None:
        return {}
    return {"label": label.label, "confidence": label.confidence, "classifier_version": label.classifier_version}


def _classification_row(outcome: Any) -> dict[str, Any]:
    """The row of an outcome's classification. Usage figures are bounded here too, whoever made
    the record: one the columns cannot hold would fail the whole batch (:mod:`triage.contracts.usage`)."""
    record: ClassificationRecord = outcome.classification
    if record.prompt_tokens is None and record.completion_tokens is None and record.cost_usd is None:
        # An answer of this process (keyword, learned, reused): a latency at most. The figures
        # not reported are None either way, and left out of the row (without_nulls).
        usage, discarded = usage_bounds.bounded(latency_ms=record.latency_ms)
    else:
        usage, discarded = usage_bounds.bounded(
            latency_ms=record.latency_ms,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            cost_usd=record.cost_usd,
        )
    usage_discarded = None
    if discarded or record.usage_discarded:  # rare: what the classifier and this bound discarded
        named = [n for n in (record.usage_discarded or "").split(",") if n]
        named += [n for n in discarded if n not in named]
        usage_discarded = ",".join(named) or None
    row = {
        # 32 hex digits, as PostgreSQL reads a uuid too: str() through json's default hook cost
        # a microsecond more a row.
        "job_id": outcome.job_id.hex,
        "attempt": outcome.attempt,
        "label": record.label,
        "confidence": record.confidence,
        "outcome": record.outcome,
        "rejected_reason": record.rejected_reason,
        "classifier_version": record.classifier_version,
        **usage,
        "usage_discarded": usage_discarded,
        "output_mode": record.output_mode,
        "input_sha256": record.input_sha256,
        "reused_job_id": record.reused_from[0] if record.reused_from else None,
        "reused_attempt": record.reused_from[1] if record.reused_from else None,
        "candidates": [{"label": n, "score": v} for n, v in record.candidates] if record.candidates else None,
    }
    return without_nulls(row)


def without_nulls(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without its None values. ``json_to_recordset`` reads a column its object leaves out
    as NULL, as it reads a JSON null: the same row, without the nulls of most rows (an in-process
    classifier reports no tokens, no cost, no reuse) to encode here and parse in the server
    (~1 µs of each a classification row, measured)."""
    return {name: value for name, value in row.items() if value is not None}


def check_fenced(
    conn: sa.Connection,
    wanted: Sequence[uuid.UUID],
    got: set[uuid.UUID],
    token: uuid.UUID,
    attempts: Mapping[uuid.UUID, int] | None,
) -> None:
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
