"""The provider's batch interface (OpenAI-compatible ``/v1/files`` and ``/v1/batches``): many
classifications submitted as one file, answered within the provider's completion window (24 h)
at a lower price than the interactive endpoint.

This module is the provider side only (no database, no Airflow): submit requests, read a batch's
state, read its per-request results. Each request is the same chat-completion body the
interactive classifier sends (:meth:`OpenAICompatibleClassifier.request_body`), so an answer is
the same classifier version's, validated the same way; its ``custom_id`` is the caller's (Triage
uses ``<job id>:<attempt>``).

* **Idempotent submission**: :meth:`BatchClient.submit` takes a ``key`` (the caller's name for
  this set of requests), sent as the batch's ``metadata.triage_key``; a batch of the provider
  already carrying that key is adopted instead of submitting again (a worker that died after the
  provider accepted the batch, before it recorded the id, does not pay twice).
* **Phases** (:class:`BatchState`): ``running`` (validating, in progress, finalizing,
  cancelling), ``done`` (completed, or expired: what finished is in the output, the rest comes
  back per request as lost), ``lost`` (failed, cancelled, or unknown to the provider: 404).
* **Results per request** (:meth:`BatchClient.results`): an answer (:class:`ModelOutput`), a
  classified error of that request (a 429 or 5xx inside the batch is transient, a 4xx permanent,
  as interactively), or lost (the batch expired before it, or it is missing from both files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import httpx

from triage.classifiers.base import (
    ClassifierError,
    ClassifyRequest,
    ModelOutput,
    PermanentClassifierError,
    TransientClassifierError,
)
from triage.classifiers.llm import OpenAICompatibleClassifier

__all__ = ["BatchClient", "BatchState", "LineResult"]

RUNNING: Final = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
DONE: Final = frozenset({"completed", "expired"})
ENDPOINT: Final = "/v1/chat/completions"
REFUSED: Final = frozenset({401, 403, 404, 405})


@dataclass(frozen=True, slots=True)
class BatchState:
    batch_id: str
    status: str  # the provider's word; "gone" when it answered 404
    phase: Literal["running", "done", "lost"]
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass(frozen=True, slots=True)
class LineResult:
    """One request's result: ``output`` (answered), ``error`` (the request failed), or neither
    (lost: not processed; the caller queues it again)."""

    custom_id: str
    output: ModelOutput | None = None
    error: ClassifierError | None = None


class BatchClient:
    """Batches of :paramref:`classifier`'s requests at its base URL, with its API key.

    :param timeout_s: one HTTP call's timeout (uploads of large files take longer than a chat call).
    """

    def __init__(
        self, classifier: OpenAICompatibleClassifier, base_url: str, api_key: str | None, timeout_s: float = 120.0
    ) -> None:
        self.classifier = classifier
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s)

    def find(self, key: str) -> str | None:
        """The provider's batch carrying ``metadata.triage_key == key`` (its recent ones), or None."""
        response = self._check(self._client.get("batches", params={"limit": 100}))
        for batch in response.json().get("data") or []:
            if (batch.get("metadata") or {}).get("triage_key") == key:
                return str(batch["id"])
        return None

    def submit(self, requests: Iterable[tuple[str, str]], key: str) -> str:
        """Submit ``(custom_id, text)`` requests as one batch named ``key``; its id. Idempotent."""
        found = self.find(key)
        if found is not None:
            return found
        lines = b"".join(
            json.dumps(
                {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": self.classifier.request_body(text)}
            ).encode()
            + b"\n"
            for custom_id, text in requests
        )
        upload = self._check(
            self._client.post("files", data={"purpose": "batch"}, files={"file": (f"{key}.jsonl", lines)})
        )
        body = {
            "input_file_id": upload.json()["id"],
            "endpoint": ENDPOINT,
            "completion_window": "24h",
            "metadata": {"triage_key": key},
        }
        return str(self._check(self._client.post("batches", json=body)).json()["id"])

    def state(self, batch_id: str) -> BatchState:
        response = self._client.get(f"batches/{batch_id}")
        if response.status_code == 404:
            return BatchState(batch_id, "gone", "lost")
        batch = self._check(response).json()
        status = str(batch.get("status"))
        phase: Literal["running", "done", "lost"] = (
            "running" if status in RUNNING else "done" if status in DONE else "lost"
        )
        return BatchState(batch_id, status, phase, batch.get("output_file_id"), batch.get("error_file_id"))

    def results(self, state: BatchState, custom_ids: Sequence[str]) -> list[LineResult]:
        """One result per ``custom_ids`` (in that order), from the batch's output and error files."""
        found: dict[str, LineResult] = {}
        for file_id in (state.error_file_id, state.output_file_id):  # an output line wins over an error line
            if file_id:
                response = self._client.get(f"files/{file_id}/content")
                if response.status_code == 404:  # the provider lost the file: its requests are lost
                    continue
                for line in self._check(response).content.splitlines():
                    if line.strip():
                        result = self._line(json.loads(line))
                        found[result.custom_id] = result
        return [found.get(custom_id, LineResult(custom_id)) for custom_id in custom_ids]

    def _line(self, line: dict[str, object]) -> LineResult:
        custom_id = str(line.get("custom_id"))
        response = line.get("response")
        if not isinstance(response, dict):
            error = line.get("error")
            code = str(error.get("code")) if isinstance(error, dict) else "batch_error"
            if code in ("batch_expired", "batch_cancelled", "batch_failed"):
                return LineResult(custom_id)  # not processed: lost, not failed
            return LineResult(custom_id, error=TransientClassifierError("batch_request_failed", code[:64]))
        job_id, _, attempt = custom_id.partition(":")
        request = ClassifyRequest(job_id, "", "", "", int(attempt) if attempt.isdigit() else 0, "")
        http = httpx.Response(int(response.get("status_code") or 0), content=json.dumps(response.get("body")).encode())
        try:
            return LineResult(custom_id, output=self.classifier.answer_of(request, http))
        except ClassifierError as exc:
            return LineResult(custom_id, error=exc)

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        """The response, unless it is an error: 401, 403, 404 and 405 say the provider has no batch
        interface there, or the key may not use it (permanent: retrying cannot help); any other
        error is transient."""
        if response.status_code in REFUSED:
            raise PermanentClassifierError(
                "batch_interface_unavailable",
                f"batch interface: HTTP {response.status_code} at {response.request.url.path}",
            )
        if response.status_code >= 400:
            raise TransientClassifierError("batch_api_error", f"batch interface: HTTP {response.status_code}")
        return response

    def close(self) -> None:
        self._client.close()
