"""What a ``classify`` instance hands ``persist`` (issue #29: ``persist`` is mapped over these
return values, so nothing handed over means the scheduler skips it): the jobs of its batch that
wait at the persist step, whoever left them there, on a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from tests.ledger.test_alerts import BATCH, owner, run_context
from tests.ledger.test_trailing_relay import operator_context, register_day
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Advance, ClassificationRecord, Complete
from triage.operators.classify_documents import SUMMARY_KEY, ClassifyDocumentsOperator
from triage.payloads import PayloadStore


def classify_task(store: JobStore, worker: int = 1) -> ClassifyDocumentsOperator:
    class Seamed(ClassifyDocumentsOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

    return Seamed(task_id="classify", worker=worker)


def hand_over(store: JobStore) -> tuple[Any, dict[str, Any]]:
    pushed: dict[str, Any] = {}
    context: Any = dict(run_context())
    context["ti"].xcom_push = lambda key, value: pushed.__setitem__(key, value)
    done = {"worker": 1, "claimed": 3, "seconds": 0.1}
    return classify_task(store).hand_over(context, done), pushed


def classified(store: JobStore, n: int, *, to_persist: int) -> None:
    """``n`` jobs of the batch classified: ``to_persist`` of them handed to the persist step (a
    label action), the rest completed by classify itself."""
    store.register(new_jobs(n), batch_key=BATCH, step="classify", max_attempts=3, actor=owner("retrieve"))
    claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner=owner("classify"))
    jobs = list(claim.jobs)
    record = ClassificationRecord("billing", 0.9, "accepted", "keyword-v1")
    outcomes: list[Any] = [Advance(j.id, j.attempt, "persist", record) for j in jobs[:to_persist]]
    outcomes += [Complete(j.id, j.attempt) for j in jobs[to_persist:]]
    store.record(claim, outcomes)


def test_an_instance_that_completed_every_job_hands_persist_nothing(store: JobStore) -> None:
    classified(store, 3, to_persist=0)
    handed, pushed = hand_over(store)
    assert handed is None  # no return value: persist is mapped over nothing, the scheduler skips it
    assert pushed == {SUMMARY_KEY: {"worker": 1, "claimed": 3, "seconds": 0.1}}  # its counts stay visible


@pytest.mark.parametrize("to_persist", [1, 3])
def test_jobs_waiting_at_the_persist_step_are_handed_over(store: JobStore, to_persist: int) -> None:
    classified(store, 3, to_persist=to_persist)
    handed, pushed = hand_over(store)
    assert handed == {"worker": 1, "persist": to_persist}
    assert SUMMARY_KEY in pushed


def test_jobs_an_earlier_run_left_at_the_persist_step_are_handed_over_too(store: JobStore) -> None:
    """A label action removed since, a failed persist of another run of the date: this run's
    classify completed nothing of them, yet persist must run to finish them."""
    classified(store, 2, to_persist=2)  # an earlier run's, say
    store.register(new_jobs(3, prefix="later"), batch_key=BATCH, step="classify", max_attempts=3)
    handed, _ = hand_over(store)
    assert handed == {"worker": 1, "persist": 2}


@pytest.mark.own_database  # the chunks commit from lanes of their own
def test_a_classify_try_counts_what_it_hands_over_before_it_disposes_its_engine(
    store: JobStore, tmp_path: Path
) -> None:
    """The hand-over's count reuses the try's pooled connection: nothing is checked out of the
    engine once ``execute`` disposed it (a disposed pool opens a new connection)."""
    checked_out_after_dispose: list[bool] = []

    class Seamed(ClassifyDocumentsOperator):
        disposed = False

        def get_engine(self) -> sa.Engine:
            return store.engine

        def dispose(self) -> None:  # the test's engine outlives the task: only noted
            self.disposed = True

    classify: Any = Seamed(task_id="classify", payload_base=str(tmp_path / "payloads"))
    register_day(store, PayloadStore(tmp_path / "payloads"), 10)
    sa.event.listen(store.engine, "checkout", lambda *_: checked_out_after_dispose.append(classify.disposed))

    context = operator_context(classify)
    handed = classify.execute(context)

    assert handed is None  # keyword completes every job in classify: nothing waits at persist
    assert context["ti"].pushed[SUMMARY_KEY]["claimed"] == 10
    assert classify.disposed
    assert checked_out_after_dispose, "the try used the engine"
    assert True not in checked_out_after_dispose
