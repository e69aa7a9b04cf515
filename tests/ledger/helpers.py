"""Test helpers for the ledger: documents to register, jobs put in a given state by SQL, the
classifier of the fake model server, the context of a failure callback."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.contracts.events import WorkEvent
from triage.jobs.vocabulary.models import NewJob, Registered
from triage.jobs.vocabulary.states import JobStatus, Step
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import to_new_jobs
from triage.pipeline.reuse import ContentCache
from triage.pipeline.steps import RunSettings, StepReport, run_step
from triage.sources.base import SourceDocument

if TYPE_CHECKING:
    import psycopg

    from tests.fakes.openai_server import FakeOpenAIServer
    from triage.classifiers.base import Classifier
    from triage.jobs.store import JobStore
    from triage.payloads import PayloadStore


def new_jobs(n: int, *, prefix: str = "doc", version: str = "keyword-v1", source: str = "synthetic") -> list[NewJob]:
    out = []
    for i in range(n):
        digest = hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest()
        out.append(
            NewJob(
                idempotency_key=f"{source}:{prefix}-{i}:{digest}:{version}",
                source=source,
                external_id=f"{prefix}-{i}",
                content_sha256=digest,
                payload_ref=f"file:///payloads/{digest}",
                classifier_version=version,
            )
        )
    return out


# -- documents through the classify step, and the fake model server's classifier --------------

RECEIVED_AT = datetime(2026, 11, 1, 9, tzinfo=UTC)


def document(
    external_id: str, body: str, *, subject: str = "Invoice", received_at: datetime = RECEIVED_AT
) -> SourceDocument:
    """A document of the ``test`` source, as ``retrieve`` reads it."""
    payload = DocumentPayload(external_id=external_id, subject=subject, body=body, received_at=received_at)
    return SourceDocument("test", external_id, payload.to_bytes())


def documents(
    n: int, body: str = "I was charged twice, ticket {i}", *, prefix: str = "T", received_at: datetime = RECEIVED_AT
) -> list[SourceDocument]:
    """``n`` invoices ``T-000``, ``T-001``, … (``prefix``), ``body`` formatted with each one's index."""
    return [document(f"{prefix}-{i:03d}", body.format(i=i), received_at=received_at) for i in range(n)]


def register_documents(
    store: JobStore,
    payloads: PayloadStore,
    docs: Sequence[SourceDocument],
    version: str,
    *,
    batch_key: str,
    max_attempts: int = 3,
) -> Registered:
    """``docs`` packed into ``payloads`` and registered at the classify step, as ``retrieve`` does."""
    new = to_new_jobs(docs, payloads, version)
    return store.register(new, batch_key=batch_key, step="classify", max_attempts=max_attempts)


def llm_classifier(server: FakeOpenAIServer, **kw: Any) -> OpenAICompatibleClassifier:
    """The real classifier, calling the fake model server (key ``sk-test``, model ``fake-model``)."""
    return OpenAICompatibleClassifier(
        base_url=server.base_url, api_key="sk-test", model="fake-model", taxonomy=Taxonomy.load(), **kw
    )


def classify_try(
    store: JobStore,
    classifier: Classifier,
    payloads: PayloadStore,
    settings: RunSettings,
    *,
    batch_key: str,
    classify: ClassifySettings | None = None,
    cache: ContentCache | None = None,
) -> StepReport:
    """One try of the classify step with ``classifier`` (``classify``: the default settings if
    None); the handler (and its classifier) is closed after it, as the operator does."""
    handler = ClassifyHandler(classifier, payloads, classify or ClassifySettings(), cache=cache)
    try:
        return run_step(store, handler, batch_key=batch_key, settings=settings)
    finally:
        handler.close()


def counts(store: JobStore, sql: str) -> dict[tuple[Any, ...], int]:
    """``sql``'s rows as {the other columns: the last one} (a ``GROUP BY`` with a count last)."""
    with store.engine.connect() as conn:
        return {tuple(r[:-1]): r[-1] for r in conn.execute(sa.text(sql))}


def failure_callback_context(*, run_id: str, batch_key: str, task_id: str, ledger_step: Step) -> dict[str, Any]:
    """What Airflow hands ``on_task_failure`` when it gives up on ``task_id`` of ``classify_documents``'
    run ``run_id`` (try 4, not mapped), whose data interval is ``batch_key``."""
    ti = SimpleNamespace(dag_id="classify_documents", run_id=run_id, task_id=task_id, map_index=-1, try_number=4)
    task = SimpleNamespace(triage_conn_id="triage_db", task_id=task_id, ledger_step=ledger_step)
    start, end = (datetime.fromisoformat(bound) for bound in batch_key.split("/"))
    return {
        "ti": ti,
        "task": task,
        "exception": RuntimeError("outage"),
        "data_interval_start": start,
        "data_interval_end": end,
    }


def insert_job(conn: sa.Connection, status: JobStatus = JobStatus.QUEUED, *, batch_key: str = "b") -> uuid.UUID:
    """A job created directly in ``status`` (an initial state) by ad hoc SQL."""
    job_id = uuid.uuid4()
    conn.execute(
        sa.text(
            "INSERT INTO triage.jobs (id, idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
            " VALUES (:id, :key, 's', :key, 'h', 'ref', 'v', :key, :batch, 'classify', :status, 3)"
        ),
        {"id": job_id, "key": str(job_id), "batch": batch_key, "status": status.value},
    )
    return job_id


