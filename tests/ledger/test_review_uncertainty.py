"""The review queue least sure first (issue #27, item 6), on the real database: the order, its
keyset pagination, and the candidates each classification stores."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.sql.reads.review_queue import QueueFilter
from triage.jobs.sql.reads.review_uncertainty import NO_ANSWER, uncertain_page, uncertainty_statement
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, SendToReview

BATCH = "2026-11-03T00:00:00+00:00/2026-11-04T00:00:00+00:00"


def answer(label: str | None, confidence: float | None, *candidates: tuple[str, float]) -> ClassificationRecord:
    """An answer that left the job in doubt (a missing label is ``inconclusive`` too: a keyword
    miss; an answer ``rejected`` as unusable has no uncertainty and comes last, as no answer)."""
    return ClassificationRecord(label, confidence, "inconclusive", "learned-test", candidates=candidates or None)


def send(store: JobStore, name: str, model: ClassificationRecord | None, reason: str = "inconclusive") -> uuid.UUID:
    """One job registered and sent to review with ``model`` as its answer, in a transaction of
    its own (so each review row is younger than the one sent before it)."""
    [job] = new_jobs(1, prefix=name)
    store.register([job], batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w")
    [held] = claim.jobs
    store.record(claim, [SendToReview(held.id, held.attempt, reason, classification=model)])
    return held.id


@pytest.fixture
def queue(store: JobStore) -> dict[str, uuid.UUID]:
    """Reviews whose uncertainty is known, sent in an order unlike the expected one."""
    return {
        "sure": send(store, "sure", answer("billing", 0.9, ("billing", 0.9), ("shipping", 0.05))),  # 0.85
        "none": send(store, "none", None, reason="retries_exhausted"),  # no answer: last
        "tie-old": send(store, "tie-old", answer("billing", 0.5, ("billing", 0.5), ("shipping", 0.25))),  # 0.25
        "close": send(store, "close", answer("billing", 0.5, ("billing", 0.5), ("shipping", 0.45))),  # 0.05
        "llm": send(store, "llm", answer("shipping", 0.3)),  # no candidates: its confidence 0.3
        "one": send(store, "one", answer("billing", 0.6, ("billing", 0.6)), reason="audit_sample"),  # 0.6
        "tie-new": send(store, "tie-new", answer("billing", 0.75, ("billing", 0.75), ("refund", 0.5))),  # 0.25
        "nothing": send(store, "nothing", answer(None, 0.0)),  # a keyword miss: confidence 0, first
        "garbled": send(
            store, "garbled", ClassificationRecord(None, 0.0, "rejected", "llm-test", rejected_reason="invalid_json")
        ),  # an answer rejected as unusable: no answer to be unsure of, last with the others
    }


EXPECTED = ["nothing", "close", "tie-old", "tie-new", "llm", "one", "sure", "none", "garbled"]


def names(queue: dict[str, uuid.UUID], rows: list[dict[str, Any]]) -> list[str]:
    by_id = {v: k for k, v in queue.items()}
    return [by_id[r["job_id"]] for r in rows]


def test_least_sure_first_then_oldest(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    with store.engine.connect() as conn:
        page = uncertain_page(conn, QueueFilter(), limit=50)
    assert names(queue, page.rows) == EXPECTED
    assert page.next_after is None
    got = {n: r["uncertainty"] for n, r in zip(names(queue, page.rows), page.rows, strict=True)}
    assert got["close"] == pytest.approx(0.05)
    assert got["llm"] == pytest.approx(0.3)
    assert got["none"] == NO_ANSWER
    assert page.rows[1]["candidates"] == [{"label": "billing", "score": 0.5}, {"label": "shipping", "score": 0.45}]


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_pages_join_into_the_whole_order(store: JobStore, queue: dict[str, uuid.UUID], size: int) -> None:
    seen: list[dict[str, Any]] = []
    after = None
    with store.engine.connect() as conn:
        for _ in range(20):
            page = uncertain_page(conn, QueueFilter(), limit=size, after=after)
            assert len(page.rows) <= size
            seen += page.rows
            after = page.next_after
            if after is None:
                break
    assert names(queue, seen) == EXPECTED


def test_a_decision_between_pages_skips_nothing_and_repeats_nothing(
    store: JobStore, queue: dict[str, uuid.UUID]
) -> None:
    """The cursor names a place in the order, not an offset: a row decided meanwhile leaves the
    queue without shifting the rest."""
    with store.engine.connect() as conn:
        first = uncertain_page(conn, QueueFilter(), limit=3)
    assert names(queue, first.rows) == EXPECTED[:3]
    store.review.reject(queue["close"], actor="reviewer", note="seen")  # on the page already shown
    store.review.reject(queue["llm"], actor="reviewer", note="not yet shown")
    with store.engine.connect() as conn:
        rest = uncertain_page(conn, QueueFilter(), limit=50, after=first.next_after)
    assert names(queue, rest.rows) == [n for n in EXPECTED[3:] if n != "llm"]


def test_filters_apply_as_in_the_default_order(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    with store.engine.connect() as conn:
        audit = uncertain_page(conn, QueueFilter(reason="audit_sample"), limit=50)
        exhausted = uncertain_page(conn, QueueFilter(reason="retries_exhausted", batch=BATCH), limit=50)
        elsewhere = uncertain_page(conn, QueueFilter(source="elsewhere"), limit=50)
        young = uncertain_page(conn, QueueFilter(older_than_seconds=3600), limit=50)
    assert names(queue, audit.rows) == ["one"]
    assert names(queue, exhausted.rows) == ["none"]
    assert elsewhere.rows == young.rows == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param('"high"', NO_ANSWER, id="text"),
        pytest.param("null", NO_ANSWER, id="null"),
        pytest.param("1e400", NO_ANSWER, id="beyond-a-double"),
        pytest.param("-5", -1.0, id="below-any-margin"),
    ],
)
def test_a_rewritten_uncertainty_never_fails_the_write_or_the_page(
    store: JobStore, queue: dict[str, uuid.UUID], value: str, expected: float
) -> None:
    """The key is read as a bounded number or not at all: a context a writer got wrong can neither
    fail the insert that indexes it nor the page (a failed cast would fail it for every reviewer)."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE triage.manual_review SET context = context || jsonb_build_object('uncertainty', CAST(:v AS jsonb))"
                " WHERE job_id = :id"
            ),
            {"v": value, "id": queue["sure"]},
        )
    with store.engine.connect() as conn:
        rows = uncertain_page(conn, QueueFilter(), limit=50).rows
    assert next(r["uncertainty"] for r in rows if r["job_id"] == queue["sure"]) == expected


