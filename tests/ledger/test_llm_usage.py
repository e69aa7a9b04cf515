"""What a model reports about its own call (tokens, cost) is bounded before it is recorded: one
figure out of range for one document among many is stored as NULL and named in
``usage_discarded``; its outcome stands and the rest of the batch is recorded untouched (no
retry pays the model again). Through the classify step, the real classifier and a real HTTP
fake on loopback, on a real PostgreSQL."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.ledger.helpers import classify_try, documents, new_jobs, register_documents
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifySettings
from triage.pipeline.steps import RunSettings

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = Taxonomy.load()
DOCUMENTS, ODD_ONE = 30, 17
GOOD = Reply.ok("billing", 0.95, prompt_tokens=120, completion_tokens=12)


def register(store: JobStore, payloads: PayloadStore, version: str) -> list[uuid.UUID]:
    return list(register_documents(store, payloads, documents(DOCUMENTS), version, batch_key=BATCH).new_ids)


def user_text(body: dict[str, Any]) -> str:
    return next(str(m.get("content", "")) for m in body["messages"] if m.get("role") == "user")


@pytest.mark.parametrize(
    ("usage", "discarded"),
    [
        pytest.param({"prompt_tokens": 2**31, "completion_tokens": 12}, "prompt_tokens", id="prompt-tokens-2^31"),
        pytest.param({"prompt_tokens": 120, "completion_tokens": 10**30}, "completion_tokens", id="completion-10^30"),
        pytest.param({"prompt_tokens": -1, "completion_tokens": 12}, "prompt_tokens", id="negative"),
        pytest.param(
            {"prompt_tokens": float("nan"), "completion_tokens": float("inf")},
            "prompt_tokens,completion_tokens",
            id="nan-and-infinity",
        ),
        pytest.param(
            {"prompt_tokens": 12.5, "completion_tokens": "12"},
            "prompt_tokens,completion_tokens",
            id="not-whole-numbers",
        ),
        # 2e9 tokens fit the column, but at 1 USD per 1k tokens they cost 2e6 USD: numeric(12, 6) cannot hold it
        pytest.param({"prompt_tokens": 2_000_000_000, "completion_tokens": 12}, "cost_usd", id="cost-over-10^6"),
        pytest.param("a lot", "usage", id="usage-not-an-object"),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_one_out_of_range_usage_figure_never_fails_the_batch(
    store: JobStore, tmp_path: Path, usage: Any, discarded: str
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    odd = Reply.ok("refund_request", 0.93, usage=usage)
    with FakeOpenAIServer(
        responder=lambda body: odd if user_text(body).endswith(f"ticket {ODD_ONE}") else GOOD
    ) as server:
        classifier = OpenAICompatibleClassifier(
            base_url=server.base_url,
            api_key=None,
            model="m",
            taxonomy=TAXONOMY,
            price_per_1k_prompt=1.0,
            price_per_1k_completion=1.0,
        )
        ids = register(store, payloads, classifier.version)
        settings = RunSettings(owner="w", batch_size=100)
        report = classify_try(
            store, classifier, payloads, settings, batch_key=BATCH, classify=ClassifySettings(concurrency=4)
        )
        assert server.request_count == DOCUMENTS  # one call each: nothing was paid for twice
    assert report.claimed == DOCUMENTS
    with store.engine.connect() as conn:
        states = conn.execute(sa.text("SELECT status::text, count(*) FROM triage.jobs GROUP BY 1")).all()
        rows = {r.job_id: r for r in conn.execute(sa.text("SELECT * FROM triage.classifications"))}
    assert [tuple(s) for s in states] == [("completed", DOCUMENTS)]
    odd_row = rows.pop(ids[ODD_ONE])
    assert (odd_row.label, odd_row.outcome, odd_row.usage_discarded) == ("refund_request", "accepted", discarded)
    for name in discarded.split(","):
        if name != "usage":
            assert getattr(odd_row, name) is None
    assert {(r.label, r.prompt_tokens, r.completion_tokens, r.cost_usd, r.usage_discarded) for r in rows.values()} == {
        ("billing", 120, 12, Decimal("0.132000"), None)
    }


@pytest.mark.parametrize(
    ("record", "kept", "discarded"),
    [
        pytest.param(
            dict(prompt_tokens=2**40, completion_tokens=3, cost_usd=0.5, latency_ms=12.0),
            (None, 3, Decimal("0.500000"), 12.0),
            "prompt_tokens",
            id="tokens",
        ),
        pytest.param(
            dict(prompt_tokens=1, completion_tokens=3, cost_usd=1e6, latency_ms=float("inf")),
            (1, 3, None, None),
            "latency_ms,cost_usd",
            id="cost-and-latency",
        ),
        pytest.param(
            dict(cost_usd=-0.01, usage_discarded="usage"),
            (None, None, None, None),
            "usage,cost_usd",
            id="adds-to-the-classifier's-own",
        ),
    ],
)
def test_the_store_bounds_usage_whoever_made_the_record(
    store: JobStore, record: dict[str, Any], kept: tuple[Any, ...], discarded: str
) -> None:
    """Any classifier's record, not only the model's: the ledger is the last line."""
    store.register(new_jobs(2), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=2, lease_seconds=60, owner="w")
    odd, fine = claim.jobs
    odd_record = ClassificationRecord("billing", 0.9, "accepted", "v", **record)
    store.record(
        claim,
        [
            Complete(odd.id, odd.attempt, LabelWrite("billing", 0.9, "v"), classification=odd_record),
            Complete(
                fine.id,
                fine.attempt,
                LabelWrite("billing", 0.9, "v"),
                classification=ClassificationRecord("billing", 0.9, "accepted", "v", prompt_tokens=7),
            ),
        ],
    )
    with store.engine.connect() as conn:
        got = {r.job_id: r for r in conn.execute(sa.text("SELECT * FROM triage.classifications"))}
    row = got[odd.id]
    assert (row.prompt_tokens, row.completion_tokens, row.cost_usd, row.latency_ms) == kept
    assert row.usage_discarded == discarded
    assert (got[fine.id].prompt_tokens, got[fine.id].usage_discarded) == (7, None)


@pytest.mark.parametrize("price", [pytest.param("0.5", id="a-string"), pytest.param(-1.0, id="negative")])
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_price_that_is_not_a_number_spoils_only_the_cost(store: JobStore, tmp_path: Path, price: Any) -> None:
    """The prices come from the connection's extra, as written there."""
    payloads = PayloadStore(tmp_path / "payloads")
    with FakeOpenAIServer(responder=lambda _body: GOOD) as server:
        classifier = OpenAICompatibleClassifier(
            base_url=server.base_url, api_key=None, model="m", taxonomy=TAXONOMY, price_per_1k_prompt=price
        )
        register(store, payloads, classifier.version)
        classify_try(store, classifier, payloads, RunSettings(owner="w", batch_size=100), batch_key=BATCH)
    with store.engine.connect() as conn:
        got = conn.execute(
            sa.text(
                "SELECT outcome, prompt_tokens, cost_usd, usage_discarded, count(*)"
                " FROM triage.classifications GROUP BY 1, 2, 3, 4"
            )
        ).all()
    assert [tuple(r) for r in got] == [("accepted", 120, None, "cost_usd", DOCUMENTS)]
