"""Bad input through the real pipeline on the real database, written by Hypothesis: inboxes of
arbitrary lines (bytes, text, JSON objects with any mix of fields) through retrieve and
classify, and arbitrary model replies (any body, content, status) through the llm classify
step. Every line or reply ends as exactly one job that is settled (``completed``, or
``manual_review`` / ``terminal_failed`` with a reason) or waiting for its retry with an error
class: never a crash, a stuck lease or a lost document."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from tests.strategies import OUT_OF_RANGE_TIMESTAMPS, timestamps
from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.contracts.documents import DocumentPayload
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve, to_new_jobs
from triage.pipeline.steps import RunSettings, StepError, run_step
from triage.sources.base import SourceDocument
from triage.sources.jsonl import JsonlSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)
FIELDS = ["id", "subject", "body", "received_at", "channel", "schema_version", "other"]
VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=40)
    | st.sampled_from(["2026-11-01T08:00:00Z", "2026-11-01T08:00:00", "", "refund please", 1])
    | timestamps
)

lines = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.dictionaries(st.sampled_from(FIELDS), VALUES).map(lambda d: json.dumps(d).encode()),
    st.builds(
        lambda i, body: json.dumps(
            {"id": i, "subject": "s", "body": body, "received_at": "2026-11-01T08:00:00Z"}
        ).encode(),
        st.text(min_size=1, max_size=20),
        st.text(max_size=80),
    ),
    st.builds(
        lambda i, received_at: json.dumps({"id": i, "subject": "s", "body": "b", "received_at": received_at}).encode(),
        st.text(min_size=1, max_size=20),
        timestamps,
    ),
).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(inbox=st.lists(lines, min_size=1, max_size=15))
def test_every_line_of_any_inbox_ends_settled_with_a_reason(
    engine: sa.Engine, tmp_path: Path, inbox: list[bytes]
) -> None:
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=0.01, cap_seconds=0.02))
    root = tmp_path / uuid.uuid4().hex
    (root / "2026-11-01").mkdir(parents=True)
    (root / "2026-11-01" / "fuzz.jsonl").write_bytes(b"".join(line + b"\n" for line in inbox))
    batch = f"fuzz-{uuid.uuid4().hex}"
    payloads = PayloadStore(root / "payloads")
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    result = retrieve(
        store,
        JsonlSource(root),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=batch,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5, 1, False))
    try:
        run_step(store, handler, batch_key=batch, settings=RunSettings(owner="fuzz", retry_soon_seconds=5))
    finally:
        handler.close()

    non_blank = sum(1 for line in inbox if line.strip())
    with engine.connect() as conn:
        jobs = conn.execute(
            sa.text(
                "SELECT j.status::text AS status, j.status_reason, r.reason FROM triage.jobs j"
                " LEFT JOIN triage.manual_review r ON r.job_id = j.id AND r.resolved_at IS NULL"
                " WHERE j.batch_key = :b"
            ),
            {"b": batch},
        ).all()
    assert result.read == non_blank
    # Lines with the same id and content are one document (a duplicate delivery), so one job.
    assert result.registered + result.existing == non_blank
    assert len(jobs) == result.registered
    for job in jobs:
        assert job.status in ("completed", "manual_review", "terminal_failed"), job
        if job.status == "manual_review":
            assert job.reason, job
        if job.status != "completed":
            assert job.status_reason, job


def test_a_day_with_impossible_dates_still_becomes_jobs(engine: sa.Engine, tmp_path: Path) -> None:
    # One 0001-01-01T00:00:00+14:00 used to raise OverflowError out of the line parser: every
    # retrieve shard failed on every retry and no line of the day became a job.
    store = JobStore(engine)
    batch = f"dates-{uuid.uuid4().hex}"
    ids = [f"{batch}-ok-1", *(f"{batch}-{n}" for n in range(len(OUT_OF_RANGE_TIMESTAMPS))), f"{batch}-ok-2"]
    dates = ["2026-11-01T08:00:00Z", *OUT_OF_RANGE_TIMESTAMPS, "2026-11-01T09:00:00+14:00"]
    (tmp_path / "2026-11-01").mkdir()
    (tmp_path / "2026-11-01" / "day.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "subject": "s", "body": "b", "received_at": d}) + "\n"
            for i, d in zip(ids, dates, strict=True)
        )
    )
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    result = retrieve(
        store,
        JsonlSource(tmp_path),
        PayloadStore(tmp_path / "payloads"),
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=batch,
        classifier_version=classifier.version,
        max_attempts=3,
    )

    assert (result.read, result.registered, result.malformed) == (len(ids), len(ids), len(OUT_OF_RANGE_TIMESTAMPS))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT j.external_id, j.status::text AS status, r.reason, r.context->>'malformed_reason' AS why"
                " FROM triage.jobs j LEFT JOIN triage.manual_review r ON r.job_id = j.id WHERE j.batch_key = :b"
                " ORDER BY j.external_id"
            ),
            {"b": batch},
        ).all()
    queued = sorted(r.external_id for r in rows if r.status == "queued")
    assert queued == [f"{batch}-ok-1", f"{batch}-ok-2"]
    reviews = [r for r in rows if r.status == "manual_review"]
    assert [(r.external_id, r.reason, r.why) for r in reviews] == [
        (f"2026-11-01/day.jsonl:{n}", "malformed_input", "received_at_out_of_range")
        for n in range(2, 2 + len(OUT_OF_RANGE_TIMESTAMPS))
    ]


def test_odd_inbox_entries_become_review_rows_not_errors(engine: sa.Engine, tmp_path: Path) -> None:
    # A file name that is not UTF-8 gave its malformed lines ids with lone surrogates, which the
    # registration could not encode; a folder named *.jsonl raised IsADirectoryError. Either
    # failed the whole day on every retry.
    store = JobStore(engine)
    batch = f"entries-{uuid.uuid4().hex}"
    day = tmp_path / "2026-11-01"
    day.mkdir()
    (day / os.fsdecode(b"caf\xe9.jsonl")).write_bytes(
        b"{broken\n"
        + json.dumps({"id": f"{batch}-ok", "subject": "s", "body": "b", "received_at": "2026-11-01T08:00:00Z"}).encode()
        + b"\n"
    )
    (day / "nested.jsonl").mkdir()
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    result = retrieve(
        store,
        JsonlSource(tmp_path),
        PayloadStore(tmp_path / "payloads"),
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=batch,
        classifier_version=classifier.version,
        max_attempts=3,
    )

    assert (result.read, result.registered, result.malformed) == (3, 3, 2)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT j.external_id, j.status::text, r.context->>'malformed_reason' FROM triage.jobs j"
                " LEFT JOIN triage.manual_review r ON r.job_id = j.id WHERE j.batch_key = :b ORDER BY 1"
            ),
            {"b": batch},
        ).all()
    assert [tuple(r) for r in rows] == [
        ("2026-11-01/caf\\xe9.jsonl:1", "manual_review", "invalid_json"),
        ("2026-11-01/nested.jsonl", "manual_review", "not_a_file"),
        (f"{batch}-ok", "queued", None),
    ]


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_stored_payload_with_an_impossible_date_goes_to_review(engine: sa.Engine, tmp_path: Path) -> None:
    # The classify step reads payloads back with DocumentPayload.from_bytes, which raised
    # OverflowError for the same dates (a payload written by another writer, or an older release).
    store = JobStore(engine)
    batch = f"stored-dates-{uuid.uuid4().hex}"
    payloads = PayloadStore(tmp_path / "payloads")
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    good = DocumentPayload(external_id=f"{batch}-ok", subject="refund", body="b", received_at=DAY).to_bytes()
    bad = good.replace(b"2026-11-01T00:00:00Z", OUT_OF_RANGE_TIMESTAMPS[0].encode()).replace(b"-ok", b"-bad")
    docs = [SourceDocument("fuzz", f"{batch}-ok", good), SourceDocument("fuzz", f"{batch}-bad", bad)]
    store.register(to_new_jobs(docs, payloads, classifier.version), batch_key=batch, step="classify", max_attempts=3)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0, 1, False))
    try:
        run_step(store, handler, batch_key=batch, settings=RunSettings(owner="dates", retry_soon_seconds=5))
    finally:
        handler.close()

    with engine.connect() as conn:
        rows: dict[str, str] = dict(
            conn.execute(
                sa.text(
                    "SELECT j.external_id, coalesce(r.reason || '/' || j.last_error_class, j.status::text) FROM triage.jobs j"
                    " LEFT JOIN triage.manual_review r ON r.job_id = j.id WHERE j.batch_key = :b"
                ),
                {"b": batch},
            )
            .tuples()
            .all()
        )
    assert rows == {f"{batch}-ok": "completed", f"{batch}-bad": "malformed_input/schema_mismatch"}


# -- model replies -------------------------------------------------------------------------------

CONTENT = st.one_of(
    st.text(max_size=60),
    st.dictionaries(
        st.sampled_from(["label", "confidence", "reason", "labels"]),
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=True)
        | st.text(max_size=20)
        | st.sampled_from(["billing", "refund_request", "nonexistent_label"]),
    ).map(json.dumps),
)
REPLIES = st.one_of(
    CONTENT.map(lambda content: Reply(content=content)),
    st.binary(max_size=80).map(Reply.raw_body),
    st.sampled_from([200, 201, 204, 301, 400, 401, 404, 409, 422, 429, 500, 502, 503]).map(Reply.status_only),
    st.builds(Reply.ok, st.sampled_from(["billing", "refund_request", "spam"]), st.floats(-1, 2)),
)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(replies=st.lists(REPLIES, min_size=6, max_size=6))
def test_any_model_reply_ends_each_job_settled_or_retryable_with_a_reason(
    engine: sa.Engine, tmp_path: Path, replies: list[Reply]
) -> None:
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=600, cap_seconds=600))
    root = tmp_path / uuid.uuid4().hex
    batch = f"fuzz-llm-{uuid.uuid4().hex}"
    payloads = PayloadStore(root / "payloads")
    with FakeOpenAIServer(responder=fixed_label("billing")) as server:
        server.enqueue(*replies)
        classifier = OpenAICompatibleClassifier(
            base_url=server.base_url, api_key="sk-fuzz", model="fake", taxonomy=Taxonomy.load(), timeout_s=2.0
        )
        docs = [
            SourceDocument(
                "fuzz",
                f"{batch}-{i}",
                DocumentPayload(external_id=f"{batch}-{i}", subject="s", body=f"b {i}", received_at=DAY).to_bytes(),
            )
            for i in range(len(replies))
        ]
        store.register(
            to_new_jobs(docs, payloads, classifier.version), batch_key=batch, step="classify", max_attempts=3
        )
        handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5, 1, False))
        try:  # one call per job, in order; a dependency that looks down is a typed stop, not a crash
            run_step(
                store, handler, batch_key=batch, settings=RunSettings(owner="fuzz", batch_size=1, retry_soon_seconds=0)
            )
        except StepError:
            pass
        finally:
            handler.close()
    with engine.connect() as conn:
        jobs = conn.execute(
            sa.text(
                "SELECT j.status::text AS status, j.status_reason, j.last_error_class, r.reason FROM triage.jobs j"
                " LEFT JOIN triage.manual_review r ON r.job_id = j.id AND r.resolved_at IS NULL"
                " WHERE j.batch_key = :b"
            ),
            {"b": batch},
        ).all()
    assert len(jobs) == len(replies)  # nothing lost
    for job in jobs:  # nothing stuck: leases released, every unfinished job has a reason
        assert job.status in (
            "completed",
            "manual_review",
            "terminal_failed",
            "retryable_failed",
            "queued",
            "waiting",  # parked: the first calls all said the model is down (the breaker's all-down rule)
        ), job
        if job.status == "waiting":
            assert job.status_reason == "outage:model", job
            assert job.last_error_class, job
        if job.status == "manual_review":
            assert job.reason, job
        if job.status in ("terminal_failed", "retryable_failed"):
            assert job.last_error_class, job
