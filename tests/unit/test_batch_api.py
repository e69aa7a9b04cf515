"""The provider's batch interface against the fake OpenAI-compatible server on loopback (real
HTTP, multipart upload included): submission named by a key and adopted when resubmitted, the
phases of a batch, results per request, and a batch the provider loses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from triage.classifiers.batch_api import BatchClient
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy

TAXONOMY = Taxonomy.load()
REQUESTS = [(f"job-{i}:1", f"text {i}") for i in range(4)]
IDS = [custom_id for custom_id, _ in REQUESTS]


def responder(body: dict) -> Reply:
    text = body["messages"][1]["content"]
    if text == "text 2":
        return Reply.status_only(500)  # one request fails inside the batch
    if text == "text 3":
        return Reply.ok("billing", 0.2)  # a doubtful answer
    return Reply.ok("billing", 0.9)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(responder=responder) as fake:
        yield fake


@pytest.fixture
def client(server: FakeOpenAIServer) -> Iterator[BatchClient]:
    classifier = OpenAICompatibleClassifier(base_url=server.base_url, api_key="k", model="m", taxonomy=TAXONOMY)
    batches = BatchClient(classifier, server.base_url, "k")
    yield batches
    batches.close()
    classifier.close()


def test_a_batch_runs_then_completes_with_a_result_per_request(client: BatchClient, server: FakeOpenAIServer) -> None:
    batch_id = client.submit(REQUESTS, key="run-1")
    assert client.state(batch_id).phase == "running"
    done = client.state(batch_id)
    assert (done.phase, done.status) == ("done", "completed")
    results = client.results(done, IDS)
    assert [r.custom_id for r in results] == IDS
    assert results[0].output is not None
    assert (results[0].output.label, results[0].output.output_mode) == ("billing", "json_schema")
    assert results[2].error is not None
    assert (results[2].error.error_class, results[2].error.transient) == ("server_error", True)
    assert results[3].output is not None
    assert results[3].output.confidence == 0.2
    assert server.request_count == 0  # nothing went through the interactive endpoint
    [line] = [b.lines[0] for b in server.batches.batches.values()]
    assert line["body"]["response_format"]["type"] == "json_schema"  # the interactive request's body


def test_resubmitting_the_same_key_adopts_the_batch(client: BatchClient, server: FakeOpenAIServer) -> None:
    first = client.submit(REQUESTS, key="run-1")
    again = client.submit(REQUESTS, key="run-1")
    other = client.submit(REQUESTS[:1], key="run-2")
    assert first == again != other
    assert server.batches.created == 2


def test_an_expired_batch_keeps_what_finished_and_loses_the_rest(client: BatchClient, server: FakeOpenAIServer) -> None:
    batch_id = client.submit(REQUESTS, key="run-1")
    server.batches.lose(batch_id, "expired", keep=2)
    state = client.state(batch_id)
    assert (state.phase, state.status) == ("done", "expired")
    results = client.results(state, IDS)
    assert results[0].output is not None
    assert results[1].output is not None
    assert (results[2].output, results[2].error) == (None, None)  # lost: queued again by the caller
    assert (results[3].output, results[3].error) == (None, None)


@pytest.mark.parametrize("how", ["failed", "cancelled", "gone"])
def test_a_lost_batch_is_lost_whole(client: BatchClient, server: FakeOpenAIServer, how: str) -> None:
    batch_id = client.submit(REQUESTS, key="run-1")
    server.batches.lose(batch_id, how)
    state = client.state(batch_id)
    assert state.phase == "lost"
    assert all((r.output, r.error) == (None, None) for r in client.results(state, IDS))
