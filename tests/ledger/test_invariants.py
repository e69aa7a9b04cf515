"""The drill's judge: every invariant holds after a clean run, and each one catches its break."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite, SendToReview
from triage_tools.drill.invariants import check_invariants

BATCH = "inv"


def settle(store: JobStore) -> None:
    store.register(new_jobs(6), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=6, lease_seconds=60, owner="w")
    a, b, *rest = claim.jobs
    store.record(
        claim,
        [
            SendToReview(a.id, a.attempt, "inconclusive"),
            SendToReview(b.id, b.attempt, "inconclusive"),
            *[Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v")) for j in rest],
        ],
    )
    store.relay_all(lambda events: None)


def broken(store: JobStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {r.name: r.violations for r in check_invariants(conn, [BATCH]) if not r.holds}


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_settled_batch_keeps_every_invariant(store: JobStore) -> None:
    settle(store)
    assert broken(store) == {}


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        pytest.param(["UPDATE triage.jobs SET lease_expires_at = lease_expires_at"], {}, id="harmless"),
        pytest.param(
            ["DELETE FROM triage.document_labels WHERE ctid IN (SELECT ctid FROM triage.document_labels LIMIT 1)"],
            {"labels_match_completed": 1},
            id="lost-label",
        ),
        pytest.param(
            [
                "UPDATE triage.manual_review SET resolved_at = now(), resolution = 'superseded'"
                " WHERE id = (SELECT min(id) FROM triage.manual_review)"
            ],
            {"one_open_review_per_review_job": 1},
            id="lost-review-row",
        ),
        pytest.param(
            [
                "UPDATE triage.outbox SET txid = pg_current_xact_id()::text::bigint WHERE event_id = (SELECT event_id FROM"
                " triage.outbox WHERE event_type = 'job.completed' LIMIT 1)"
            ],
            {"one_published_event_per_completion": 1},
            id="unpublished-completion",
        ),
        pytest.param(
            [
                "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
                " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
                " VALUES ('k', 's', 'e', 'h', 'r', 'v', 'c', 'inv', 'classify', 'queued', 3)"
            ],
            {"all_settled": 1},
            id="unsettled-job",
        ),
    ],
)
@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_each_break_is_caught(store: JobStore, damage: list[str], expected: dict[str, int]) -> None:
    settle(store)
    with store.engine.begin() as conn:
        for sql in damage:
            conn.execute(sa.text(sql))
    assert broken(store) == {k: v for k, v in expected.items() if v}


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_running_job_is_an_outstanding_lease(store: JobStore) -> None:
    settle(store)
    store.register(new_jobs(1, prefix="late"), batch_key=BATCH, step="classify", max_attempts=3)
    store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w")
    assert broken(store) == {"all_settled": 1, "no_lease_outstanding": 1}


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_external_effects_count_once(store: JobStore) -> None:
    settle(store)
    with store.engine.connect() as conn:
        results = {r.name: r.violations for r in check_invariants(conn, [BATCH], effects_per_key={"a": 1, "b": 2})}
    assert results["external_effect_once"] == 1
