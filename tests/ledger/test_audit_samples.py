"""Audit samples and reviewers' corrections of completed jobs (issue #27, item 5; migration 0026).

Through the deployment's own logins (the pipeline's ``triage_worker``, the reviewers'
``triage_reviewer``) on a real PostgreSQL, with a label provider on loopback.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from tests.ledger.helpers import new_jobs
from tests.ledger.test_roles import logins, stores  # noqa: F401 - fixtures
from triage.adapters.http_actions import WebhookLabelAction
from triage.database import DatabaseUrl
from triage.jobs.sql.audit_samples import AUDIT_REASON, is_audit_sample
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import AuditSampleDecisionRefused, MoveNotPermitted, NotInReview, RoleRefused
from triage.jobs.vocabulary.models import Advance, ClassificationRecord
from triage.jobs.vocabulary.states import JobStatus
from triage.pipeline.persist import PersistHandler
from triage.ports.label_actions import label_order
from triage.reconciliation import rules
from triage.reconciliation.params import ReconcileParams
from triage.review.config import ReviewRunConfig
from triage.review.decisions import apply_review
from triage.roles import REVIEWER_ROLE

BATCH = "audit"
VERSION = "keyword-v1"
TAXONOMY = frozenset({"billing", "shipping", "refund_request"})
MODEL_LABEL = "shipping"


def q(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def completed(
    worker: JobStore, n: int, *, rate: float, action: WebhookLabelAction | None = None, prefix: str = "a"
) -> list[uuid.UUID]:
    """``n`` jobs classified (accepted, ``shipping`` at 0.93) and completed by the persist step
    at audit rate ``rate``, through ``action`` when given; their ids."""
    worker.register(new_jobs(n, prefix=prefix), batch_key=BATCH, step="classify", max_attempts=3)
    claim = worker.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="classify")
    worker.record(
        claim,
        [
            Advance(j.id, j.attempt, "persist", ClassificationRecord(MODEL_LABEL, 0.93, "accepted", VERSION))
            for j in claim.jobs
        ],
    )
    claim = worker.claim(batch_key=BATCH, step="persist", limit=n, lease_seconds=60, owner="persist")
    worker.record(claim, PersistHandler(worker, action, audit_rate=rate).handle(claim.jobs))
    return [j.id for j in claim.jobs]


def audited(worker: JobStore, action: WebhookLabelAction | None = None, prefix: str = "a") -> uuid.UUID:
    """One job completed as an audit sample."""
    (job_id,) = completed(worker, 1, rate=1.0, action=action, prefix=prefix)
    return job_id


def footprint(store: JobStore, job_id: uuid.UUID) -> tuple[Any, ...]:
    """Everything a decision could write about ``job_id``: events, outbox, reviews, examples, label."""
    return tuple(
        q(store, sql, j=job_id)[0][0]
        for sql in (
            "SELECT count(*) FROM triage.job_events WHERE job_id = :j",
            "SELECT count(*) FROM triage.outbox WHERE job_id = :j",
            "SELECT string_agg(coalesce(resolution, '-') || coalesce(resolved_by, ''), ',') FROM triage.manual_review"
            " WHERE job_id = :j",
            "SELECT count(*) FROM triage.labelled_examples WHERE job_id = :j",
            "SELECT label || classifier_version FROM triage.document_labels WHERE job_id = :j",
        )
    )


@pytest.fixture
def provider() -> Any:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def action(provider: FakeProvider) -> Any:
    a = WebhookLabelAction(provider.url, timeout_s=5)
    yield a
    a.close()


# -- sampling -----------------------------------------------------------------------------------


def test_a_share_of_completions_is_audited_without_holding_back_their_label(
    stores: dict[str, JobStore],  # noqa: F811
) -> None:
    worker = stores["worker"]
    ids = completed(worker, 40, rate=0.3)
    expected = {i for i in ids if is_audit_sample(i, 0.3)}
    assert 0 < len(expected) < 40  # the rate picks some, by the job id alone
    open_rows = q(
        worker,
        "SELECT job_id, context ->> 'label', (context ->> 'confidence')::float, context ->> 'classifier_version',"
        " attempts FROM triage.manual_review WHERE resolved_at IS NULL AND reason = :r",
        r=AUDIT_REASON,
    )
    assert {r[0] for r in open_rows} == expected
    assert {r[1:4] for r in open_rows} == {(MODEL_LABEL, 0.93, VERSION)}
    # Each takes its place in the queue least sure first like any review: the answer's
    # uncertainty (its confidence, with no second candidate) is the key, not "no answer".
    keys = q(
        worker,
        "SELECT DISTINCT (context ->> 'uncertainty')::float FROM triage.manual_review WHERE reason = :r",
        r=AUDIT_REASON,
    )
    assert keys == [(0.93,)]
    # Every job completed, labelled and published as usual, audited or not.
    assert q(worker, "SELECT status::text, count(*) FROM triage.jobs GROUP BY 1") == [("completed", 40)]
    assert q(worker, "SELECT count(*) FROM triage.document_labels WHERE label = :l", l=MODEL_LABEL) == [(40,)]
    assert q(worker, "SELECT count(DISTINCT job_id) FROM triage.outbox WHERE event_type = 'job.completed'") == [(40,)]
    # The review queue shows them with the model's label.
    cases = {c.job_id: c for c in worker.review.open_reviews()}
    assert set(cases) == expected
    assert {(c.reason, c.model_label) for c in cases.values()} == {(AUDIT_REASON, MODEL_LABEL)}


def test_audit_rate_zero_audits_nothing(stores: dict[str, JobStore]) -> None:  # noqa: F811
    completed(stores["worker"], 10, rate=0.0)
    assert q(stores["worker"], "SELECT count(*) FROM triage.manual_review") == [(0,)]


def test_reconciliation_neither_flags_nor_repairs_an_audit_sample(stores: dict[str, JobStore]) -> None:  # noqa: F811
    worker = stores["worker"]
    job_id = audited(worker)
    result = rules.consistency(worker, ReconcileParams(grace_seconds=0))
    assert (result.findings, result.repairs, result.conflicts) == ((), (), ())
    assert q(worker, "SELECT resolution FROM triage.manual_review WHERE job_id = :j", j=job_id) == [(None,)]


# -- confirm ------------------------------------------------------------------------------------


def test_a_reviewer_confirms_the_models_label(stores: dict[str, JobStore], action: WebhookLabelAction) -> None:  # noqa: F811
    worker, reviewer = stores["worker"], stores["reviewer"]
    job_id = audited(worker, action)
    before = footprint(reviewer, job_id)
    config = ReviewRunConfig.from_params({"job_ids": [str(job_id)], "decision": "label", "label": MODEL_LABEL})
    report = apply_review(
        reviewer, [str(job_id)], config, reviewer="alice", taxonomy_names=TAXONOMY, send_label=action.send
    )
    (job,) = report.jobs
    assert (job.outcome, job.status, job.action) == (
        "applied",
        "completed",
        "skipped: the reviewer confirmed the label already sent",
    )
    assert q(
        reviewer,
        "SELECT resolution, resolved_by, context ->> 'resolved_label' FROM triage.manual_review WHERE job_id = :j",
        j=job_id,
    ) == [("confirmed", "alice", MODEL_LABEL)]
    assert q(
        reviewer, "SELECT source, label, labelled_by FROM triage.labelled_examples WHERE job_id = :j", j=job_id
    ) == [("review", MODEL_LABEL, "alice")]
    after = footprint(reviewer, job_id)
    assert after[:2] == before[:2]  # no move, no event: the job and what was published stand
    assert after[4] == before[4] == f"{MODEL_LABEL}{VERSION}"
    # The same decision again by the same reviewer: nothing written.
    again = reviewer.review.resolve_with_label(job_id, MODEL_LABEL, actor="alice", taxonomy_names=TAXONOMY)
    assert again.already_applied
    assert footprint(reviewer, job_id) == after


# -- correct ------------------------------------------------------------------------------------


def test_a_correction_is_a_logged_move_and_the_provider_ends_with_the_newest_label(
    stores: dict[str, JobStore],  # noqa: F811
    logins: dict[str, DatabaseUrl],  # noqa: F811
    provider: FakeProvider,
    action: WebhookLabelAction,
) -> None:
    worker, reviewer = stores["worker"], stores["reviewer"]
    job_id = audited(worker, action)
    ((key, created_at, external_id),) = q(
        worker, "SELECT idempotency_key, created_at, external_id FROM triage.jobs WHERE id = :j", j=job_id
    )
    assert provider.labels == {("synthetic", external_id): (label_order(created_at, job_id), MODEL_LABEL)}

    config = ReviewRunConfig.from_params(
        {"job_ids": [str(job_id)], "decision": "label", "label": "billing", "note": "an invoice, not a parcel"}
    )
    report = apply_review(
        reviewer, [str(job_id)], config, reviewer="alice", taxonomy_names=TAXONOMY, send_label=action.send
    )
    assert [(j.outcome, j.status, j.action) for j in report.jobs] == [("applied", "completed", "sent")]

    # The provider saw the correction after the model's label, and keeps it.
    (review_id,) = q(reviewer, "SELECT id FROM triage.manual_review WHERE job_id = :j", j=job_id)[0]
    correction_key = f"{key}/review/{review_id}"
    assert set(provider.effects) == {key, correction_key}
    assert provider.effects[correction_key]["label"] == "billing"
    assert provider.labels[("synthetic", external_id)][1] == "billing"
    assert provider.labels[("synthetic", external_id)][0] > label_order(created_at, job_id)
    # The ledger: the newest label, the decision, the example, the move with who/what/why.
    assert q(reviewer, "SELECT label, classifier_version FROM triage.document_labels WHERE job_id = :j", j=job_id) == [
        ("billing", "human:alice")
    ]
    assert q(
        reviewer,
        "SELECT resolution, resolved_by, note, context ->> 'resolved_label', context ->> 'label'"
        " FROM triage.manual_review WHERE job_id = :j",
        j=job_id,
    ) == [("corrected", "alice", "an invoice, not a parcel", "billing", MODEL_LABEL)]
    assert q(
        reviewer, "SELECT source, label, labelled_by FROM triage.labelled_examples WHERE job_id = :j", j=job_id
    ) == [("review", "billing", "alice")]
    assert q(reviewer, "SELECT status::text, corrections, status_reason FROM triage.jobs WHERE id = :j", j=job_id) == [
        ("completed", 1, "corrected")
    ]
    last = q(
        reviewer,
        "SELECT from_status::text, to_status::text, actor, login, reason FROM triage.job_events WHERE job_id = :j"
        " ORDER BY id DESC LIMIT 1",
        j=job_id,
    )
    assert last == [
        (
            "completed",
            "completed",
            "alice",
            REVIEWER_ROLE,
            "corrected: label 'shipping' -> 'billing'; note: an invoice, not a parcel",
        )
    ]
    (payload,) = q(
        reviewer,
        "SELECT payload FROM triage.outbox WHERE job_id = :j AND event_type = 'job.completed' ORDER BY created_at DESC"
        " LIMIT 1",
        j=job_id,
    )[0]
    assert {k: payload[k] for k in ("resolution", "label", "previous_label", "resolved_by")} == {
        "resolution": "corrected",
        "label": "billing",
        "previous_label": MODEL_LABEL,
        "resolved_by": "alice",
    }

    # The same decision again by the same reviewer: 200, nothing written; another one: refused.
    before = footprint(reviewer, job_id)
    again = reviewer.review.resolve_with_label(job_id, "billing", actor="alice", note="again", taxonomy_names=TAXONOMY)
    assert again.already_applied
    assert footprint(reviewer, job_id) == before
    with pytest.raises(NotInReview, match=r"already resolved \(corrected as 'billing' by alice"):
        reviewer.review.resolve_with_label(job_id, "refund_request", actor="alice", taxonomy_names=TAXONOMY)
    # Reconciliation finds the corrected job consistent.
    result = rules.consistency(worker, ReconcileParams(grace_seconds=0))
    assert (result.findings, result.repairs) == ((), ())


def test_a_correction_loses_to_a_newer_jobs_label(stores: dict[str, JobStore]) -> None:  # noqa: F811
    """The document's label follows document_labels' order: a newer job's label stands."""
    worker, reviewer = stores["worker"], stores["reviewer"]
    job_id = audited(worker, prefix="n")
    worker.register(new_jobs(1, prefix="n", version="keyword-v2"), batch_key=BATCH, step="classify", max_attempts=3)
    claim = worker.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="c")
    worker.record(
        claim,
        [
            Advance(j.id, j.attempt, "persist", ClassificationRecord("refund_request", 0.9, "accepted", "keyword-v2"))
            for j in claim.jobs
        ],
    )
    claim = worker.claim(batch_key=BATCH, step="persist", limit=1, lease_seconds=60, owner="p")
    worker.record(claim, PersistHandler(worker).handle(claim.jobs))
    result = reviewer.review.resolve_with_label(job_id, "billing", actor="alice", taxonomy_names=TAXONOMY)
    assert (result.status, result.label_written) == (JobStatus.COMPLETED, False)
    assert q(reviewer, "SELECT label FROM triage.document_labels") == [("refund_request",)]


