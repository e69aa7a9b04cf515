"""Bad input through the real pipeline on the real database, written by Hypothesis: inboxes of
arbitrary lines (bytes, text, JSON objects with any mix of fields) through retrieve and
classify, and arbitrary model replies (any body, content, status) through the llm classify
step. Every line or reply ends as exactly one job that is settled (``completed``, or
``manual_review`` / ``terminal_failed`` with a reason) or waiting for its retry with an error
class: never a crash, a stuck lease or a lost document."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.contracts.documents import DocumentPayload
from triage.jobs.backoff import RetryPolicy
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve, to_new_jobs
from triage.pipeline.steps import RunSettings, StepError, run_step
from triage.sources.base import SourceDocument
from triage.sources.jsonl import JsonlSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)
FIELDS = ["id", "subject", "body", "received_at", "channel", "schema_version", "other"]
VALUES = (st.none() | st.booleans() | st.integers() | st.text(max_size=40)
          | st.sampled_from(["2026-11-01T08:00:00Z", "2026-11-01T08:00:00", "", "refund please", 1]))  # fmt: skip

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
).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(inbox=st.lists(lines, min_size=1, max_size=15))
def test_every_line_of_any_inbox_ends_settled_with_a_reason(engine: sa.Engine, tmp_path: Path,
                                                            inbox: list[bytes]) -> None:  # fmt: skip
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=0.01, cap_seconds=0.02))
    root = tmp_path / uuid.uuid4().hex
    (root / "2026-11-01").mkdir(parents=True)
    (root / "2026-11-01" / "fuzz.jsonl").write_bytes(b"".join(line + b"\n" for line in inbox))
    batch = f"fuzz-{uuid.uuid4().hex}"
    payloads = PayloadStore(root / "payloads")
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    result = retrieve(store, JsonlSource(root), payloads, start=DAY, end=DAY + timedelta(days=1), batch_key=batch,
                      classifier_version=classifier.version, max_attempts=3)  # fmt: skip
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5, 1, False))
    try:
        run_step(store, handler, batch_key=batch, settings=RunSettings(owner="fuzz", retry_soon_seconds=5))
    finally:
        handler.close()

    non_blank = sum(1 for line in inbox if line.strip())
    with engine.connect() as conn:
        jobs = conn.execute(sa.text(
            "SELECT j.status::text AS status, j.status_reason, r.reason FROM triage.jobs j"
            " LEFT JOIN triage.manual_review r ON r.job_id = j.id AND r.resolved_at IS NULL"
            " WHERE j.batch_key = :b"), {"b": batch}).all()  # fmt: skip
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


# -- model replies -------------------------------------------------------------------------------

CONTENT = st.one_of(
    st.text(max_size=60),
    st.dictionaries(st.sampled_from(["label", "confidence", "reason", "labels"]),
                    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
                    | st.sampled_from(["billing", "refund_request", "nonexistent_label"])).map(json.dumps),
)  # fmt: skip
REPLIES = st.one_of(
    CONTENT.map(lambda content: Reply(content=content)),
    st.binary(max_size=80).map(Reply.raw_body),
    st.sampled_from([200, 201, 204, 301, 400, 401, 404, 409, 422, 429, 500, 502, 503]).map(Reply.status_only),
    st.builds(Reply.ok, st.sampled_from(["billing", "refund_request", "spam"]), st.floats(-1, 2)),
)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(replies=st.lists(REPLIES, min_size=6, max_size=6))
def test_any_model_reply_ends_each_job_settled_or_retryable_with_a_reason(engine: sa.Engine, tmp_path: Path,
                                                                          replies: list[Reply]) -> None:  # fmt: skip
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=600, cap_seconds=600))
    root = tmp_path / uuid.uuid4().hex
    batch = f"fuzz-llm-{uuid.uuid4().hex}"
    payloads = PayloadStore(root / "payloads")
    with FakeOpenAIServer(responder=fixed_label("billing")) as server:
        server.enqueue(*replies)
        classifier = OpenAICompatibleClassifier(base_url=server.base_url, api_key="sk-fuzz", model="fake",
                                                taxonomy=Taxonomy.load(), timeout_s=2.0)  # fmt: skip
        docs = [SourceDocument("fuzz", f"{batch}-{i}", DocumentPayload(external_id=f"{batch}-{i}", subject="s", body=f"b {i}",
                                                                 received_at=DAY).to_bytes())
                for i in range(len(replies))]  # fmt: skip
        store.register(to_new_jobs(docs, payloads, classifier.version), batch_key=batch,
                       step="classify", max_attempts=3)  # fmt: skip
        handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5, 1, False))
        try:  # one call per job, in order; a dependency that looks down is a typed stop, not a crash
            run_step(store, handler, batch_key=batch, settings=RunSettings(owner="fuzz", batch_size=1,
                                                                           retry_soon_seconds=0))  # fmt: skip
        except StepError:
            pass
        finally:
            handler.close()
    with engine.connect() as conn:
        jobs = conn.execute(sa.text(
            "SELECT j.status::text AS status, j.status_reason, j.last_error_class, r.reason FROM triage.jobs j"
            " LEFT JOIN triage.manual_review r ON r.job_id = j.id AND r.resolved_at IS NULL"
            " WHERE j.batch_key = :b"), {"b": batch}).all()  # fmt: skip
    assert len(jobs) == len(replies)  # nothing lost
    for job in jobs:  # nothing stuck: leases released, every unfinished job has a reason
        assert job.status in ("completed", "manual_review", "terminal_failed", "retryable_failed", "queued"), job
        if job.status == "manual_review":
            assert job.reason, job
        if job.status in ("terminal_failed", "retryable_failed"):
            assert job.last_error_class, job
