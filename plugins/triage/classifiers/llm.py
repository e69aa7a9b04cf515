"""A classifier calling any OpenAI-compatible ``/chat/completions`` endpoint.

The boundary between "the call failed" and "the model answered badly" is the point of this
module, because the job ledger treats them differently:

* the call failed — timeouts, connection errors, 429 and 5xx raise
  :class:`~triage.classifiers.base.TransientClassifierError` (retried with backoff); other 4xx
  raise :class:`~triage.classifiers.base.PermanentClassifierError` (manual review). A
  ``Retry-After`` on a 429 or 5xx (seconds or an HTTP date) travels on the error as
  ``retry_after``; the classify step bounds it and waits that long (the job's retry, or the
  whole batch's parking on an outage).
* the model answered badly — content that is not JSON, not ``{"label", "confidence"}``, a
  label outside the taxonomy, or a refusal — is a :class:`~triage.classifiers.base.ModelOutput`
  with ``rejected_reason`` set, never an exception: asking again is not the remedy.

The answer's shape is asked for in one of two output modes (:data:`OUTPUT_MODES`, the
connection's extra ``response_format``): ``json_schema`` sends a strict JSON schema whose
``label`` is an enum of the taxonomy, so a provider that honours it cannot answer a label outside
it; ``json_object`` asks only for some JSON object. Either way the answer is validated the same
way afterwards. A provider that refuses ``json_schema`` (a 400 naming ``response_format``) is a
configuration problem, not the document's: ``structured_output_unsupported`` (the step releases
the job and fails the task without retrying), or with ``auto`` the classifier asks the same call
again in ``json_object`` and keeps that mode for the rest of its life. The mode of each answer is
recorded with its classification (``ModelOutput.output_mode``).

With a shared budget (requests/tokens per minute, :mod:`triage.classifiers.rate_limits`) each call
waits for its slot, and a 429 blocks the budget for every worker and is sent again, not raised.

Neither prompts, document text nor the API key are ever logged or put in an error message.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any, Final

import httpx
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from structlog.contextvars import bound_contextvars

from triage.classifiers.base import (
    ClassifierError,
    ClassifyRequest,
    ModelOutput,
    PermanentClassifierError,
    TransientClassifierError,
)
from triage.classifiers.provider_errors import error_detail, refuses_schema, retry_after
from triage.classifiers.rate_limits import CallBudget, RateLimiter
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.usage import model_usage
from triage.tracing import correlation_header, inject_trace_headers, model_call_span, set_attributes, set_error

__all__ = [
    "OUTPUT_MODES",
    "LlmVerdict",
    "OpenAICompatibleClassifier",
    "parse_chat_response",
    "parse_model_content",
    "retry_after",
    "system_prompt",
    "verdict_schema",
]

log = logging.getLogger(__name__)

_PERMANENT_STATUS: Final = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
_FENCE: Final = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)

OUTPUT_MODES: Final = ("json_schema", "json_object", "auto")
"""The values of the connection's extra ``response_format``: a strict JSON schema, a plain JSON
object, or the schema with a fallback to a plain object when the provider refuses it."""


class LlmVerdict(BaseModel):
    """The JSON object the model is asked for; extra keys (a "reasoning") are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    label: str
    confidence: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str | None = None
    refusal: Any = None  # structured outputs: the model declined (its words are never kept)


class _Choice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    message: _Message


class _ChatCompletion(BaseModel):
    """The part of the OpenAI chat-completion response Triage reads. ``usage`` is taken as
    sent and bounded by :func:`~triage.contracts.usage.model_usage`: a strange figure there never rejects the answer."""

    model_config = ConfigDict(extra="ignore")
    choices: list[_Choice] = Field(min_length=1)
    usage: Any = None


