"""A quick heal (issue #25, finding 6): once the model answers again, work parked on its outage is
retried at once, not after its whole park delay. The next run that finds nothing else to do
takes one parked job out as a probe (half-open) and makes its call: answered, every job parked on
the outage is queued and the run completes them; failing again, only the probe job is parked
again (its attempt given back) and the run stops. At most one prober at a time. Real PostgreSQL,
the real classifier against the fake model server on loopback; the assertions read states and
``next_attempt_at`` from the ledger, never the wall clock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.ledger.helpers import counts
from tests.ledger.test_outage import RUN, Switch, classify, llm, register, reviews
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.steps import CircuitOpen

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
PARK = Reply.status_only(503, retry_after="900")  # down, and it says for a quarter of an hour


def one(store: JobStore, sql: str, **params: Any) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).one()


def parked_until(store: JobStore) -> dict[str, datetime]:
    return {
        str(r.id): r.next_attempt_at
        for r in store.engine.connect().execute(
            sa.text("SELECT id, next_attempt_at FROM triage.jobs WHERE status = 'waiting'")
        )
    }


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_next_run_after_an_outage_probes_and_completes_the_parked_work_at_once(
    store: JobStore, payloads: PayloadStore
) -> None:
    switch = Switch(PARK)
    with FakeOpenAIServer(responder=switch) as fake:
        register(store, payloads, 30, llm(fake).version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
        assert counts(store, "SELECT status, attempt, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2, 3") == {
            ("waiting", 0, "outage:model"): 30
        }
        parked = parked_until(store)
        earliest_due = min(parked.values())
        assert one(store, "SELECT min(next_attempt_at) - now() AS wait FROM triage.jobs").wait.total_seconds() > 800

        # Still down: the next try makes one call (the probe), parks its job again and stops; the
        # others keep their due time and nobody spent an attempt.
        calls = fake.request_count
        with pytest.raises(CircuitOpen, match="probe") as stopped:
            classify(store, llm(fake), payloads, try_number=2)
        assert stopped.value.dependency == "model"
        assert stopped.value.retry_after == 900  # the classify task's retry policy waits that long
        assert fake.request_count - calls == 1
        assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("waiting", 0): 30}
        again = parked_until(store)
        [probed] = [job for job in parked if again[job] != parked[job]]
        assert again[probed] > parked[probed]
        assert one(store, "SELECT count(*) AS n FROM triage.job_events WHERE reason = 'outage_probe'").n == 1

        # The model is back: the next try does not wait out the park delay. It probes, the probe
        # is answered, every parked job is queued at once and completed, well before any was due.
        switch.down = None
        report = classify(store, llm(fake), payloads, try_number=3)
    assert report.claimed == 30
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 1): 30}
    assert reviews(store) == 0
    done = one(
        store,
        "SELECT max(at) AS last, count(*) FILTER (WHERE reason = 'probe_answered') AS early"
        " FROM triage.job_events WHERE to_status IN ('completed', 'queued')",
    )
    assert done.last < earliest_due  # completed while every parked job was still due later
    assert done.early == 29  # the probe itself, then the other 29 queued at once


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_at_most_one_prober_at_a_time(store: JobStore, payloads: PayloadStore) -> None:
    with FakeOpenAIServer(responder=Switch(PARK)) as fake:
        version = llm(fake).version
        register(store, payloads, 5, version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)

    def probe(worker: str) -> Any:
        return store.probes.probe_parked(BATCH, "classify", actor=worker, classifier_version=version)

    # Jobs a provider batch is answering, or that wait for the shared budget, are never probed.
    for reason in ("outage:batch", "outage:rate_limit"):
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET status_reason = :r WHERE status = 'waiting'"), {"r": reason})
        assert probe("w1") is None
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET status_reason = 'outage:model' WHERE status = 'waiting'"))

    first = probe("w1")
    assert first is not None
    assert first[1] == "model"
    assert probe("w2") is None  # the probe job is queued: whoever claims it is the prober
    claim = store.claim(
        batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w1", classifier_version=version
    )
    assert [job.id for job in claim.jobs] == [first[0]]
    assert probe("w2") is None  # its call is in flight under a live lease
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("waiting",): 4, ("running",): 1}
    # Parked jobs of another dependency are not resumed by this one's answer.
    assert store.probes.resume_after_probe(BATCH, "classify", dependency="label_provider", actor="w1") == 0
    assert (
        store.probes.resume_after_probe(BATCH, "classify", dependency="model", actor="w1", classifier_version=version)
        == 4
    )


class FirstThen:
    """The model: ``first`` for the next call, then a healthy answer (the probe gets ``first``)."""

    def __init__(self, first: Reply) -> None:
        self.first: Reply | None = first

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply, self.first = self.first, None
        return reply if reply is not None else Reply.ok("billing", 0.95)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_probe_job_the_model_refuses_goes_to_review_and_the_rest_resume(
    store: JobStore, payloads: PayloadStore
) -> None:
    """The probe job is itself bad (the model answers it 400: a permanent error). That is an answer:
    the model is back. The probe job goes to review with its reason, charged its attempt, like any
    permanent failure; every other parked job is queued and completed in the same try."""
    with FakeOpenAIServer(responder=Switch(PARK)) as fake:
        register(store, payloads, 6, llm(fake).version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
    with FakeOpenAIServer(responder=FirstThen(Reply.status_only(400))) as fake:
        report = classify(store, llm(fake), payloads, try_number=2)
    assert report.claimed == 6
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {
        ("completed", 1): 5,
        ("manual_review", 1): 1,
    }
    probed = one(
        store,
        "SELECT r.reason, r.error_class, j.status_reason FROM triage.manual_review r"
        " JOIN triage.jobs j ON j.id = r.job_id"
        " WHERE r.job_id = (SELECT job_id FROM triage.job_events WHERE reason = 'outage_probe')",
    )
    assert tuple(probed) == ("permanent_error", "bad_request", "permanent_error")


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_failed_probes_give_back_only_the_attempt_they_took(store: JobStore, payloads: PayloadStore) -> None:
    """Probed try after try through a long outage, with one attempt each (``max_attempts=1``):
    each probe claims a parked job (attempt + 1) and gives that attempt back when the model fails
    again, so no count drifts below zero or past ``max_attempts`` and no job is sent to review
    for the dependency's failures; each try makes exactly one call. Once the model answers, every
    job completes on its first charged attempt."""
    switch = Switch(PARK)
    with FakeOpenAIServer(responder=switch) as fake:
        register(store, payloads, 6, llm(fake).version, max_attempts=1)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
        for try_number in range(2, 9):
            calls = fake.request_count
            with pytest.raises(CircuitOpen, match="probe"):
                classify(store, llm(fake), payloads, try_number=try_number)
            assert fake.request_count - calls == 1
            assert counts(
                store, "SELECT status, attempt, max_attempts, count(*) FROM triage.jobs GROUP BY 1, 2, 3"
            ) == {("waiting", 0, 1): 6}
        probes = one(
            store,
            "SELECT count(*) AS n, count(DISTINCT job_id) AS jobs, max(attempt) AS top FROM triage.job_events"
            " WHERE to_status = 'running'",
        )
        # The first try claimed all six, then one probe a try, the soonest due each time: they take turns.
        assert (probes.n, probes.jobs, probes.top) == (6 + 7, 6, 1)
        switch.down = None
        classify(store, llm(fake), payloads, try_number=9)
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 1): 6}
    assert reviews(store) == 0


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_only_outages_of_a_probed_dependency_are_probed_or_resumed(store: JobStore, payloads: PayloadStore) -> None:
    """Beside a provider batch's jobs (``outage:batch``) and jobs waiting for the shared budget
    (``outage:rate_limit``), the probe takes the model's parked job, and the model's answer queues
    only the model's parked jobs: the others keep waiting for their own signal."""
    with FakeOpenAIServer(responder=Switch(PARK)) as fake:
        version = llm(fake).version
        register(store, payloads, 6, version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
    with store.engine.begin() as conn:
        ids = [r.id for r in conn.execute(sa.text("SELECT id FROM triage.jobs ORDER BY next_attempt_at, id"))]
        # The soonest due are the batch's and the budget's: they would be probed first if allowed.
        for reason, chosen in (("outage:batch", ids[:2]), ("outage:rate_limit", ids[2:4])):
            conn.execute(
                sa.text("UPDATE triage.jobs SET status_reason = :r WHERE id = ANY(:ids)"), {"r": reason, "ids": chosen}
            )
    taken = store.probes.probe_parked(BATCH, "classify", actor="w1", classifier_version=version)
    assert taken is not None
    assert taken[0] in ids[4:]
    assert taken[1] == "model"
    assert (
        store.probes.resume_after_probe(BATCH, "classify", dependency="model", actor="w1", classifier_version=version)
        == 1
    )
    assert counts(store, "SELECT status, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2") == {
        ("queued", "outage_probe"): 1,
        ("queued", "probe_answered"): 1,
        ("waiting", "outage:batch"): 2,
        ("waiting", "outage:rate_limit"): 2,
    }


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_job_its_dead_prober_held_is_parked_with_the_rest_not_charged_each_try(
    store: JobStore, payloads: PayloadStore
) -> None:
    """The prober dies holding the probe job (a SIGKILL during its call). The next try takes its
    lease back (the death is charged, as any dead claim's) and claims the job as any due job; the
    model is still down, and the try's own probe then fails too. That try's failed call was the
    outage's: the job is parked with the rest, its attempt given back, instead of staying
    ``retryable_failed`` and spending an attempt on the outage every try until review."""
    with FakeOpenAIServer(responder=Switch(PARK)) as fake:
        version = llm(fake).version
        register(store, payloads, 6, version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
        prober = f"classify_documents/{RUN}/classify/0/try2"
        taken = store.probes.probe_parked(BATCH, "classify", actor=prober, classifier_version=version)
        assert taken is not None
        claim = store.claim(
            batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner=prober, classifier_version=version
        )
        assert [job.id for job in claim.jobs] == [taken[0]]  # then try 2 is killed mid-call
        for try_number in (3, 4, 5):
            with pytest.raises(CircuitOpen, match="probe"):
                classify(store, llm(fake), payloads, try_number=try_number)
            assert counts(
                store, "SELECT status, attempt, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2, 3"
            ) == {
                ("waiting", 0, "outage:model"): 5,
                ("waiting", 1, "outage:model"): 1,  # the dead prober's claim, charged once
            }
    assert reviews(store) == 0
