"""A backfill of three dates through a real scheduler: what `./airflow.sh backfill create` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dags.airflow_harness import AirflowCli, running_airflow, wait_for_runs
from tests.dags.conftest import Deployment

ROOT = Path(__file__).resolve().parents[2]
DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
DOCUMENTS = 1000  # the params' default: a backfill runs with the default params


@pytest.mark.slow
def test_backfill_three_dates_through_the_scheduler(deployment: Deployment) -> None:
    with (
        running_airflow(deployment.env, ROOT / "dags", timeout=180, wait_for_dags=["classify_documents"]) as af,
        AirflowCli(af.env, deployment.home / "airflow-cli.log") as airflow_cli,  # two commands, one import
    ):
        airflow_cli("dags", "unpause", "classify_documents")
        airflow_cli(
            "backfill",
            "create",
            "--dag-id",
            "classify_documents",
            "--from-date",
            DAYS[0],
            "--to-date",
            DAYS[-1],
        )
        runs = wait_for_runs(af.env, "classify_documents", 3, ("success",), timeout=420, run_type="backfill")
    assert len(runs) == 3
    assert all(run["state"] == "success" for run in runs)
    for day in DAYS:
        batch = f"{day}T00:00:00+00:00/"
        jobs = deployment.scalar("SELECT count(*) FROM triage.jobs WHERE starts_with(batch_key, :b)", b=batch)
        settled = deployment.scalar(
            "SELECT count(*) FROM triage.jobs WHERE starts_with(batch_key, :b)"
            " AND status IN ('completed', 'manual_review', 'terminal_failed')",
            b=batch,
        )
        assert (jobs, settled) == (DOCUMENTS, DOCUMENTS), day