def test_the_pipelines_login_cannot_correct_a_completed_job(
    stores: dict[str, JobStore],  # noqa: F811
    logins: dict[str, DatabaseUrl],  # noqa: F811
) -> None:
    worker = stores["worker"]
    job_id = audited(worker)
    with pytest.raises(RoleRefused, match="triage_review"):
        worker.review.resolve_with_label(job_id, "billing", actor="alice", taxonomy_names=TAXONOMY)
    # The move alone, by raw SQL: the jobs trigger refuses it to any login but the review role's.
    with (
        pytest.raises(MoveNotPermitted, match=r"may not move job .* from completed to completed"),
        worker.transaction("alice") as conn,
    ):
        conn.execute(sa.text("UPDATE triage.jobs SET corrections = corrections + 1 WHERE id = :j"), {"j": job_id})
    # No state but completed may change the counter, whoever asks.
    worker.register(new_jobs(1, prefix="q"), batch_key=BATCH, step="classify", max_attempts=3)
    with (
        psycopg.connect(logins["reviewer"].libpq(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="queued"),
    ):
        conn.execute("UPDATE triage.jobs SET corrections = 1 WHERE status = 'queued'")
    assert q(worker, "SELECT corrections, status::text FROM triage.jobs WHERE id = :j", j=job_id) == [(0, "completed")]


@pytest.mark.parametrize("decision", ["reject", "requeue"])
def test_requeue_and_reject_are_refused_on_an_audit_sample(
    stores: dict[str, JobStore],  # noqa: F811
    decision: str,
) -> None:
    worker, reviewer = stores["worker"], stores["reviewer"]
    job_id = audited(worker)
    before = footprint(reviewer, job_id)
    decide = reviewer.review.reject if decision == "reject" else reviewer.review.resolve_with_requeue
    with pytest.raises(AuditSampleDecisionRefused, match=f"audit sample: confirm or correct .*; {decision} applies"):
        decide(job_id, actor="alice")
    assert footprint(reviewer, job_id) == before


# -- labelled examples hold taxonomy labels (migration 0026) -------------------------------------

EXAMPLE = (
    "INSERT INTO triage.labelled_examples (source, external_id, label, content_sha256, payload_ref, labelled_by)"
    " VALUES ('history', :e, :l, repeat('a', 64), 'file:///p', 'import')"
)


def test_an_example_label_must_be_a_taxonomy_label_and_a_retired_one_keeps_its_examples(store: JobStore) -> None:
    with pytest.raises(sa.exc.IntegrityError, match="labelled_examples_label_fkey"), store.engine.begin() as conn:
        conn.execute(sa.text(EXAMPLE), {"e": "x1", "l": "pizza"})
    with store.engine.begin() as conn:
        conn.execute(sa.text(EXAMPLE), {"e": "x2", "l": "billing"})
        # Retired (the taxonomy file dropped it): the example stays, as history; training skips it.
        conn.execute(sa.text("UPDATE triage.taxonomy_labels SET retired_at = now() WHERE name = 'billing'"))
    assert q(store, "SELECT label FROM triage.labelled_examples") == [("billing",)]
    with pytest.raises(sa.exc.IntegrityError, match="labelled_examples_label_fkey"), store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM triage.taxonomy_labels WHERE name = 'billing'"))


def test_0026_keeps_an_example_whose_label_left_the_taxonomy_as_a_retired_label(fresh_database: DatabaseUrl) -> None:
    from triage import migrations
    from triage.database import create_engine

    migrations.upgrade(fresh_database, "0025")
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(EXAMPLE), {"e": "x1", "l": "old_label"})
    migrations.upgrade(fresh_database)
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT retired_at IS NOT NULL FROM triage.taxonomy_labels WHERE name = 'old_label'")
        ).one()
        examples = conn.execute(sa.text("SELECT label FROM triage.labelled_examples")).scalars().all()
    engine.dispose()
    assert tuple(row) == (True,)
    assert examples == ["old_label"]


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_classify_step_samples_by_job_id_and_a_retry_samples_nothing_new(store: JobStore, tmp_path: Any) -> None:
    """The classify step completes accepted jobs itself (no label action): it samples them as the
    persist step would, by the job id; running the step again over the same batch adds nothing."""
    from tests.ledger.test_pipeline_classify import BATCH as CLASSIFY_BATCH
    from tests.ledger.test_pipeline_classify import ScriptedClassifier, classify, document, ok, register
    from triage.payloads import PayloadStore

    payloads = PayloadStore(tmp_path / "payloads")
    ids = register(store, payloads, {f"T-{i}": document(f"T-{i}") for i in range(60)})
    classify(store, ScriptedClassifier(lambda _r: ok("billing", 0.9)), payloads, audit_rate=0.25)
    expected = {i for i in ids.values() if is_audit_sample(i, 0.25)}
    assert 0 < len(expected) < 60
    audited_rows = q(store, "SELECT job_id FROM triage.manual_review WHERE reason = :r", r=AUDIT_REASON)
    assert {r[0] for r in audited_rows} == expected
    assert q(
        store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed' AND batch_key = :b", b=CLASSIFY_BATCH
    ) == [(60,)]
    classify(store, ScriptedClassifier(lambda _r: ok("billing", 0.9)), payloads, audit_rate=0.25)
    assert len(q(store, "SELECT job_id FROM triage.manual_review")) == len(expected)