def system_prompt(taxonomy: Taxonomy) -> str:
    """The instructions: the labels with their descriptions and the answer format."""
    labels = "\n".join(f"- {label.name}: {' '.join(label.description.split())}" for label in taxonomy.labels)
    return (
        "You classify customer support tickets. Choose exactly one label from this list:\n"
        f"{labels}\n\n"
        'Answer with one JSON object and nothing else: {"label": "<label name>", '
        '"confidence": <number from 0 to 1>}. Use only the label names listed above. '
        "If no label fits well, choose the closest one and give a low confidence."
    )


def verdict_schema(taxonomy: Taxonomy) -> dict[str, Any]:
    """The ``response_format`` of the ``json_schema`` mode: ``label`` an enum of the taxonomy's
    names (in its order), ``confidence`` a number; strict, so nothing else may be added. The
    confidence's bounds are checked afterwards (strict mode does not take ``minimum``/``maximum``
    everywhere)."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "triage_verdict",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "enum": [label.name for label in taxonomy.labels]},
                    "confidence": {"type": "number", "description": "from 0 to 1"},
                },
                "required": ["label", "confidence"],
                "additionalProperties": False,
            },
        },
    }


def parse_model_content(
    content: str | None,
    names: frozenset[str],
    *,
    latency_ms: float = 0.0,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    cost_usd: float | None = None,
) -> ModelOutput:
    """Turn the model's message content into an output; never raises.

    Tolerates a Markdown code fence and label case/whitespace, nothing more: anything else
    that is not a valid verdict is rejected with ``empty_content``, ``invalid_json``,
    ``schema_mismatch`` or ``label_outside_taxonomy``.
    """

    def output(label: str | None, confidence: float, rejected: str | None) -> ModelOutput:
        return ModelOutput(
            label=label,
            confidence=confidence,
            rejected_reason=rejected,
            latency_ms=latency_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost_usd,
        )

    text = (content or "").strip()
    if not text:
        return output(None, 0.0, "empty_content")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        verdict = LlmVerdict.model_validate_json(text)
    except ValidationError as exc:
        invalid = any(error["type"] == "json_invalid" for error in exc.errors(include_url=False))
        return output(None, 0.0, "invalid_json" if invalid else "schema_mismatch")
    except (ValueError, RecursionError):  # pragma: no cover - defensive: parser limits
        return output(None, 0.0, "invalid_json")
    label = verdict.label.strip().lower()
    if label not in names:
        return output(None, 0.0, "label_outside_taxonomy")
    return output(label, verdict.confidence, None)


def parse_chat_response(
    body: bytes,
    names: frozenset[str],
    *,
    latency_ms: float = 0.0,
    price_per_1k_prompt: float | None = None,
    price_per_1k_completion: float | None = None,
) -> ModelOutput:
    """Turn a 200 response body into an output; never raises.

    A body that is not a chat completion at all is rejected as ``invalid_response`` rather
    than retried: a 200 with a foreign body means a misconfigured endpoint, which a human
    should see, not the retry loop.
    """
    try:
        completion = _ChatCompletion.model_validate_json(body)
    except (ValidationError, ValueError, RecursionError):
        return ModelOutput(None, 0.0, "invalid_response", latency_ms)
    usage, discarded = model_usage(completion.usage, price_per_1k_prompt, price_per_1k_completion)
    message = completion.choices[0].message
    if message.refusal and not message.content:
        output = ModelOutput(None, 0.0, "model_refused", latency_ms, **usage)
    else:
        output = parse_model_content(message.content, names, latency_ms=latency_ms, **usage)
    return dataclasses.replace(output, usage_discarded=discarded) if discarded else output


def check_output_mode(response_format: str) -> None:
    """:raises ValueError: ``response_format`` is not one of :data:`OUTPUT_MODES` (checked by the
    classifier and by its version, so that retrieval refuses it before registering any job)."""
    if response_format not in OUTPUT_MODES:
        raise ValueError(f"response_format must be one of {', '.join(OUTPUT_MODES)}, not {response_format!r}")


def llm_version(taxonomy: Taxonomy, *, model: str, prompt_version: str = "p1", temperature: float = 0.0) -> str:
    """The model classifier's version, without a client: the model, the prompt's version, the
    temperature and the taxonomy (it is part of the prompt, so it is part of the version and of
    the idempotency key). The other settings (timeout, prices, output mode) are not."""
    return f"llm:{model}:{prompt_version}:t{temperature}+tax-{taxonomy.content_hash[:8]}"


class OpenAICompatibleClassifier:
    """Classifies with a chat model; one shared, thread-safe connection pool.

    :param base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
    :param api_key: sent as a bearer token if given.
    :param timeout_s: total timeout of one call (connect, write, read, pool wait).
    :param max_connections: pool size; at least the caller's concurrency, or calls queue for a
        connection and may time out waiting.
    :param response_format: the output mode, one of :data:`OUTPUT_MODES` (see the module
        docstring). Not part of :attr:`version`: the prompt, model and labels are the same in
        every mode and the answer is validated the same way; each answer records its mode.
    :param budget: the connection's shared requests/tokens budget; None: calls are limited by
        the caller's concurrency only, and a 429 fails the call (``rate_limited``).
    :param budget_max_wait_seconds: the longest one call waits for the budget before giving up.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        taxonomy: Taxonomy,
        temperature: float = 0.0,
        timeout_s: float = 30.0,
        prompt_version: str = "p1",
        max_connections: int = 64,
        price_per_1k_prompt: float | None = None,
        price_per_1k_completion: float | None = None,
        response_format: str = "json_schema",
        budget: CallBudget | None = None,
        budget_max_wait_seconds: float = 60.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        check_output_mode(response_format)
        self.fallback = response_format == "auto"
        self.output_mode = "json_schema" if self.fallback else response_format
        """The mode of the next call; ``auto`` turns it to ``json_object`` at the first refusal."""
        self.model = model
        self.taxonomy = taxonomy
        self.temperature = temperature
        self.price_per_1k_prompt = price_per_1k_prompt
        self.price_per_1k_completion = price_per_1k_completion
        self.version = llm_version(taxonomy, model=model, prompt_version=prompt_version, temperature=temperature)
        self._names = taxonomy.names
        self._system_prompt = system_prompt(taxonomy)
        self._formats = {"json_schema": verdict_schema(taxonomy), "json_object": {"type": "json_object"}}
        self._url = f"{base_url.rstrip('/')}/chat/completions"
        self._limiter = RateLimiter(budget, max_wait_seconds=budget_max_wait_seconds) if budget else None
        # About 4 characters a token: the instructions, the schema and a short answer.
        self._fixed_tokens = (len(self._system_prompt) + len(str(self._formats["json_schema"]))) / 4 + 20
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def request_body(self, text: str, output_mode: str | None = None) -> dict[str, Any]:
        """The JSON body of one chat-completion call (in :attr:`output_mode` unless given)."""
        return {
            "model": self.model,
            "temperature": self.temperature,
            "response_format": self._formats[output_mode or self.output_mode],
            "messages": [
                {"role": "system", "content": self._system_prompt},
                {"role": "user", "content": text},
            ],
        }

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        """One call, in a span of its own (:mod:`triage.tracing`); see the module docstring for
        what raises and what is rejected."""
        with model_call_span(request.job_id, request.correlation_id, request.attempt, self.model) as span:
            try:
                return self._call(request)
            except ClassifierError as exc:
                set_error(span, exc.error_class)
                raise

    def _call(self, request: ClassifyRequest) -> ModelOutput:
        headers = {
            # Lets a provider or proxy deduplicate a retried call of the same logical operation.
            "Idempotency-Key": request.idempotency_key,
            # The job's correlation id travels as a header (never in the body: OpenAI's "user"
            # names an end user and "metadata" needs "store"; a strict server refuses fields
            # it does not know, while every server ignores a header it does not know).
            "X-Correlation-ID": correlation_header(request.correlation_id),
        }
        inject_trace_headers(headers)
        mode = self.output_mode
        started = time.perf_counter()
        response = self._post(request, mode, headers)
        if mode == "json_schema" and response.status_code in (400, 422) and refuses_schema(response):
            if not self.fallback:
                raise PermanentClassifierError(
                    "structured_output_unsupported",
                    f"HTTP {response.status_code}: the provider refuses response_format json_schema; set the "
                    "connection's extra response_format to json_object (or auto)",
                )
            if self.output_mode == "json_schema":  # one warning per classifier, not per call
                log.warning("the provider refuses response_format json_schema: json_object from now on (auto)")
            self.output_mode = mode = "json_object"
            response = self._post(request, mode, headers)
        latency_ms = (time.perf_counter() - started) * 1000.0
        output = self._read(request, response, latency_ms)
        if self._limiter is not None and output.prompt_tokens is not None:
            self._limiter.used(self._estimate(request), output.prompt_tokens + (output.completion_tokens or 0))
        return dataclasses.replace(output, output_mode=mode)

    def _estimate(self, request: ClassifyRequest) -> float:
        return self._fixed_tokens + len(request.text) / 4

    def _post(self, request: ClassifyRequest, mode: str, headers: dict[str, str]) -> httpx.Response:
        if self._limiter is None:
            return self._send(request, mode, headers)
        return self._limiter.call(lambda: self._send(request, mode, headers), self._estimate(request))

    def _send(self, request: ClassifyRequest, mode: str, headers: dict[str, str]) -> httpx.Response:
        try:
            return self._client.post(self._url, json=self.request_body(request.text, mode), headers=headers)
        except httpx.TimeoutException as exc:
            raise TransientClassifierError("timeout", f"model call timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise TransientClassifierError("connection_error", f"model call failed ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:  # a body that does not decode, too many redirects, …
            raise TransientClassifierError("protocol_error", f"model call failed ({type(exc).__name__})") from None

    def _read(self, request: ClassifyRequest, response: httpx.Response, latency_ms: float) -> ModelOutput:
        """The output of a response, or the classified error of a failed call."""
        status = response.status_code
        set_attributes(trace.get_current_span(), {"http.response.status_code": status})
        if log.isEnabledFor(logging.DEBUG):
            fields = {"job_id": request.job_id, "correlation_id": request.correlation_id, "attempt": request.attempt}
            with bound_contextvars(**fields):  # structured fields, as triage.observability.log_job
                log.debug("model call status=%s latency_ms=%.1f", status, latency_ms, extra=fields)
        if status == 429:
            raise TransientClassifierError("rate_limited", "HTTP 429", retry_after=retry_after(response))
        if status == 408:
            raise TransientClassifierError("timeout", "HTTP 408")
        if status >= 500:
            raise TransientClassifierError("server_error", f"HTTP {status}", retry_after=retry_after(response))
        if 400 <= status < 500:
            error_class = _PERMANENT_STATUS.get(status, "client_error")
            raise PermanentClassifierError(error_class, f"HTTP {status}{error_detail(response)}")
        if 300 <= status < 400:  # the base URL points somewhere else: a configuration problem
            raise PermanentClassifierError("redirected", f"HTTP {status}: check the base URL")
        if status != 200:
            raise PermanentClassifierError("unexpected_status", f"HTTP {status}")
        return parse_chat_response(
            response.content,
            self._names,
            latency_ms=latency_ms,
            price_per_1k_prompt=self.price_per_1k_prompt,
            price_per_1k_completion=self.price_per_1k_completion,
        )

    def answer_of(self, request: ClassifyRequest, response: httpx.Response) -> ModelOutput:
        """The output of a response obtained elsewhere (a batch's line), in :attr:`output_mode`;
        raises the classified error of a failed request as :meth:`classify` does."""
        return dataclasses.replace(self._read(request, response, 0.0), output_mode=self.output_mode)

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._client.close()
