"""The report in its three forms, from a ledger with every kind of case: the JSON summary (XCom
and the runs table), the Markdown summary (the task log), and the HTML page with its inline
SVG charts; the degraded path when the page cannot be rendered; and the page as headless
Chromium shows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import insert_job, new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import (
    ClassificationRecord,
    Complete,
    Fail,
    LabelWrite,
    NewJob,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import JobStatus
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.render import TEMPLATE_ENV
from triage.reconciliation.runner import RunOutcome, reconcile

BATCH = "2026-11-07T00:00:00+00:00/2026-11-08T00:00:00+00:00"
SECTIONS = [
    "Jobs by state and step",
    "Queue age",
    "Time in each state",
    "Attempts",
    "Retry reasons",
    "Manual review queue",
    "Repairs made",
    "Conflicts",
    "Schema-version mismatches",
    "Model outputs rejected by validation",
    "Outbox",
    "Quality (last 14 days)",
]


def record(
    kind: Literal["accepted", "inconclusive", "rejected"], label: str | None = None, reason: str | None = None
) -> ClassificationRecord:
    return ClassificationRecord(
        label,
        0.9 if kind == "accepted" else None,
        kind,
        "keyword-v1",
        rejected_reason=reason,
    )


def craft(store: JobStore) -> None:
    """Ten documents and every outcome; a malformed arrival; a lost review row; an expired lease."""
    docs = new_jobs(10, prefix="rep")
    arrival = NewJob(
        idempotency_key="s:bad:h:v",
        source="s",
        external_id="bad",
        content_sha256="h",
        payload_ref="ref",
        classifier_version="v",
        status=JobStatus.MANUAL_REVIEW,
        reason="malformed_input",
        error="unsupported_schema_version",
        review_context={"malformed_reason": "unsupported_schema_version"},
    )
    store.register([*docs, arrival], batch_key=BATCH, step="classify", max_attempts=3)
    got = store.claim(batch_key=BATCH, step="classify", limit=9, lease_seconds=60, owner="w1")
    j = got.jobs
    store.record(
        got,
        [
            *(
                Complete(x.id, 1, LabelWrite("billing", 0.9, "keyword-v1"), record("accepted", "billing"))
                for x in j[:4]
            ),
            RetryLater(j[4].id, 1, "timeout", delay_seconds=3600),
            RetryLater(j[5].id, 1, "rate_limited", delay_seconds=3600),
            RetryLater(j[6].id, 1, "rate_limited", delay_seconds=3600),
            SendToReview(
                j[7].id, 1, "rejected_output", "invalid_json", classification=record("rejected", None, "invalid_json")
            ),
            Fail(j[8].id, 1, "unsupported_schema_version", "unsupported_schema_version", "v9"),
        ],
    )
    store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w2")  # the tenth
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")
        )
        insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)  # lost its review row


@pytest.fixture
def outcome(store: JobStore, tmp_path: Path) -> RunOutcome:
    craft(store)
    return reconcile(store, ReconcileParams(grace_seconds=0), publish=lambda events: None, reports_dir=tmp_path)


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_the_json_summary_counts_everything(outcome: RunOutcome, store: JobStore) -> None:
    summary = json.loads(json.dumps(outcome.summary))  # what XCom stores
    assert summary["totals"]["jobs"] == 12
    assert summary["by_state"]["completed"] == 4
    assert summary["by_state"]["retryable_failed"] == 4  # three retries and the rescued lease
    assert summary["by_state"]["terminal_failed"] == 1
    assert summary["by_state"]["manual_review"] == 3
    assert {(r["reason"], r["count"]) for r in summary["retry_reasons"]} >= {
        ("rate_limited", 2),
        ("timeout", 1),
        ("lease_expired", 1),
    }
    assert summary["rejected_outputs"] == [{"reason": "invalid_json", "count": 1}]
    assert {(r["found_by"], r["status"], r["count"]) for r in summary["schema_mismatches"]} == {
        ("classify", "terminal_failed", 1),
        ("retrieval", "manual_review", 1),
    }
    queue = summary["review_queue"]
    assert queue["total"] == 3
    ages = [r["age_seconds"] for r in queue["rows"]]
    assert ages == sorted(ages, reverse=True)  # oldest first
    assert {r["reason"] for r in queue["rows"]} == {
        "malformed_input",
        "rejected_output",
        "reconciliation_missing_review",
    }
    assert {r["attempt"]: r["count"] for r in summary["attempts"]} == {0: 2, 1: 10}
    assert {r["status"] for r in summary["time_in_state"]} >= {"queued", "running"}
    assert all(r["p95_seconds"] >= r["median_seconds"] >= 0 for r in summary["time_in_state"])
    assert {r["action"] for r in summary["repairs"]} == {"lease_released", "insert_missing_review"}
    assert summary["html"]["rendered"] is True
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT summary, report_path, findings, repairs FROM triage.reconciliation_runs")
        ).one()
    assert row.summary["totals"] == summary["totals"]
    assert row.report_path == summary["html"]["path"]
    assert {r["rule"] for r in row.findings} == {
        "expired_leases",
        "stuck_work",
        "outbox",
        "consistency",
        "airflow_view",
        "outage_resumes",
        "dead_last_tries",
        "orphaned_work",
    }
    assert [r["action"] for r in row.repairs] == [r["action"] for r in summary["repairs"]]


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_the_markdown_has_every_section(outcome: RunOutcome) -> None:
    text = outcome.markdown
    assert text.startswith(f"# Reconciliation run {outcome.run_id} (repairs applied)")
    for section in SECTIONS:
        assert re.search(rf"^## {re.escape(section)}", text, re.MULTILINE), section
    assert "| rate_limited | 2 |" in text
    assert "| invalid_json | 1 |" in text
    assert "reconciliation_missing_review" in text
    assert "airflow_view: no Airflow API configured" in text


def test_the_html_page_has_its_charts_and_numbers_and_nothing_external(outcome: RunOutcome) -> None:
    assert outcome.html_path is not None
    page = outcome.html_path.read_text()
    assert (outcome.html_path.parent / "reconciliation-latest.html").read_text() == page
    assert page.count("<svg") == 8
    for title in (
        "Jobs by state",
        "Oldest job per state",
        "Time in state",
        "Attempts per job",
        "Retry reasons",
        "Rejected model outputs",
        "Coverage and audited precision per version (%)",
        "Quality over runs (%)",
    ):
        assert f"<title>{title}</title>" in page
    assert '<div class="tile" id="total-jobs"><b>12</b>' in page
    assert ">rate_limited<" in page
    assert ">invalid_json<" in page
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=[\"']?https?:", page)  # no CDN, nothing fetched
    assert "http://www.w3.org/2000/svg" in page  # the SVG namespace is the only URL


def test_a_page_that_cannot_be_rendered_does_not_fail_the_run(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    craft(store)
    monkeypatch.setenv(TEMPLATE_ENV, str(tmp_path / "no-templates-here"))
    outcome = reconcile(store, ReconcileParams(grace_seconds=0), reports_dir=tmp_path / "reports")
    assert outcome.html_path is None
    assert outcome.summary["html"] == {"path": None, "rendered": False}
    assert "## Repairs made" in outcome.markdown
    assert "could not be rendered" in caplog.text
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").glob("*.html"))
    with store.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT finished_at, report_path, summary FROM triage.reconciliation_runs")).one()
    assert row.finished_at is not None
    assert row.report_path is None
    assert row.summary["totals"]["repaired"] == outcome.summary["totals"]["repaired"] > 0


# -- the page in a browser ----------------------------------------------------------------------


def chromium() -> str:
    """Debian's chromium, which ``make test`` installs (``make test-deps``); never installed here."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = "no chromium: `make test-deps` installs Debian's chromium as root (apt-get install chromium)"
    if os.environ.get("CI") == "true":  # CI runs make test as root: a skip there would hide a broken setup
        pytest.fail(reason)
    pytest.skip(reason)