def test_two_reviewers_correcting_at_once_never_both_win(stores: dict[str, JobStore]) -> None:  # noqa: F811
    """The open audit row is locked by the first decision; the second finds it decided."""
    import threading

    worker, reviewer = stores["worker"], stores["reviewer"]
    job_id = audited(worker)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def decide(actor: str, label: str) -> None:
        barrier.wait()
        try:
            outcomes[actor] = reviewer.review.resolve_with_label(job_id, label, actor=actor, taxonomy_names=TAXONOMY)
        except NotInReview as exc:
            outcomes[actor] = exc

    threads = [threading.Thread(target=decide, args=a) for a in (("alice", "billing"), ("bob", "refund_request"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [a for a, o in outcomes.items() if not isinstance(o, Exception)]
    assert len(won) == 1, outcomes
    assert q(reviewer, "SELECT corrections FROM triage.jobs WHERE id = :j", j=job_id) == [(1,)]
    assert q(
        reviewer,
        "SELECT count(*) FROM triage.job_events WHERE job_id = :j AND from_status = 'completed'",
        j=job_id,
    ) == [(1,)]
    assert q(reviewer, "SELECT resolved_by FROM triage.manual_review WHERE job_id = :j", j=job_id) == [(won[0],)]


def test_the_content_cache_never_reuses_an_answer_a_reviewer_corrected(
    stores: dict[str, JobStore],  # noqa: F811
    tmp_path: Any,
) -> None:
    """A corrected audit sample is a person's decision about its text, as a labelled review is:
    a later job with the same text is asked again, never handed the answer the reviewer corrected."""
    from tests.ledger.test_pipeline_classify import BATCH as CLASSIFY_BATCH
    from tests.ledger.test_pipeline_classify import ScriptedClassifier, document, ok, register, settings
    from triage.payloads import PayloadStore
    from triage.pipeline.classify import ClassifyHandler, ClassifySettings
    from triage.pipeline.reuse import ContentCache
    from triage.pipeline.steps import run_step

    worker, reviewer = stores["worker"], stores["reviewer"]
    payloads = PayloadStore(tmp_path / "payloads")
    model = ScriptedClassifier(lambda _r: ok("billing", 0.9))

    def classify_with_cache() -> None:
        cache = ContentCache(worker, model.version, 0.7)
        handler = ClassifyHandler(model, payloads, ClassifySettings(0.7, 1, audit_rate=1.0), cache=cache)
        try:
            run_step(worker, handler, batch_key=CLASSIFY_BATCH, settings=settings())
        finally:
            handler.close()

    ids = register(worker, payloads, {"A": document("A", body="money back please")})
    classify_with_cache()
    assert len(model.calls) == 1
    # The reviewer corrects the audited answer: billing -> refund_request.
    reviewer.review.resolve_with_label(
        ids["A"], "refund_request", actor="alice", taxonomy_names=frozenset({"billing", "refund_request"})
    )
    assert q(reviewer, "SELECT resolution FROM triage.manual_review WHERE job_id = :j", j=ids["A"]) == [("corrected",)]
    ids = register(worker, payloads, {"B": document("B", body="money back please")})
    classify_with_cache()
    assert len(model.calls) == 2, "the same text is asked again, not answered with the corrected answer"
    assert q(worker, "SELECT reused_job_id FROM triage.classifications WHERE job_id = :j", j=ids["B"]) == [(None,)]
