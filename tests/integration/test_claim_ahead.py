"""The next claim taken while the current one is handled (``RunSettings.claim_ahead``, the
classify step of the llm classifier), on the real database: every job is classified once; the
claim taken ahead keeps its lease while it waits; and whatever stops the step (a drain, an
error, an outage) gives its jobs back or parks them: nothing is left ``running``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.integration.test_ownership import BATCH, KeywordModel, register, rows
from triage.classifiers.base import TransientClassifierError
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.ownership import Drain
from triage.pipeline.steps import CircuitOpen, Drained, RunSettings, run_step


def run(store: JobStore, payloads: PayloadStore, model: Any, drain: Drain | None = None, **settings: Any) -> None:
    handler = ClassifyHandler(model, payloads, ClassifySettings(0.0, 1))
    try:
        run_step(
            store,
            handler,
            batch_key=BATCH,
            settings=RunSettings(**{"owner": "w", "batch_size": 3, "claim_ahead": True, **settings}),
            drain=drain,
        )
    finally:
        handler.close()


def ledger(store: JobStore) -> list[tuple[str, int, str | None]]:
    return sorted(
        (r.status, r.attempt, r.status_reason)
        for r in rows(store, "SELECT status::text, attempt, status_reason FROM triage.jobs")
    )


def claims_per_job(store: JobStore) -> set[int]:
    with store.engine.connect() as conn:
        return set(
            conn.execute(
                sa.text("SELECT count(*) FILTER (WHERE to_status = 'running') FROM triage.job_events GROUP BY job_id")
            ).scalars()
        )


def test_every_job_is_claimed_once_and_classified(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 10)
    model = KeywordModel(lambda n: time.sleep(0.01))
    run(store, payloads, model)
    assert ledger(store) == [("completed", 1, "completed")] * 10
    assert len(model.calls) == len(set(model.calls)) == 10
    assert claims_per_job(store) == {1}


def test_a_claim_taken_ahead_keeps_its_lease_while_a_slow_claim_is_handled(store: JobStore, tmp_path: Path) -> None:
    """A claim of two calls of 1.2 s each outlasts the 1.5 s lease: the claim taken ahead at
    its start is heartbeated meanwhile, so it is still ours when its turn comes."""
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 4)
    run(store, payloads, KeywordModel(lambda n: time.sleep(1.2)), batch_size=2, lease_seconds=1.5)
    assert ledger(store) == [("completed", 1, "completed")] * 4
    assert claims_per_job(store) == {1}


def test_a_drain_gives_back_the_claim_taken_ahead(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 9)
    drain = Drain(grace_seconds=0.2)

    def drain_at_the_second_call(n: int) -> None:
        if n == 2:
            drain.request()
            time.sleep(0.3)  # the heartbeats see it

    with pytest.raises(Drained):
        run(store, payloads, KeywordModel(drain_at_the_second_call), drain=drain)
    states = ledger(store)
    assert "running" not in {status for status, _, _ in states}
    assert all(attempt == 0 for status, attempt, _ in states if status == "queued")
    assert sum(1 for status, _, _ in states if status == "queued") >= 6  # the claim ahead and the unstarted


def test_an_error_gives_back_the_claim_taken_ahead(store: JobStore, tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowTaskTimeout

    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 9)

    def times_out_at_the_third(n: int) -> None:
        time.sleep(0.05)  # the claim ahead is taken meanwhile
        if n == 3:
            raise AirflowTaskTimeout("Timeout, PID: 1")

    with pytest.raises(AirflowTaskTimeout):
        run(store, payloads, KeywordModel(times_out_at_the_third), drain=Drain(grace_seconds=0.2))
    # Two classified; the third's claim and the claim ahead given back; three never claimed.
    expected = [("completed", 1, "completed")] * 2 + [("queued", 0, "released")] * 4 + [("queued", 0, "registered")] * 3
    assert ledger(store) == sorted(expected)


def test_an_outage_parks_the_claim_taken_ahead_with_the_rest(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 9)

    def down(n: int) -> None:
        time.sleep(0.05)
        raise TransientClassifierError("connection_error", "refused")

    with pytest.raises(CircuitOpen):
        run(store, payloads, KeywordModel(down))
    assert {(status, attempt, reason) for status, attempt, reason in ledger(store)} == {("waiting", 0, "outage:model")}
