"""``classify_documents``' deadline alert through a real scheduler: Airflow 3.3.2 creates the
deadline with the run, its scheduler marks it missed, the LocalExecutor runs the Triage notifier
(``SyncCallback``), and the webhook of ``triage_alerts`` gets one alert.

A probe DAG (``tests/e2e/dags/deadline_probe.py``) carries the same
:func:`~triage.operators.alerts.classify_deadline` (reference, interval, callback) with a task
slower than the time left to its deadline: the runs are
triggered with logical dates that put one deadline seconds ahead (a miss while it runs) and one
in the past before it is queued (a backfill of an old date: no alert).

Owns the ``deadline_probe`` DAG and its alerts."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from tests.e2e.conftest import E2E
from tests.harness.airflow import wait_for_runs
from triage.operators.alerts import CLASSIFY_DEADLINE


def missed_and_called(e2e: E2E) -> dict[str, tuple[bool, str]]:
    """Per run: whether the scheduler marked its deadline missed, and how its callback ended."""
    engine = sa.create_engine(e2e.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT r.run_id, d.missed, c.state FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id"
                    " JOIN callback c ON c.id = d.callback_id WHERE r.dag_id = 'deadline_probe'"
                )
            ).all()
    finally:
        engine.dispose()
    return {row.run_id: (row.missed, str(row.state)) for row in rows}


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def test_a_missed_deadline_reaches_the_webhook_through_the_scheduler(e2e: E2E) -> None:
    af, provider = e2e.airflow, e2e.provider
    now = datetime.now(UTC)
    af.post(
        "/api/v2/dags/deadline_probe/dagRuns",
        {"dag_run_id": "late", "logical_date": iso(now - CLASSIFY_DEADLINE + timedelta(seconds=20))},
    )
    af.post(
        "/api/v2/dags/deadline_probe/dagRuns", {"dag_run_id": "old_date", "logical_date": iso(now - timedelta(days=30))}
    )
    key = "triage-alert/deadline_missed/deadline_probe/late"
    give_up = time.monotonic() + 240
    while key not in provider.requests and time.monotonic() < give_up:
        time.sleep(1)
    assert key in provider.requests, af.logs(120)
    runs = wait_for_runs(af.env, "deadline_probe", 2, ("success",), timeout=240)

    assert [r["run_id"] for r in runs] == ["old_date", "late"]
    assert missed_and_called(e2e) == {"late": (True, "success"), "old_date": (True, "success")}
    probes = {k: n for k, n in provider.requests.items() if "/deadline_probe/" in k}
    assert probes == {key: 1}  # the old date's deadline was gone before it was queued
    alert = provider.effects[key]["triage_alert"]
    assert alert["kind"] == "deadline_missed"
    assert alert["details"]["state"] == "running"
    assert alert["links"]["run"].endswith("/dags/deadline_probe/runs/late")
