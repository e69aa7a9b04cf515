"""``size_classify`` on a real PostgreSQL (issue #16, item 4): it counts the batch's open jobs
at the classify step and returns as many ``classify`` map indexes as the work needs; the
Variables override the DAG's bounds, and a nonsense Variable fails the task without retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowFailException

from tests.ledger.helpers import new_jobs
from tests.ledger.test_trigger_limits import DAY, context, seamed
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, batch_key_for
from triage.operators.sizing import SizeClassifyOperator

BATCH = batch_key_for(DAY, DAY + timedelta(days=1))
PER_WORKER = {"keyword": 4, "llm": 2}


def size(engine: sa.Engine, classifier: str = "keyword", most: int = 3) -> list[int]:
    task = seamed(SizeClassifyOperator, engine, jobs_per_worker=PER_WORKER, max_workers=most)
    return task.execute(context({"classifier": classifier}))


def test_the_batch_open_jobs_size_classify(engine: sa.Engine, store: JobStore) -> None:
    assert size(engine) == [0]  # nothing registered: one instance, which finds nothing
    store.register(new_jobs(5, prefix="a"), batch_key=BATCH, step="classify", max_attempts=3)
    store.register(new_jobs(50, prefix="other"), batch_key="another-day", step="classify", max_attempts=3)
    assert size(engine) == [0, 1]  # ceil(5 / 4): another batch's jobs do not count
    assert size(engine, classifier="llm") == [0, 1, 2]  # ceil(5 / 2)
    store.register(new_jobs(20, prefix="b"), batch_key=BATCH, step="classify", max_attempts=3)
    assert size(engine) == [0, 1, 2]  # ceil(25 / 4) = 7, at most 3
    claim = store.claim(batch_key=BATCH, step="classify", limit=21, lease_seconds=60, owner="w")
    store.record(claim, [Complete(j.id, j.attempt) for j in claim.jobs])  # a retried run of the date
    assert size(engine) == [0]  # completed work is not counted again: ceil(4 / 4)


def test_variables_override_the_bounds(engine: sa.Engine, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.register(new_jobs(10, prefix="v"), batch_key=BATCH, step="classify", max_attempts=3)
    monkeypatch.setenv("AIRFLOW_VAR_TRIAGE_CLASSIFY_JOBS_PER_WORKER", "1")
    monkeypatch.setenv("AIRFLOW_VAR_TRIAGE_CLASSIFY_MAX_WORKERS", "6")
    assert size(engine) == list(range(6))
    monkeypatch.setenv("AIRFLOW_VAR_TRIAGE_CLASSIFY_MAX_WORKERS", "none")
    with pytest.raises(AirflowFailException, match="triage_classify_max_workers"):
        size(engine)
