"""Per-job log lines carry ``job_id``, ``correlation_id`` and ``attempt`` as keys of Airflow 3's
JSON task log, not as text of the message, so a log search can filter on them.

In a child process (Airflow's logging is process-wide): the task side configured exactly as
Airflow's task runner does (``airflow.sdk.log.configure_logging(json_output=True,
sending_to_supervisor=True)``, JSON lines to the supervisor), then the supervisor's own reader
(``process_log_messages_from_subprocess``) writing them with the task log file's processors, as
``supervise_task`` does. What comes out is a task log file's lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TASK = r"""
import io, logging, os, sys, uuid
from datetime import UTC, datetime

import structlog
from airflow.sdk.execution_time.supervisor import process_log_messages_from_subprocess
from airflow.sdk.log import configure_logging, logging_processors

channel = io.BytesIO()
configure_logging(json_output=True, output=channel, sending_to_supervisor=True)

from triage.jobs.vocabulary.models import ClaimedJob, Fail, RetryLater, SendToReview
from triage.observability import log_job_outcomes

def job(n, correlation):
    return ClaimedJob(uuid.UUID(int=n), "k", "s", "e", "h", "r", "v", correlation, "classify", 2, 3,
                      datetime(2026, 11, 1, tzinfo=UTC))

jobs = [job(1, "corr-1"), job(2, "client id\nlevel=error forged"), job(3, "corr-3")]
log = logging.getLogger("triage.pipeline.steps")
log_job_outcomes(log, "classify", jobs, [
    RetryLater(jobs[0].id, 2, "timeout"),
    SendToReview(jobs[1].id, 2, "inconclusive", "inconclusive"),
    Fail(jobs[2].id, 2, "unsupported_schema", "unsupported_schema"),
])
log.info("step=classify batch=b claimed=3")  # a batch line: no job's fields

out = io.BytesIO()
logger = structlog.wrap_logger(
    structlog.BytesLogger(out), processors=logging_processors(json_output=True), logger_name="task"
).bind()
reader = process_log_messages_from_subprocess((logger,))
next(reader)
for line in channel.getvalue().splitlines():
    reader.send(line)
# to a file of its own: whatever else the process prints (a warning of Airflow's) is not the log
with open(os.environ["TRIAGE_TEST_TASK_LOG"], "wb") as f:
    f.write(out.getvalue())
"""


@pytest.fixture(scope="module")
def task_log(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRIAGE_TEST_TASK_LOG": str(home / "task.log"),
    }
    done = subprocess.run(
        [sys.executable, "-c", TASK], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (home / "task.log").read_text().splitlines() if line.strip()]


def test_every_per_job_line_has_the_jobs_fields_as_keys(task_log: list[dict[str, object]]) -> None:
    per_job = [line for line in task_log if "job_id" in line]
    assert [(line["job_id"], line["correlation_id"], line["attempt"]) for line in per_job] == [
        ("00000000-0000-0000-0000-000000000001", "corr-1", 2),
        ("00000000-0000-0000-0000-000000000002", "client id\nlevel=error forged", 2),
        ("00000000-0000-0000-0000-000000000003", "corr-3", 2),
    ]
    assert [line["level"] for line in per_job] == ["warning", "warning", "warning"]
    assert all(line["max_attempts"] == 3 for line in per_job)


def test_the_ids_are_not_baked_into_the_message(task_log: list[dict[str, object]]) -> None:
    for line in task_log:
        event = str(line["event"])
        assert not any(part in event for part in ("corr-", "forged", "0000-0000")), event
    assert [str(line["event"]).split()[1] for line in task_log if "job_id" in line] == [
        "retry",
        "manual_review",
        "terminal_failed",
    ]


def test_the_fields_are_bound_for_their_line_only(task_log: list[dict[str, object]]) -> None:
    [batch] = [line for line in task_log if str(line["event"]).startswith("step=classify batch=")]
    assert not {"job_id", "correlation_id", "attempt"} & set(batch)