def move(conn: sa.Connection, job_id: uuid.UUID, to: JobStatus) -> None:
    """Ad hoc UPDATE of a job's state, with the columns its CHECK constraints want."""
    running = to == JobStatus.RUNNING
    conn.execute(
        sa.text(
            "UPDATE triage.jobs SET status = CAST(:to AS triage.job_status),"
            " attempt = CASE WHEN :running THEN least(attempt + 1, max_attempts) ELSE attempt END,"
            " lease_owner = CASE WHEN :running THEN 'test' END,"
            " lease_token = CASE WHEN :running THEN gen_random_uuid() END,"
            " lease_expires_at = CASE WHEN :running THEN now() + interval '1 minute' END,"
            " next_attempt_at = CASE WHEN :retry THEN now() END"
            " WHERE id = :id"
        ),
        {"id": job_id, "to": to.value, "running": running, "retry": to == JobStatus.RETRYABLE_FAILED},
    )


PATHS: dict[JobStatus, tuple[JobStatus, list[JobStatus]]] = {
    JobStatus.RECEIVED: (JobStatus.RECEIVED, []),
    JobStatus.QUEUED: (JobStatus.QUEUED, []),
    JobStatus.RUNNING: (JobStatus.QUEUED, [JobStatus.RUNNING]),
    JobStatus.WAITING: (JobStatus.QUEUED, [JobStatus.RUNNING, JobStatus.WAITING]),
    JobStatus.COMPLETED: (JobStatus.QUEUED, [JobStatus.RUNNING, JobStatus.COMPLETED]),
    JobStatus.RETRYABLE_FAILED: (JobStatus.QUEUED, [JobStatus.RUNNING, JobStatus.RETRYABLE_FAILED]),
    JobStatus.MANUAL_REVIEW: (JobStatus.MANUAL_REVIEW, []),
    JobStatus.TERMINAL_FAILED: (JobStatus.QUEUED, [JobStatus.TERMINAL_FAILED]),
}


def job_in(conn: sa.Connection, status: JobStatus) -> uuid.UUID:
    """A job brought to ``status`` along allowed moves."""
    initial, steps = PATHS[status]
    job_id = insert_job(conn, initial)
    for step in steps:
        move(conn, job_id, step)
    return job_id


# -- time travel for retention (tests and the footprint bench): as the database's owner ---------


def drop_legacy_partitions(conn: psycopg.Connection) -> None:
    """A fresh database's legacy partitions (migration 0015: everything before its next
    midnight) go, so that rows can be aged into day partitions of the past; today's come."""
    for table in ("job_events", "outbox"):
        conn.execute(f"ALTER TABLE triage.{table} DETACH PARTITION triage.{table}_legacy")
        conn.execute(f"DROP TABLE triage.{table}_legacy")
    conn.execute("SELECT * FROM triage.ensure_day_partitions(2)")


def past_day_partitions(conn: psycopg.Connection, day: datetime) -> None:
    """The partitions of job_events and outbox for the UTC day starting at ``day``."""
    for table in ("job_events", "outbox"):
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS triage.{table}_p{day:%Y%m%d} PARTITION OF triage.{table}"
            f" FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
        )


def age_rows(
    conn: psycopg.Connection, at: datetime, job_ids: list[uuid.UUID] | None = None, *, jobs: bool = True
) -> None:
    """Every row of these jobs (None: of all jobs) as if written at ``at``; ``jobs=False``
    leaves the jobs rows (and labels) alone: a new version of each would be bloat the
    footprint bench must not count. The append-only triggers stand aside
    (``session_replication_role = replica``), which no deployment role may do."""
    where, args = ("WHERE job_id = ANY(%s::uuid[])", [[str(i) for i in job_ids]]) if job_ids else ("", [])
    jobs_where = where.replace("job_id", "id")
    conn.execute("SET session_replication_role = replica")
    if jobs:
        conn.execute(f"UPDATE triage.jobs SET created_at = %s, updated_at = %s {jobs_where}", (at, at, *args))
    conn.execute(f"UPDATE triage.job_events SET at = %s {where}", (at, *args))
    conn.execute(
        "UPDATE triage.outbox SET created_at = %s " + where,
        (at, *args),
    )
    conn.execute(f"UPDATE triage.classifications SET created_at = %s {where}", (at, *args))
    if jobs:
        conn.execute(f"UPDATE triage.document_labels SET updated_at = %s, job_created_at = %s {where}", (at, at, *args))
    conn.execute("SET session_replication_role = origin")


def settle_outbox(store: Any) -> None:
    """Wait until no committed outbox event waits behind a running transaction (another test's,
    elsewhere in the cluster): a claim taken directly (not through the relay, which waits
    itself) then sees every event committed so far."""
    from triage.jobs.sql.writes import outbox as O
    from triage.jobs.store.relay import settle

    with store.transaction(None) as conn:
        target = conn.execute(O.held_back()).scalar()
    if target is not None:
        settle(store.transaction, target, 10.0)


def outbox_row_json(row: Any) -> bytes:
    """``WorkEvent.to_json`` of an outbox row, built from its typed columns (an empty payload is
    none): the reference the relay's events are compared with, byte for byte."""
    return WorkEvent(
        event_id=row.event_id,
        job_id=row.job_id,
        event_type=row.event_type,
        schema_version=row.schema_version,
        attempt=row.attempt,
        occurred_at=row.created_at.astimezone(UTC),
        correlation_id=row.correlation_id,
        payload_ref=row.payload_ref,
        payload=row.payload or None,
    ).to_json()
