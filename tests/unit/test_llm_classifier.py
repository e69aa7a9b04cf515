"""The OpenAI-compatible classifier against a real local HTTP server (tests/fakes)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label, keyword_responder
from triage.classifiers import (
    ClassifierError,
    ClassifyRequest,
    ModelOutput,
    OpenAICompatibleClassifier,
    PermanentClassifierError,
    Taxonomy,
    TransientClassifierError,
)
from triage.classifiers.llm import parse_chat_response, parse_model_content

TAXONOMY = Taxonomy.load()
NAMES = TAXONOMY.names
SECRET_TEXT = "Ticket text that must never appear in errors: card 4111-1111"


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(responder=fixed_label("billing", 0.83)) as fake:
        yield fake


def make_classifier(server: FakeOpenAIServer, **overrides: Any) -> OpenAICompatibleClassifier:
    arguments: dict[str, Any] = {
        "base_url": server.base_url,
        "api_key": "sk-test-secret",
        "model": "fake-model",
        "taxonomy": TAXONOMY,
        "temperature": 0.2,
        "timeout_s": 2.0,
    }
    arguments.update(overrides)
    return OpenAICompatibleClassifier(**arguments)


def request(text: str = SECRET_TEXT, attempt: int = 1) -> ClassifyRequest:
    return ClassifyRequest(
        job_id="job-1", external_id="T-1", idempotency_key="idem-1", correlation_id="corr-1", attempt=attempt, text=text
    )


def test_success_returns_label_confidence_and_usage(server: FakeOpenAIServer) -> None:
    classifier = make_classifier(server, price_per_1k_prompt=0.5, price_per_1k_completion=1.5)

    result = classifier.classify(request())
    classifier.close()

    assert (result.label, result.confidence, result.rejected_reason) == ("billing", 0.83, None)
    assert (result.prompt_tokens, result.completion_tokens) == (120, 12)
    assert result.cost_usd == pytest.approx(120 / 1000 * 0.5 + 12 / 1000 * 1.5)
    assert result.latency_ms > 0


def test_request_body_and_headers(server: FakeOpenAIServer) -> None:
    with_key = make_classifier(server)
    with_key.classify(request("Where is my parcel?"))
    without_key = make_classifier(server, api_key=None)
    without_key.classify(request())

    body = server.requests[0]
    assert server.request_count == 2
    assert server.paths[0] == "/v1/chat/completions"
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0.2
    assert body["response_format"]["type"] == "json_schema"  # the default mode
    system, user = body["messages"]
    assert system["role"] == "system"
    assert all(f"- {name}:" in system["content"] for name in NAMES)
    assert user == {"role": "user", "content": "Where is my parcel?"}
    headers = {k.lower(): v for k, v in server.headers[0].items()}
    assert headers["authorization"] == "Bearer sk-test-secret"
    assert headers["idempotency-key"] == "idem-1"
    assert headers["x-correlation-id"] == "corr-1"
    assert "authorization" not in {k.lower() for k in server.headers[1]}


def test_json_schema_mode_asks_for_the_taxonomy_as_a_strict_enum(server: FakeOpenAIServer) -> None:
    result = make_classifier(server).classify(request())

    response_format = server.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert schema["properties"]["label"]["enum"] == [label.name for label in TAXONOMY.labels]
    assert schema["required"] == ["label", "confidence"]
    assert schema["additionalProperties"] is False
    assert (result.label, result.output_mode) == ("billing", "json_schema")


def test_json_object_mode_asks_for_any_object_and_still_validates(server: FakeOpenAIServer) -> None:
    classifier = make_classifier(server, response_format="json_object")
    server.enqueue(Reply.ok("billing"), Reply.ok("astrology"))

    first, second = classifier.classify(request()), classifier.classify(request())

    assert [r["response_format"] for r in server.requests] == [{"type": "json_object"}] * 2
    assert (first.label, first.output_mode) == ("billing", "json_object")
    assert (second.label, second.rejected_reason, second.output_mode) == (
        None,
        "label_outside_taxonomy",
        "json_object",
    )


def test_the_validation_stays_after_a_schema_a_provider_ignored(server: FakeOpenAIServer) -> None:
    # A provider that accepts json_schema without enforcing it: the taxonomy is checked anyway.
    server.enqueue(Reply.ok("astrology"))

    result = make_classifier(server).classify(request())

    assert (result.label, result.rejected_reason, result.output_mode) == (
        None,
        "label_outside_taxonomy",
        "json_schema",
    )


def test_a_refused_schema_is_a_configuration_error_naming_the_setting() -> None:
    with FakeOpenAIServer(refuse_json_schema=True) as refusing:
        classifier = make_classifier(refusing)
        with pytest.raises(PermanentClassifierError) as caught:
            classifier.classify(request())
        # Every call is refused the same way: the mode never changes by itself.
        with pytest.raises(PermanentClassifierError):
            classifier.classify(request())
        assert refusing.request_count == 2

    assert caught.value.error_class == "structured_output_unsupported"
    assert "response_format to json_object (or auto)" in str(caught.value)
    assert SECRET_TEXT not in str(caught.value)


def test_auto_falls_back_to_json_object_once_and_stays_there() -> None:
    with FakeOpenAIServer(responder=fixed_label("billing", 0.8), refuse_json_schema=True) as refusing:
        classifier = make_classifier(refusing, response_format="auto")
        first, second = classifier.classify(request()), classifier.classify(request())
        modes = [r["response_format"]["type"] for r in refusing.requests]

    # One refused call, its retry in json_object, then json_object straight away.
    assert modes == ["json_schema", "json_object", "json_object"]
    assert (first.label, first.output_mode) == ("billing", "json_object")
    assert (second.label, second.output_mode) == ("billing", "json_object")


def test_auto_keeps_json_schema_where_the_provider_takes_it(server: FakeOpenAIServer) -> None:
    classifier = make_classifier(server, response_format="auto")

    assert [classifier.classify(request()).output_mode for _ in range(2)] == ["json_schema"] * 2


def test_a_400_about_something_else_is_not_a_schema_refusal(server: FakeOpenAIServer) -> None:
    too_long = {"error": {"type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    server.enqueue(Reply.raw_body(json.dumps(too_long).encode(), 400))

    with pytest.raises(PermanentClassifierError) as caught:
        make_classifier(server, response_format="auto").classify(request())

    assert caught.value.error_class == "bad_request"
    assert server.request_count == 1  # no second call in json_object


def test_a_model_refusal_is_rejected_output_without_its_words(server: FakeOpenAIServer) -> None:
    server.enqueue(Reply.refused(f"I will not classify {SECRET_TEXT}"))

    result = make_classifier(server).classify(request())

    assert (result.label, result.rejected_reason) == (None, "model_refused")
    assert SECRET_TEXT not in repr(result)


def test_an_unknown_response_format_is_refused_at_construction(server: FakeOpenAIServer) -> None:
    with pytest.raises(ValueError, match="response_format must be one of"):
        make_classifier(server, response_format="xml")


def test_the_output_mode_is_not_part_of_the_version(server: FakeOpenAIServer) -> None:
    versions = {make_classifier(server, response_format=mode).version for mode in ("json_schema", "json_object")}

    assert len(versions) == 1


def test_version_names_model_prompt_temperature_and_taxonomy(server: FakeOpenAIServer) -> None:
    classifier = make_classifier(server, prompt_version="p3")

    assert classifier.version == f"llm:fake-model:p3:t0.2+tax-{TAXONOMY.content_hash[:8]}"
    assert make_classifier(server, temperature=0.0).version != classifier.version


@pytest.mark.parametrize(
    ("reply", "error_type", "error_class"),
    [
        pytest.param(Reply.status_only(429), TransientClassifierError, "rate_limited", id="429"),
        pytest.param(Reply.status_only(500), TransientClassifierError, "server_error", id="500"),
        pytest.param(Reply.status_only(502), TransientClassifierError, "server_error", id="502"),
        pytest.param(Reply.status_only(503), TransientClassifierError, "server_error", id="503"),
        pytest.param(Reply.status_only(408), TransientClassifierError, "timeout", id="408"),
        pytest.param(Reply.slow(1500), TransientClassifierError, "timeout", id="slow-response"),
        pytest.param(Reply.status_only(400), PermanentClassifierError, "bad_request", id="400"),
        pytest.param(Reply.status_only(401), PermanentClassifierError, "unauthorized", id="401"),
        pytest.param(Reply.status_only(403), PermanentClassifierError, "forbidden", id="403"),
        pytest.param(Reply.status_only(404), PermanentClassifierError, "not_found", id="404"),
        pytest.param(Reply.status_only(422), PermanentClassifierError, "client_error", id="422"),
        pytest.param(Reply.status_only(302), PermanentClassifierError, "redirected", id="302"),
    ],
)
def test_failed_calls_raise_classified_errors(
    server: FakeOpenAIServer, reply: Reply, error_type: type[ClassifierError], error_class: str
) -> None:
    server.enqueue(reply)
    classifier = make_classifier(server, timeout_s=0.3)

    with pytest.raises(error_type) as caught:
        classifier.classify(request())

    assert caught.value.error_class == error_class
    assert caught.value.transient is (error_type is TransientClassifierError)
    message = str(caught.value)
    assert SECRET_TEXT not in message
    assert "sk-test-secret" not in message
    # the client stays usable after a failure
    assert classifier.classify(request()).label == "billing"


def test_error_detail_keeps_short_codes_only(server: FakeOpenAIServer) -> None:
    server.enqueue(
        Reply.raw_body(json.dumps({"error": {"type": "invalid_request_error", "code": SECRET_TEXT}}).encode(), 400)
    )

    with pytest.raises(PermanentClassifierError) as caught:
        make_classifier(server).classify(request())

    assert str(caught.value) == "HTTP 400 (invalid_request_error)"


def test_connection_refused_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens there
    classifier = OpenAICompatibleClassifier(f"http://127.0.0.1:{port}/v1", None, "m", TAXONOMY, timeout_s=1)

    with pytest.raises(TransientClassifierError) as caught:
        classifier.classify(request())

    assert caught.value.error_class == "connection_error"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        pytest.param(Reply.malformed_content(), "invalid_json", id="truncated-json"),
        pytest.param(Reply.malformed_content("I think it's billing."), "invalid_json", id="prose"),
        pytest.param(Reply.malformed_content('{"label": "billing"}'), "schema_mismatch", id="no-confidence"),
        pytest.param(Reply.malformed_content('{"label": "billing", "confidence": 7}'), "schema_mismatch", id="conf>1"),
        pytest.param(Reply.malformed_content('["billing", 0.9]'), "schema_mismatch", id="array"),
        pytest.param(Reply.malformed_content(""), "empty_content", id="empty"),
        pytest.param(Reply.ok("astrology", 0.99), "label_outside_taxonomy", id="outside-taxonomy"),
        pytest.param(Reply.raw_body(b"<html>proxy error</html>"), "invalid_response", id="html-body"),
        pytest.param(Reply.raw_body(b'{"choices": []}'), "invalid_response", id="no-choices"),
    ],
)
def test_unusable_model_output_is_rejected_not_raised(server: FakeOpenAIServer, reply: Reply, reason: str) -> None:
    server.enqueue(reply)

    result = make_classifier(server).classify(request())

    assert (result.label, result.rejected_reason) == (None, reason)


@pytest.mark.parametrize(
    ("content", "label", "confidence"),
    [
        pytest.param('{"label": "billing", "confidence": 0.8}', "billing", 0.8, id="plain"),
        pytest.param('```json\n{"label": "shipping", "confidence": 1}\n```', "shipping", 1.0, id="fenced"),
        pytest.param('{"label": " Billing ", "confidence": "0.5"}', "billing", 0.5, id="case-and-string-number"),
        pytest.param('{"label": "billing", "confidence": 0.4, "why": "x"}', "billing", 0.4, id="extra-key"),
    ],
)
def test_tolerated_content_variants(content: str, label: str, confidence: float) -> None:
    result = parse_model_content(content, NAMES, latency_ms=3.0)

    assert (result.label, result.confidence, result.rejected_reason, result.latency_ms) == (
        label,
        confidence,
        None,
        3.0,
    )


def test_cost_is_none_without_prices_or_usage() -> None:
    body = {"choices": [{"message": {"content": '{"label": "billing", "confidence": 0.9}'}}]}

    no_usage = parse_chat_response(json.dumps(body).encode(), NAMES, price_per_1k_prompt=1.0)
    no_prices = parse_chat_response(
        json.dumps({**body, "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode(), NAMES
    )

    assert no_usage.cost_usd is None
    assert no_usage.prompt_tokens is None
    assert no_prices.cost_usd is None
    assert no_prices.prompt_tokens == 5


def test_concurrent_calls_share_one_pool() -> None:
    with FakeOpenAIServer(responder=keyword_responder(TAXONOMY), latency_ms=200) as fake:
        classifier = make_classifier(fake, max_connections=32, timeout_s=5)
        texts = ["I was charged twice on my invoice"] * 32 + ["My parcel is lost in the mail"] * 32
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda text: classifier.classify(request(text)), texts))
        elapsed = time.perf_counter() - started
        classifier.close()
        classifier.close()  # idempotent

    assert [r.label for r in results] == ["billing"] * 32 + ["shipping"] * 32
    assert fake.request_count == 64
    assert elapsed < 1.5, f"64 calls of 200 ms with 32 connections took {elapsed:.2f}s"


@settings(max_examples=500)
@given(st.text(max_size=200) | st.none())
def test_content_parser_never_raises(content: str | None) -> None:
    result = parse_model_content(content, NAMES)

    assert isinstance(result, ModelOutput)
    assert (result.rejected_reason is None) == (result.label in NAMES)


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {"label": st.sampled_from(sorted(NAMES)) | st.text(max_size=12) | st.integers()},
        optional={"confidence": st.floats() | st.integers() | st.text(max_size=5), "x": st.none()},
    )
)
def test_content_parser_on_json_objects(verdict: dict[str, object]) -> None:
    result = parse_model_content(json.dumps(verdict), NAMES)

    if result.rejected_reason is None:
        assert result.label == verdict["label"]
        assert 0.0 <= result.confidence <= 1.0
    else:
        assert result.rejected_reason in {"schema_mismatch", "label_outside_taxonomy", "invalid_json"}


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_response_parser_never_raises(body: bytes) -> None:
    assert isinstance(parse_chat_response(body, NAMES, price_per_1k_prompt=1.0), ModelOutput)


def test_fake_server_stops_cleanly_with_open_keep_alive_connections() -> None:
    import threading

    before = threading.active_count()
    with FakeOpenAIServer() as fake:
        classifier = make_classifier(fake)
        classifier.classify(request())  # leaves a keep-alive connection open
        url = fake.base_url
    time.sleep(0.2)

    assert threading.active_count() <= before
    with pytest.raises(TransientClassifierError):
        OpenAICompatibleClassifier(url, None, "m", TAXONOMY, timeout_s=1).classify(request())
    classifier.close()
