"""The batch mode's trigger against the fake server's batch interface on loopback: it keeps
polling while a batch runs and fires once none is running, done or lost; the API key comes from
the connection in the triggerer, never from the trigger's serialized kwargs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from triage.adapters.triggers import ModelBatchTrigger
from triage.classifiers.batch_api import BatchClient
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy


def first_event(trigger: ModelBatchTrigger) -> dict:
    async def run() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(run(), timeout=30))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    fake = FakeOpenAIServer().start()
    fake.batches.polls_until_done = 3
    conn = {"conn_type": "http", "host": fake.base_url, "password": "sk-secret"}
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_LLM", json.dumps(conn))
    yield fake
    fake.stop()


def submitted(server: FakeOpenAIServer, n: int) -> list[str]:
    classifier = OpenAICompatibleClassifier(base_url=server.base_url, api_key="k", model="m", taxonomy=Taxonomy.load())
    client = BatchClient(classifier, server.base_url, "k")
    ids = [client.submit([(f"j{i}:1", "text")], key=f"k{i}") for i in range(n)]
    client.close()
    classifier.close()
    return ids


def test_the_trigger_polls_until_no_batch_runs(server: FakeOpenAIServer) -> None:
    ids = submitted(server, 2)
    server.batches.lose(ids[1], "failed")  # a lost one counts as not running
    event = first_event(ModelBatchTrigger(ids, "triage_llm", 0.05, time.time() + 60))
    assert event == {"status": "done", "batch_ids": ids}
    assert server.batches.batches[ids[0]].status == "completed"  # it took three polls


def test_the_trigger_gives_up_at_its_deadline(server: FakeOpenAIServer) -> None:
    ids = submitted(server, 1)
    server.batches.polls_until_done = 10**6
    server.batches.batches[ids[0]].polls_left = 10**6
    event = first_event(ModelBatchTrigger(ids, "triage_llm", 0.05, time.time() + 0.3))
    assert event == {"status": "deadline", "running": ids}


def test_the_serialized_trigger_carries_no_key(server: FakeOpenAIServer) -> None:
    path, kwargs = ModelBatchTrigger(["b1"], "triage_llm", 60.0, 1.0).serialize()
    assert path == "triage.adapters.triggers.ModelBatchTrigger"
    assert "sk-secret" not in json.dumps(kwargs)
