"""``make distributed`` end to end: one day of ``classify_documents`` under the CeleryExecutor,
with Redis and two Celery workers started by :mod:`triage_tools.distributed`. Debian's ``redis-server``
comes from ``make test-deps`` (which ``make test`` runs); the test never installs it: without it,
it skips saying so (and fails under ``CI=true``, where the make target must have installed it).

The model is the fake OpenAI-compatible server with 50 ms a call, so that classifying a claim of
1,000 jobs takes seconds and the two ``classify`` map indexes overlap on the two workers. What
is deterministic and asserted: the run succeeds, both map indexes succeed, the tasks ran on more
than one worker (each worker takes one task at a time, and the two map indexes are queued
together), every job of the batch is settled and the drill's invariants hold. That both map
indexes claimed jobs depends on timing (the second must start before the first has claimed
everything: a window of about twelve seconds here); it is asserted too, and says so if it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import date

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, keyword_responder
from tests.harness.deployment import Deployment
from triage.classifiers.taxonomy import Taxonomy

DAY = date(2026, 11, 10)
DOCUMENTS = 2000


@pytest.fixture(scope="module", autouse=True)  # autouse: checked before the deployment is made
def redis_server() -> str:
    """Debian's ``redis-server``, found on PATH as :mod:`triage_tools.celery_deployment` will find it (so
    it installs nothing)."""
    found = shutil.which("redis-server")
    if found:
        return found
    reason = "no redis-server: `make test-deps` installs Debian's redis-server as root (apt-get install redis-server)"
    if os.environ.get("CI") == "true":  # CI runs make test as root: a skip there would hide a broken setup
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.mark.slow
def test_a_day_on_two_celery_workers_keeps_every_invariant(deployment: Deployment) -> None:
    from triage_tools.distributed import format_run, run_distributed

    started = time.monotonic()
    with FakeOpenAIServer(responder=keyword_responder(Taxonomy.load()), latency_ms=50) as model:
        env = {
            **deployment.env,
            "AIRFLOW_CONN_TRIAGE_LLM": json.dumps({"conn_type": "http", "host": model.base_url}),
            # Two classify instances for this small day (the DAG would give it one): the split is the point.
            "AIRFLOW_VAR_TRIAGE_CLASSIFY_JOBS_PER_WORKER": str(DOCUMENTS // 2),
        }
        run = run_distributed(
            env,
            DAY,
            {"documents": DOCUMENTS, "classifier": "llm", "concurrency": 4},
            workers=2,
            concurrency=1,
            timeout=600,
        )
    report = format_run(run)
    print(f"\n{report}\nwall clock {time.monotonic() - started:.1f}s")

    assert run.state == "success", report
    assert run.summary.total == DOCUMENTS, report
    classify = {t.map_index: t.state for t in run.tries if t.task_id == "classify"}
    assert classify == {0: "success", 1: "success"}, report
    classify_hosts = {t.hostname for t in run.tries if t.task_id == "classify" and t.hostname}
    assert len(classify_hosts) == 2, f"both classify map indexes ran on one worker: {report}"
    assert run.hostnames <= set(run.workers), report  # hostnames are the Celery node names
    assert [i.name for i in run.invariants if not i.holds] == [], report
    assert sum(run.claims_by_map_index.values()) >= DOCUMENTS, report
    assert all(run.claims_by_map_index.get(i, 0) > 0 for i in (0, 1)), (
        f"one classify map index claimed every job (timing: it started too late to share): {report}"
    )
