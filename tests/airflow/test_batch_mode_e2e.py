"""Batch mode end to end on the real DAG: ``airflow dags test classify_documents`` with
``model_mode`` = ``batch`` against the fake OpenAI-compatible server's batch interface on
loopback (real HTTP, another process than the run's) and a real job database.

``dags test`` runs a deferred task's trigger in line (Airflow's ``dag.test()``), as a triggerer
would: ``size_classify`` submits, defers to ``ModelBatchTrigger`` (which polls the fake until the
batch is no longer running), resumes and collects; ``classify`` then takes the answers. A
scheduler with a triggerer runs the same in ``test_batch_mode_backfill.py``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.harness.deployment import Deployment

DOCUMENTS = 60


def batch_of(day: str) -> str:
    return f"{day}T00:00:00+00:00/"


def doubtful(body: dict) -> bool:
    """About one document in five gets a doubtful answer (by its text: the same in a batch line
    and an interactive call)."""
    return hashlib.sha256(body["messages"][1]["content"].encode()).digest()[0] % 5 == 0


def responder(body: dict) -> Reply:
    return Reply.ok("billing", 0.2 if doubtful(body) else 0.9)


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(responder=responder) as fake:
        fake.batches.polls_until_done = 3  # the operator's first look and two of the trigger's
        yield fake


def run(
    deployment: Deployment, model: FakeOpenAIServer, logical_date: str, **conf: object
) -> subprocess.CompletedProcess[str]:
    conn = {"conn_type": "http", "host": model.base_url, "password": "sk-test", "extra": {"batch_poll_seconds": 0.2}}
    conf = {"documents": DOCUMENTS, "classifier": "llm", "model_mode": "batch", **conf}
    return deployment.dags_test(
        "classify_documents", logical_date, "-c", json.dumps(conf), AIRFLOW_CONN_TRIAGE_LLM=json.dumps(conn)
    )


def ledger(deployment: Deployment, day: str) -> dict[str, Any]:
    q, b = deployment.scalar, batch_of(day)
    jobs = "FROM triage.jobs WHERE starts_with(batch_key, :b)"
    return {
        "jobs": q(f"SELECT count(*) {jobs}", b=b),
        "completed": q(f"SELECT count(*) {jobs} AND status = 'completed'", b=b),
        "in_review": q(
            f"SELECT count(*) {jobs} AND status = 'manual_review'"
            " AND id IN (SELECT job_id FROM triage.manual_review WHERE resolved_at IS NULL AND reason <> '')",
            b=b,
        ),
        "first_attempt": q(f"SELECT count(*) {jobs} AND attempt = 1", b=b),
        "labels": q(
            "SELECT count(*) FROM triage.document_labels l JOIN triage.jobs j ON j.id = l.job_id"
            " WHERE starts_with(j.batch_key, :b)",
            b=b,
        ),
        "classifications": q(
            "SELECT count(*) FROM triage.classifications c JOIN triage.jobs j ON j.id = c.job_id"
            " WHERE starts_with(j.batch_key, :b)",
            b=b,
        ),
        "unpublished": q(
            "SELECT count(*) FROM triage.outbox"
            " WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)"
        ),
        "batches": q(
            "SELECT string_agg(status, ',' ORDER BY status) FROM triage.model_batches WHERE starts_with(batch_key, :b)",
            b=b,
        ),
        "answers": q(
            "SELECT count(*) FROM triage.model_batch_answers a JOIN triage.model_batches m ON m.key = a.batch"
            " WHERE starts_with(m.batch_key, :b) AND a.error_class IS NULL",
            b=b,
        ),
    }


def deferred(result: subprocess.CompletedProcess[str]) -> bool:
    return "running trigger in line" in result.stdout + result.stderr


def test_a_batch_run_waits_deferred_and_completes_its_jobs_from_the_batch(
    deployment: Deployment, model: FakeOpenAIServer
) -> None:
    result = run(deployment, model, "2026-11-02")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert deferred(result)
    doubtful_ones = sum(doubtful(line["body"]) for b in model.batches.batches.values() for line in b.lines)
    assert model.request_count == 0  # not one interactive call
    assert model.batches.created == 1
    assert ledger(deployment, "2026-11-01") == {
        "jobs": DOCUMENTS,
        "completed": DOCUMENTS - doubtful_ones,
        "in_review": doubtful_ones,  # reason inconclusive, from the batch's answer
        "first_attempt": DOCUMENTS,
        "labels": DOCUMENTS - doubtful_ones,
        "classifications": DOCUMENTS,
        "unpublished": 0,
        "batches": "collected",
        "answers": DOCUMENTS,
    }
    assert 0 < doubtful_ones < DOCUMENTS


@pytest.mark.parametrize(
    ("day", "fate", "answered"),
    [
        pytest.param("2026-11-04", ("failed", 0), 0, id="failed"),
        pytest.param("2026-11-08", ("expired", 25), 25, id="expired-with-25-answers"),
    ],
)
def test_a_batch_the_provider_loses_puts_its_jobs_back_and_the_run_still_settles_every_one(
    deployment: Deployment, model: FakeOpenAIServer, day: str, fate: tuple[str, int], answered: int
) -> None:
    model.batches.finish_as = fate
    logical_date = f"{day[:-2]}{int(day[-2:]) + 1:02d}"
    result = run(deployment, model, logical_date)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert deferred(result)
    texts = [line["body"] for b in model.batches.batches.values() for line in b.lines] or None
    state = ledger(deployment, day)
    # What the batch did not answer was asked interactively, once per job; nothing was lost,
    # no attempt spent on the provider's loss, nothing registered or labelled twice.
    assert model.request_count == DOCUMENTS - answered
    assert model.batches.created == 1
    assert state["jobs"] == state["first_attempt"] == state["classifications"] == DOCUMENTS
    assert state["completed"] + state["in_review"] == DOCUMENTS  # every job settled, review with its reason
    assert state["labels"] == state["completed"]
    assert state["unpublished"] == 0
    assert state["answers"] == answered
    assert state["batches"] == ("collected" if fate[0] == "expired" else "lost")
    if texts is not None:
        assert len(texts) == DOCUMENTS

    # Run the same date again: nothing registered, submitted, asked or written twice.
    again = run(deployment, model, logical_date)
    assert again.returncode == 0, again.stdout[-3000:]
    assert ledger(deployment, day) == state
    assert (model.request_count, model.batches.created) == (DOCUMENTS - answered, 1)


def test_batch_mode_with_the_keyword_classifier_is_refused_when_the_run_starts(
    deployment: Deployment, model: FakeOpenAIServer
) -> None:
    result = run(deployment, model, "2026-11-11", classifier="keyword")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "ModelModeRefused" in output or "model_mode batch sends documents" in output, output[-3000:]
    assert "only the llm classifier has" in output
    assert (
        deployment.scalar("SELECT count(*) FROM triage.jobs WHERE starts_with(batch_key, :b)", b=batch_of("2026-11-10"))
        == 0
    )
    assert model.batches.created == model.request_count == 0
