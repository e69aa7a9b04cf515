"""Metrics and per-job log lines of a classify step on a real PostgreSQL: every counter agrees
with what the ledger recorded, every per-job line carries its job's correlation_id."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from triage.classifiers import Taxonomy, build_classifier
from triage.contracts.drill import DrillSettings
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.states import JobStatus
from triage.observability import NULL_METRICS, Metrics, RecordingMetrics
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, StepReport, WorkRemains, run_step
from triage.sources.synthetic import SyntheticSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = "observed"
DRILL = DrillSettings(transient_error_rate=0.15, permanent_error_rate=0.05, inconclusive_rate=0.1, seed=9)


def classify(store: JobStore, tmp_path: Path, metrics: Metrics, n: int = 300, max_attempts: int = 2) -> StepReport:
    payloads = PayloadStore(tmp_path / "payloads")
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load(), drill=DRILL)
    retrieve(
        store,
        SyntheticSource(n, seed=2),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=max_attempts,
    )
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7))
    settings = RunSettings(owner="observed", batch_size=64, retry_soon_seconds=5.0)
    try:
        return run_step(store, handler, batch_key=BATCH, settings=settings, metrics=metrics)
    except WorkRemains as exc:
        return exc.report  # type: ignore[attr-defined]  # run_step sets it on the error it raises
    finally:
        handler.close()


def scalar(store: JobStore, sql: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def family(counters: dict[str, float], prefix: str) -> dict[str, float]:
    return {name[len(prefix) :]: n for name, n in counters.items() if name.startswith(prefix)}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_counters_timings_and_gauges_agree_with_the_ledger(store: JobStore, tmp_path: Path) -> None:
    metrics = RecordingMetrics()
    report = classify(store, tmp_path, metrics)
    counters = metrics.counters()

    # routes: one counter per kind, summing to the claims
    routes = family(counters, "triage.classify.jobs.")
    assert set(routes) <= {"completed", "advanced", "retry", "review", "failed", "released"}
    assert routes["completed"] == report.outcomes["Complete"]
    assert routes["retry"] == report.outcomes["RetryLater"] > 0
    assert routes["review"] == report.outcomes["SendToReview"] > 0
    assert sum(routes.values()) == counters["triage.classify.claimed"] == report.claimed

    # model outcomes: one per classifications row, by outcome
    outcomes = family(counters, "triage.classify.outcome.")
    with store.engine.connect() as conn:
        recorded: dict[str, int] = dict(
            conn.execute(sa.text("SELECT outcome, count(*) FROM triage.classifications GROUP BY 1")).tuples().all()
        )
    assert outcomes == recorded
    assert len(metrics.timings("triage.classify.latency_ms")) == sum(recorded.values())

    # error classes: the drill's transient and permanent failures, by class
    assert family(counters, "triage.classify.transient.") == {"drill_transient": routes["retry"]}
    assert family(counters, "triage.classify.permanent.") == {
        "drill_permanent": scalar(store, "SELECT count(*) FROM triage.manual_review WHERE reason = 'permanent_error'")
    }
    exhausted = scalar(store, "SELECT count(*) FROM triage.manual_review WHERE reason = 'retries_exhausted'")
    assert exhausted > 0
    assert counters["triage.classify.retries_exhausted"] == exhausted
    assert scalar(store, "SELECT count(*) FROM triage.job_events WHERE to_status = 'retryable_failed'") == (
        routes["retry"] - exhausted
    )

    # one batch timing per claimed batch; gauges per state of the batch at the end
    assert len(metrics.timings("triage.classify.batch_ms")) >= report.claimed / 64
    gauges = metrics.gauges()
    assert {name: int(v) for name, v in gauges.items()} == {
        f"triage.batch.{state.value}": n for state, n in store.status_counts(BATCH).items()
    }
    assert all(s.tags["step"] == "classify" for s in metrics.samples)
    assert {s.tags["batch_key"] for s in metrics.samples if s.kind == "gauge"} == {BATCH}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_disabled_sink_is_not_even_asked(store: JobStore, tmp_path: Path) -> None:
    metrics = RecordingMetrics(enabled=False)
    classify(store, tmp_path, metrics, n=40)
    assert metrics.samples == []
    classify(store, tmp_path, NULL_METRICS, n=40)  # the default: nothing to assert but no error


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_every_per_job_line_names_its_correlation_id(
    store: JobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="triage")
    classify(store, tmp_path, NULL_METRICS)
    with store.engine.connect() as conn:
        correlation: dict[str, str] = dict(
            conn.execute(sa.text("SELECT id::text, correlation_id FROM triage.jobs")).tuples().all()
        )
    # The job's fields are the record's attributes (and structlog context: test_job_log_fields),
    # never the message's text.
    per_job = [r for r in caplog.records if hasattr(r, "job_id")]
    assert len(per_job) >= scalar(store, "SELECT count(*) FROM triage.manual_review")  # every review was logged
    for record in per_job:
        fields = vars(record)  # the job's fields, set by the log call's ``extra``
        assert correlation[record.job_id] == fields["correlation_id"], record.getMessage()
        assert 1 <= fields["attempt"] <= fields["max_attempts"]
        assert record.job_id not in record.getMessage()
        assert fields["correlation_id"] not in record.getMessage()
    kinds = {r.getMessage().split()[1] for r in per_job}
    assert kinds == {"retry", "manual_review"}
    # batch lines name the batch; no line names a document's external id
    with store.engine.connect() as conn:
        external_ids = set(conn.execute(sa.text("SELECT external_id FROM triage.jobs")).scalars())
    assert not [m for m in caplog.messages for e in external_ids if e in m]
    assert any(f"batch={BATCH}" in m for m in caplog.messages)
    assert store.status_counts(BATCH)[JobStatus.RUNNING] == 0
