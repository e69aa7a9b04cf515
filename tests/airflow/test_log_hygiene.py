"""Logs of a real pipeline run carry ids, never documents, prompts or passwords.

``airflow dags test classify_documents`` with the llm classifier against the fake
OpenAI-compatible server (an API key in ``triage_llm``) and a password in ``triage_db`` (the
embedded server trusts local sockets, so the password is never checked, only carried): then
every file under the deployment's Airflow home and TRIAGE_HOME plus the captured stdout and
stderr is scanned for the documents' sentences, the prompt's instructions and both passwords.
Per-job lines must carry ``job_id``, ``correlation_id`` and ``attempt`` as fields of the event
(keys of a JSON task log line), never in the message.

A second DAG checks Airflow's secret masker: fetching the connection registers its password,
and ``redact`` replaces it. It does not log the password itself: ``airflow dags test`` runs
tasks in-process and its console output does not pass through the masker (a password logged
with ``logging`` appeared in clear, Airflow 3.3.2), so the guarantee is Triage's own: it never
logs a credential, which the scan above checks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, keyword_responder
from tests.harness.deployment import Deployment

API_KEY = "sk-triage-LOGSCAN-4f1c9a7e2b"
DB_PASSWORD = "pg-triage-LOGSCAN-93d0e5aa"
CONF = {
    "documents": 120,
    "classifier": "llm",
    "max_attempts": 3,
    "concurrency": 4,
    "drill": {"transient_error_rate": 0.1, "permanent_error_rate": 0.05, "inconclusive_rate": 0.1, "seed": 3},
}
PER_JOB = re.compile(r'job_id"?\s*[=:]\s*"?([0-9a-f-]{36})\b')
"""A line naming a job by a field: ``job_id=`` of the console's rendering of a log event
(``airflow dags test`` runs tasks in-process and prints their logs; Airflow 3.3.2 writes no JSON
task log file then, so the JSON form is ``tests/unit/test_job_log_fields.py``'s), or a key of a
JSON line (the published events in the event log, which carry the same ids)."""

LEAKY_DAG = """
from __future__ import annotations

import logging
from datetime import datetime

from airflow.sdk import BaseHook, dag, task


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def triage_leaky():
    @task
    def leak() -> None:
        from airflow.sdk.log import redact

        conn = BaseHook.get_connection("triage_llm")  # registers the password with the masker
        logging.getLogger("triage.leaky").info("masked: %s", redact(f"the key is {conn.password}"))

    leak()


triage_leaky()
"""


def with_passwords(deployment: Deployment, server: FakeOpenAIServer) -> dict[str, str]:
    db = json.loads(deployment.env["AIRFLOW_CONN_TRIAGE_DB"])
    llm = {"conn_type": "http", "host": server.base_url, "password": API_KEY, "extra": {"model": "fake"}}
    return {
        **deployment.env,
        "AIRFLOW_CONN_TRIAGE_DB": json.dumps({**db, "password": DB_PASSWORD}),
        "AIRFLOW_CONN_TRIAGE_LLM": json.dumps(llm),
    }


def written_logs(*roots: Path) -> dict[Path, str]:
    """Every text file under ``roots`` except the stored payloads (the documents themselves)."""
    found = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and "payloads" not in path.parts and path.suffix not in (".db", ".pid"):
                found[path] = path.read_text(encoding="utf-8", errors="replace")
    return found


def document_sentences(payloads: Path) -> set[str]:
    """Distinctive pieces of every stored document: subjects and body sentences of 25+ characters."""
    pieces = set()
    decoder = json.JSONDecoder()
    for path in payloads.rglob("*"):
        if path.is_file():
            text, at = path.read_text(), 0
            while at < len(text):  # a pack: the documents of a chunk, one after the other
                doc, at = decoder.raw_decode(text, at)
                pieces.add(doc["subject"])
                pieces.update(s.strip() for s in re.split(r"[.!?\n]", doc["body"]) if len(s.strip()) >= 25)
    assert pieces, "the run stored documents"
    return {p for p in pieces if len(p) >= 20}


@pytest.fixture(scope="module")
def scanned(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from triage.classifiers import Taxonomy

    with FakeOpenAIServer(responder=keyword_responder(Taxonomy.load())) as server:
        env = with_passwords(deployment, server)
        run = deployment.dags_test("classify_documents", "2026-11-03", "-c", json.dumps(CONF), env=env)
        prompts = [m["content"] for body in server.requests for m in body.get("messages", [])]
        leaky_dags = tmp_path_factory.mktemp("leaky-dags")
        (leaky_dags / "triage_leaky.py").write_text(LEAKY_DAG)
        # another DAG folder: a cold process (the warm one read its folder when it started)
        leaky_env = {**env, "AIRFLOW__CORE__DAGS_FOLDER": str(leaky_dags)}
        leaky = deployment.dags_test("triage_leaky", "2026-11-03", env=leaky_env)
    files = written_logs(Path(deployment.env["AIRFLOW_HOME"]), deployment.home)
    return {
        "run": run,
        "leaky": leaky,
        "prompts": prompts,
        "files": files,
        "texts": {"stdout": run.stdout, "stderr": run.stderr, **{str(p): t for p, t in files.items()}},
    }


def test_the_run_succeeds_and_wrote_logs(scanned: dict) -> None:
    run = scanned["run"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert scanned["prompts"], "the llm classifier was not called"
    assert any(PER_JOB.search(t) for t in scanned["texts"].values()), "no per-job line was logged anywhere"


def test_no_log_holds_document_text(deployment: Deployment, scanned: dict) -> None:
    sentences = document_sentences(deployment.home / "payloads")
    assert len(sentences) > 50
    leaks = [(where, s) for where, text in scanned["texts"].items() for s in sentences if s in text]
    assert leaks == []


def test_no_log_holds_the_prompt(scanned: dict) -> None:
    # the instructions of the system message (the user message is the document itself)
    instructions = {line.strip() for p in scanned["prompts"] for line in p.splitlines() if len(line.strip()) >= 40}
    assert instructions
    leaks = [(where, s[:60]) for where, text in scanned["texts"].items() for s in instructions if s in text]
    assert leaks == []


def test_no_log_holds_a_password(scanned: dict) -> None:
    texts = {**scanned["texts"], "leaky stdout": scanned["leaky"].stdout, "leaky stderr": scanned["leaky"].stderr}
    leaks = [where for where, text in texts.items() for secret in (API_KEY, DB_PASSWORD) if secret in text]
    assert leaks == []


def test_the_secret_masker_masks_a_printed_password(scanned: dict) -> None:
    leaky = scanned["leaky"]
    assert leaky.returncode == 0, leaky.stdout[-3000:] + leaky.stderr[-3000:]
    out = leaky.stdout + leaky.stderr
    assert "masked: the key is ***" in out, "\n".join(line for line in out.splitlines() if "key" in line)
    assert API_KEY not in out


def test_every_per_job_line_carries_its_correlation_id(deployment: Deployment, scanned: dict) -> None:
    import sqlalchemy as sa

    engine = deployment.engine()
    try:
        with engine.connect() as conn:
            correlation = {str(i): c for i, c in conn.execute(sa.text("SELECT id, correlation_id FROM triage.jobs"))}
    finally:
        engine.dispose()
    lines = [line for text in scanned["texts"].values() for line in text.splitlines() if PER_JOB.search(line)]
    assert lines
    log_lines = 0
    for line in lines:
        match = PER_JOB.search(line)
        assert match, line
        job_id = match.group(1)
        if line.lstrip().startswith("{"):  # a JSON line: the fields are keys
            event = json.loads(line)
            assert (event["job_id"], event["correlation_id"]) == (job_id, correlation[job_id]), line
            assert isinstance(event["attempt"], int), line
            if "event_id" not in event:  # a task log line (else a published event, of the event log)
                assert job_id not in event["event"], line
                log_lines += 1
        else:  # the console's rendering: the event, then key=value
            assert f"correlation_id={correlation[job_id]}" in line, line
            assert "attempt=" in line, line
            log_lines += 1
    assert log_lines, "no per-job log line carried its job's fields"
