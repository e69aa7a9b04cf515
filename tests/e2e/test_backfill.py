"""A backfill of three dates through a real scheduler: what `./airflow.sh backfill create` does.

Owns ``classify_documents``' logical dates 2026-11-01 to 2026-11-03 and their batches."""

from __future__ import annotations

from tests.e2e.conftest import E2E
from tests.harness.airflow import wait_for_runs

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
DOCUMENTS = 1000  # the params' default: a backfill runs with the default params


def test_backfill_three_dates_through_the_scheduler(e2e: E2E) -> None:
    e2e.cli("dags", "unpause", "classify_documents")
    e2e.backfill("classify_documents", DAYS[0], DAYS[-1])
    runs = wait_for_runs(
        e2e.env,
        "classify_documents",
        3,
        ("success",),
        timeout=420,
        run_type="backfill",
        where=lambda run: str(run["logical_date"])[:10] in DAYS,
    )

    assert len(runs) == 3
    assert all(run["state"] == "success" for run in runs)
    for day in DAYS:
        batch = f"{day}T00:00:00+00:00/"
        scalar = e2e.deployment.scalar
        jobs = scalar("SELECT count(*) FROM triage.jobs WHERE starts_with(batch_key, :b)", b=batch)
        settled = scalar(
            "SELECT count(*) FROM triage.jobs WHERE starts_with(batch_key, :b)"
            " AND status IN ('completed', 'manual_review', 'terminal_failed')",
            b=batch,
        )
        assert (jobs, settled) == (DOCUMENTS, DOCUMENTS), day
