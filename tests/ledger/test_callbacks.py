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

from tests.ledger.helpers import new_jobs
from triage.adapters.callbacks import on_task_failure
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Advance, Complete, Release
from triage.jobs.vocabulary.states import JobStatus
from triage.operators import (
    ClassifyDocumentsOperator,
    PersistLabelsOperator,
    PublishEventsOperator,
    RetrieveDocumentsOperator,
)
from triage.operators.base import TriageOperator

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"


STEPS: dict[str, type[TriageOperator]] = {
    "retrieve": RetrieveDocumentsOperator,
    "classify": ClassifyDocumentsOperator,
    "persist": PersistLabelsOperator,
    "publish_events": PublishEventsOperator,
}


def failure_context(
    map_index: int, try_number: int = 4, *, run: str = RUN, task_id: str = "classify"
) -> dict[str, Any]:
    """What Airflow hands ``on_failure_callback`` for one (map index of a) task of a run."""
    ti = SimpleNamespace(
        dag_id="classify_documents", run_id=run, task_id=task_id, map_index=map_index, try_number=try_number
    )
    task = SimpleNamespace(triage_conn_id="triage_db", task_id=task_id, ledger_step=STEPS[task_id].ledger_step)
    return {
        "ti": ti,
        "task": task,
        "exception": RuntimeError("boom"),
        "data_interval_start": datetime(2026, 11, 5, tzinfo=UTC),
        "data_interval_end": datetime(2026, 11, 6, tzinfo=UTC),
    }


def owner(map_index: int, try_number: int = 1, *, run: str = RUN, task_id: str = "classify") -> str:
    return f"classify_documents/{run}/{task_id}/{map_index}/try{try_number}"


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
        unheld = list(
            conn.execute(
                sa.text("SELECT id FROM triage.jobs WHERE batch_key = :b AND status = 'queued'"), {"b": BATCH}
            ).scalars()
        )

    on_task_failure(failure_context(failed))

    assert statuses(store, alive_ids) == [JobStatus.RUNNING] * 2
    assert statuses(store, dead_ids) == [JobStatus.MANUAL_REVIEW] * 2
    with store.engine.connect() as conn:
        unclaimed = conn.execute(
            sa.text(
                "SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status = 'manual_review'"
                " AND lease_rescues = 0 AND NOT (id = ANY(:ids))"
            ),
            {"b": BATCH, "ids": dead_ids},
        ).scalar_one()
        reasons = conn.execute(sa.text("SELECT DISTINCT reason FROM triage.manual_review")).scalars().all()
    assert unclaimed == 0  # nobody held them: a sibling (or its next try) will claim them
    assert statuses(store, unheld) == [JobStatus.QUEUED] * 2
    assert reasons == ["airflow_task_failed"]

    # The sibling records its jobs as usual; the callback again (Airflow may call it twice) moves nothing.
    store.record(alive, [Complete(j.id, j.attempt) for j in alive.jobs])
    on_task_failure(failure_context(failed))
    assert statuses(store, alive_ids) == [JobStatus.COMPLETED] * 2


@pytest.mark.parametrize(
    ("sibling_state", "unheld_end"),
    [("failed", "manual_review"), ("running", "queued"), (None, "queued"), ("success", "manual_review")],
)
def test_the_last_map_index_to_fail_takes_the_unleased_jobs_too(
    db_url: DatabaseUrl,
    store: JobStore,
    monkeypatch: pytest.MonkeyPatch,
    sibling_state: str | None,
    unheld_end: str,
) -> None:
    """Airflow's own answer (``get_task_states``) decides: while a sibling may still claim, the
    unleased jobs are its; once none can, the failed index sends them to review at once."""
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    store.register(new_jobs(4), batch_key=BATCH, step="classify", max_attempts=3, actor=owner(0, task_id="retrieve"))
    context = failure_context(0)
    states = {RUN: {"classify_0": "running", "classify_1": sibling_state}}
    context["ti"].get_task_states = lambda **kw: states if kw["run_ids"] == [RUN] else {}

    on_task_failure(context)

    with store.engine.connect() as conn:
        ends = (
            conn.execute(sa.text("SELECT DISTINCT status::text FROM triage.jobs WHERE batch_key = :b"), {"b": BATCH})
            .scalars()
            .all()
        )
    assert ends == [unheld_end]