def headless(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120, check=False)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_chromium_renders_the_page_with_its_charts(outcome: RunOutcome, tmp_path: Path) -> None:
    binary = chromium()
    assert outcome.html_path is not None
    url = outcome.html_path.resolve().as_uri()
    shot = Path(os.environ.get("TRIAGE_REPORT_SCREENSHOT", tmp_path / "report.png"))
    result = headless(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,2000", url)
    assert shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert png_size(data) == (1200, 2000)
    assert len(data) > 30_000  # text, tables and eight charts, not a blank page
    dom = headless(binary, tmp_path / "profile2", "--dump-dom", url).stdout
    assert dom.count("<svg") == 8
    text = re.sub(r"<[^>]+>", " ", dom)
    assert f"Triage reconciliation run {outcome.run_id}" in text
    assert re.search(r"\b12\s+jobs\b", text)
    assert "rate_limited" in text
    assert "invalid_json" in text
    rendered: Any = re.findall(r"<rect[^>]*width=\"([0-9.]+)\"", dom)
    assert any(float(w) > 50 for w in rendered)  # bars have a length, the charts are drawn


@pytest.mark.parametrize(
    ("question", "indexes"),
    [
        ("schema_mismatches", {"job_events_unsupported_idx", "manual_review_unsupported_idx"}),
        ("rejected_outputs", {"classifications_rejected_idx"}),
    ],
)
def test_the_reports_rare_rows_are_read_through_their_partial_indexes(
    store: JobStore, question: str, indexes: set[str]
) -> None:
    """Issue #16, item 3: every 15 minutes, at any size, the report reads only the rows these
    questions ask for (migration 0020), never every retained transition, every review row ever
    written or every classification of the window. With sequential scans off, a predicate that
    no longer matches its partial index shows as a sequential scan of the table."""
    from triage.reconciliation import report_queries

    craft(store)
    statement = getattr(report_queries, question)()
    compiled = statement.compile(dialect=store.engine.dialect)
    with store.engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql(
                "EXPLAIN " + str(compiled), compiled.construct_params({"window": 3600.0})
            ).all()
        )
        parents: dict[str, str] = dict(  # the day partitions' copies of an index on job_events, by their parent's name
            conn.exec_driver_sql(
                "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = ANY(%(names)s)",
                {"names": sorted(indexes)},
            )
            .tuples()
            .all()
        )
    used = {parents.get(n, n) for n in re.findall(r"(?:using|Index Scan on) (\w+)", plan)}
    assert indexes <= used, plan
    assert not re.search(r"Seq Scan on (job_events|manual_review|classifications)", plan), plan