def test_the_review_row_carries_the_answer_s_uncertainty(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    with store.engine.connect() as conn:
        context: dict[uuid.UUID, float] = dict(
            conn.execute(
                sa.text("SELECT job_id, context -> 'uncertainty' FROM triage.manual_review WHERE resolved_at IS NULL")
            )
            .tuples()
            .all()
        )
    assert context[queue["close"]] == pytest.approx(0.05)
    assert context[queue["llm"]] == pytest.approx(0.3)
    assert context[queue["none"]] is None  # no answer: no key, last in the order


@pytest.mark.own_database  # a plan read with EXPLAIN: the template's statistics, not the session's
def test_the_page_is_read_along_the_uncertainty_index(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    """The order is an index's, not a sort of every open review (planner told to avoid sorts and
    sequential scans where it can: the table is tiny here)."""
    with store.engine.connect() as conn:
        conn.execute(sa.text("SET enable_seqscan = off"))
        conn.execute(sa.text("SET enable_sort = off"))
        for where, index in [
            (QueueFilter(), "manual_review_open_uncertainty_idx"),
            (QueueFilter(reason="inconclusive"), "manual_review_open_reason_uncertainty_idx"),
        ]:
            params = {**{k: getattr(where, k) for k in where.given()}, "limit": 51}
            compiled = uncertainty_statement(where.given(), False).compile(dialect=conn.dialect)
            plan = "\n".join(
                r[0] for r in conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.construct_params(params))
            )
            assert index in plan, plan


def test_the_database_keeps_at_most_three_candidates(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    four = '[{"label": "a", "score": 0.4}, {"label": "b", "score": 0.3}, {"label": "c", "score": 0.2}, {"label": "d", "score": 0.1}]'
    update = sa.text("UPDATE triage.classifications SET candidates = CAST(:c AS jsonb) WHERE job_id = :id")
    with (
        pytest.raises(sa.exc.IntegrityError, match="classifications_candidates_shape_check"),
        store.engine.begin() as conn,
    ):
        conn.execute(update, {"c": four, "id": queue["sure"]})


def test_0028_gives_the_reviews_open_then_their_answer_s_confidence(fresh_database: Any) -> None:
    """Reviews opened before 0028 have no key in their context: the upgrade writes their job's
    latest confidence (no candidates existed), so they take their place in the order."""
    from triage import migrations
    from triage.database import create_engine

    migrations.upgrade(fresh_database, "0025")
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    insert_job = sa.text(
        "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
        " classifier_version, correlation_id, batch_key, step, status, attempt, max_attempts)"
        " VALUES (:k, 's', :k, 'h', 'ref', 'v', 'c', 'b', 'classify', 'manual_review', 2, 3) RETURNING id"
    )
    ids = {}
    with engine.begin() as conn:
        for name, confidences in [("sure", (0.2, 0.65)), ("unsure", (0.9, 0.31)), ("none", ())]:
            job_id = conn.execute(insert_job, {"k": name}).scalar_one()
            for attempt, confidence in enumerate(confidences, start=1):
                conn.execute(
                    sa.text(
                        "INSERT INTO triage.classifications (job_id, attempt, label, confidence, outcome,"
                        " classifier_version) VALUES (:j, :a, 'billing', :c, 'inconclusive', 'v')"
                    ),
                    {"j": job_id, "a": attempt, "c": confidence},
                )
            conn.execute(
                sa.text("INSERT INTO triage.manual_review (job_id, reason, attempts) VALUES (:j, 'inconclusive', 2)"),
                {"j": job_id},
            )
            ids[job_id] = name
    migrations.upgrade(fresh_database)
    with engine.connect() as conn:
        rows = uncertain_page(conn, QueueFilter(), limit=10).rows
    engine.dispose()
    assert [(ids[r["job_id"]], r["uncertainty"]) for r in rows] == [
        ("unsure", 0.31),
        ("sure", 0.65),
        ("none", NO_ANSWER),
    ]


def test_an_audit_sample_of_a_completed_job_is_in_the_order(store: JobStore, queue: dict[str, uuid.UUID]) -> None:
    """An audit holds back no label: its job may be ``completed`` while its review is open (issue
    #27, item 5); such a review is listed in its place like any other."""
    [job] = new_jobs(1, prefix="audited")
    store.register([job], batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w")
    [held] = claim.jobs
    candidates = (("billing", 0.97), ("shipping", 0.02))
    model = ClassificationRecord("billing", 0.97, "accepted", "learned-test", candidates=candidates)
    store.record(claim, [Complete(held.id, held.attempt, LabelWrite("billing", 0.97, "learned-test"), model)])
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO triage.manual_review (job_id, reason, attempts, context)"
                " VALUES (:id, 'audit_sample', 1, '{\"uncertainty\": 0.95}')"
            ),
            {"id": held.id},
        )
    with store.engine.connect() as conn:
        rows = uncertain_page(conn, QueueFilter(), limit=50).rows
        audits = uncertain_page(conn, QueueFilter(reason="audit_sample"), limit=50).rows
    order = [r["job_id"] for r in rows]
    assert order.index(queue["sure"]) < order.index(held.id) < order.index(queue["none"])  # 0.85 < 0.95 < 2
    assert [r["job_id"] for r in audits] == [queue["one"], held.id]
    assert next(r for r in rows if r["job_id"] == held.id)["model_outcome"] == "accepted"
