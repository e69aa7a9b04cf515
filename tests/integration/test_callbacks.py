"""The failure callback with ``classify`` mapped: when Airflow gives up on one map index, what
that index held goes to review; the jobs nobody holds and those a sibling map index holds under
a live lease stay (the siblings are still working on the batch; if the whole run fails,
reconciliation moves what is left)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.helpers import new_jobs
from triage.callbacks import on_task_failure
from triage.database import DatabaseUrl
from triage.jobs.models import Complete
from triage.jobs.states import JobStatus
from triage.jobs.store import JobStore

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"


def failure_context(map_index: int, try_number: int = 4) -> dict[str, Any]:
    """What Airflow hands ``on_failure_callback`` for one map index of ``classify``."""
    ti = SimpleNamespace(dag_id="classify_documents", run_id=RUN, task_id="classify", map_index=map_index,
                         try_number=try_number)  # fmt: skip
    return {"ti": ti, "task": SimpleNamespace(triage_conn_id="triage_db"), "exception": RuntimeError("boom"),
            "data_interval_start": datetime(2026, 11, 5, tzinfo=UTC),
            "data_interval_end": datetime(2026, 11, 6, tzinfo=UTC)}  # fmt: skip


def owner(map_index: int, try_number: int = 1) -> str:
    return f"classify_documents/{RUN}/classify/{map_index}/try{try_number}"


def statuses(store: JobStore, ids: list[Any]) -> list[JobStatus]:
    return [store.get_status(i) for i in ids]


@pytest.mark.parametrize(
    ("failed", "sibling"),
    [pytest.param(0, 1, id="map-0-fails-1-holds"), pytest.param(1, 10, id="map-1-fails-10-holds")],
)
def test_a_failed_map_index_spares_the_jobs_its_sibling_holds(
    db_url: DatabaseUrl, store: JobStore, monkeypatch: pytest.MonkeyPatch, failed: int, sibling: int
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    store.register(new_jobs(6), batch_key=BATCH, step="classify", max_attempts=3)
    dead = store.claim(batch_key=BATCH, step="classify", limit=2, lease_seconds=300, owner=owner(failed, 4))
    alive = store.claim(batch_key=BATCH, step="classify", limit=2, lease_seconds=300, owner=owner(sibling))
    dead_ids, alive_ids = [j.id for j in dead.jobs], [j.id for j in alive.jobs]
    with store.engine.connect() as conn:
        unheld = list(conn.execute(sa.text("SELECT id FROM triage.jobs WHERE batch_key = :b AND status = 'queued'"),
                                   {"b": BATCH}).scalars())  # fmt: skip

    on_task_failure(failure_context(failed))

    assert statuses(store, alive_ids) == [JobStatus.RUNNING] * 2
    assert statuses(store, dead_ids) == [JobStatus.MANUAL_REVIEW] * 2
    with store.engine.connect() as conn:
        unclaimed = conn.execute(
            sa.text("SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status = 'manual_review'"
                    " AND lease_rescues = 0 AND NOT (id = ANY(:ids))"), {"b": BATCH, "ids": dead_ids},
        ).scalar_one()  # fmt: skip
        reasons = conn.execute(sa.text("SELECT DISTINCT reason FROM triage.manual_review")).scalars().all()
    assert unclaimed == 0  # nobody held them: a sibling (or its next try) will claim them
    assert statuses(store, unheld) == [JobStatus.QUEUED] * 2
    assert reasons == ["airflow_task_failed"]

    # The sibling records its jobs as usual; the callback again (Airflow may call it twice) moves nothing.
    store.record(alive, [Complete(j.id, j.attempt) for j in alive.jobs])
    on_task_failure(failure_context(failed))
    assert statuses(store, alive_ids) == [JobStatus.COMPLETED] * 2


@pytest.mark.parametrize(("sibling_state", "unheld_end"), [("failed", "manual_review"), ("running", "queued"),
                                                          (None, "queued"), ("success", "manual_review")])  # fmt: skip
def test_the_last_map_index_to_fail_takes_the_unleased_jobs_too(
    db_url: DatabaseUrl, store: JobStore, monkeypatch: pytest.MonkeyPatch, sibling_state: str | None,
    unheld_end: str,
) -> None:  # fmt: skip
    """Airflow's own answer (``get_task_states``) decides: while a sibling may still claim, the
    unleased jobs are its; once none can, the failed index sends them to review at once."""
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    store.register(new_jobs(4), batch_key=BATCH, step="classify", max_attempts=3)
    context = failure_context(0)
    states = {RUN: {"classify_0": "running", "classify_1": sibling_state}}
    context["ti"].get_task_states = lambda **kw: states if kw["run_ids"] == [RUN] else {}

    on_task_failure(context)

    with store.engine.connect() as conn:
        ends = conn.execute(sa.text("SELECT DISTINCT status::text FROM triage.jobs WHERE batch_key = :b"),
                            {"b": BATCH}).scalars().all()  # fmt: skip
    assert ends == [unheld_end]