# -- two runs of one date share its batch ---------------------------------------------------

SCHEDULED = "scheduled__2026-11-06T00:00:00+00:00"


def two_runs(store: JobStore) -> dict[str, dict[str, set[Any]]]:
    """The scheduled run and then a manual run of the same date, each mid-way through its work:
    per run, the jobs it advanced to persist, released unstarted, holds under an expired and
    under a live lease (its map index 1), and registered without anyone claiming them yet. The
    manual run's claims take the scheduled run's unclaimed jobs first: the batch is shared."""

    def take(run: str, n: int, index: int = 0) -> Any:
        return store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=300, owner=owner(index, run=run))

    work: dict[str, dict[str, set[Any]]] = {}
    claimed: set[Any] = set()
    for run in (SCHEDULED, RUN):
        registered = store.register(
            new_jobs(7, prefix=run[:6]),
            batch_key=BATCH,
            step="classify",
            max_attempts=3,
            actor=owner(0, run=run, task_id="retrieve"),
        ).new_ids
        advanced = take(run, 2)  # accepted by the model, waiting at persist for the label action
        store.record(advanced, [Advance(j.id, j.attempt, "persist") for j in advanced.jobs])
        released = take(run, 1)  # claimed, then given back unstarted
        store.record(released, [Release(j.id, j.attempt) for j in released.jobs])
        expired = take(run, 1, index=1)  # its worker died
        with store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = :id"),
                {"id": expired.jobs[0].id},
            )
        live = take(run, 1, index=1)  # another map index of the run, still working
        mine = {
            name: {j.id for j in got.jobs}
            for name, got in (("advanced", advanced), ("released", released), ("expired", expired), ("live", live))
        }
        taken = set().union(*mine.values())
        for earlier in work.values():  # a job this run moved last is this run's now
            for ids in earlier.values():
                ids -= taken
        claimed |= taken
        work[run] = {**mine, "registered": set(registered)}
    for run in work:
        work[run]["unclaimed"] = work[run].pop("registered") - claimed
    return work


@pytest.mark.parametrize(
    ("task_id", "map_index", "moved"),
    [
        # classify's last map index: its run's classify jobs, not those its live sibling holds
        pytest.param("classify", 0, ("released", "expired", "unclaimed"), id="classify"),
        pytest.param("persist", -1, ("advanced",), id="persist"),
        pytest.param("publish_events", -1, (), id="publish_events-holds-no-jobs"),
    ],
)
@pytest.mark.parametrize(
    "failed_run", [pytest.param(RUN, id="manual-fails"), pytest.param(SCHEDULED, id="scheduled-fails")]
)
def test_a_failed_task_of_one_run_never_touches_another_runs_jobs_of_the_same_date(
    db_url: DatabaseUrl,
    store: JobStore,
    monkeypatch: pytest.MonkeyPatch,
    failed_run: str,
    task_id: str,
    map_index: int,
    moved: tuple[str, ...],
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    work = two_runs(store)
    if failed_run == RUN:  # the later run moved last every kind of job it touched
        assert all(work[RUN][name] for name in ("advanced", "released", "expired", "live", "unclaimed"))
    other = next(run for run in work if run != failed_run)
    everything = set().union(*work[failed_run].values(), *work[other].values())
    before = {i: store.get_status(i) for i in everything}
    context = failure_context(map_index, run=failed_run, task_id=task_id)
    context["ti"].get_task_states = lambda **kw: {failed_run: {"classify_0": "failed", "classify_1": "failed"}}

    on_task_failure(context)

    expected = set().union(*(work[failed_run][name] for name in moved))
    after = {i: store.get_status(i) for i in everything}
    assert {i for i in everything if after[i] != before[i]} == expected
    assert all(after[i] == JobStatus.MANUAL_REVIEW for i in expected)
    on_task_failure(context)  # Airflow may call it twice: nothing more moves
    assert {i for i in everything if store.get_status(i) != before[i]} == expected
