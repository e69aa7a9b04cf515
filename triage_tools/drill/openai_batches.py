"""OpenAI's batch interface for the fake server: ``POST /v1/files`` (multipart, purpose ``batch``),
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``
and ``POST /v1/batches/{id}/cancel``.

A batch's lines are answered by the server's responder (so ``Reply.status_only(500)`` for a line
is a failed request in the output, as OpenAI reports one) when the batch is created; the batch
then reports ``in_progress`` for ``polls_until_done`` reads of it and ``completed`` after.
Tests play a provider that loses work: :meth:`FakeBatches.lose` makes a batch ``expired`` (only
the first ``keep`` lines' results in its output, the others in its error file as
``batch_expired``), ``failed`` or ``cancelled`` (no output), or forgets it (404).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triage_tools.drill.openai_server import FakeOpenAIServer

__all__ = ["FakeBatches"]


@dataclass
class _Batch:
    id: str
    input_file_id: str
    metadata: dict[str, Any]
    lines: list[dict[str, Any]]
    results: list[tuple[str, int, bytes]]  # (custom_id, status, body)
    polls_left: int
    status: str = "in_progress"
    keep: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))

    def view(self) -> dict[str, Any]:
        done = len(self.results) if self.keep is None else min(self.keep, len(self.results))
        failed = sum(1 for _, status, _ in self.results[:done] if status != 200)
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": self.input_file_id,
            "completion_window": "24h",
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "request_counts": {"total": len(self.lines), "completed": done - failed, "failed": failed},
        }


class FakeBatches:
    """The batch state of one fake server; thread-safe."""

    def __init__(self, server: FakeOpenAIServer, polls_until_done: int = 1) -> None:
        self.server, self.polls_until_done = server, polls_until_done
        self.finish_as: tuple[str, int] = ("completed", 0)
        """What a batch becomes once its polls run out: ``completed``, or a loss as :meth:`lose`
        takes it (``("failed", 0)``, ``("expired", keep)``, ``("gone", 0)``): a provider that loses
        batches a test cannot reach in time (another process submits and polls them)."""
        self.refuse: int | None = None
        """An HTTP status every request of the batch interface gets (a provider without one: 404)."""
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.created = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def lose(self, batch_id: str, status: str = "expired", keep: int = 0) -> None:
        """The provider loses the batch: ``expired`` (the first ``keep`` results kept),
        ``failed``, ``cancelled``, or ``gone`` (404 from now on)."""
        with self._lock:
            self._lose(batch_id, status, keep)

    def _lose(self, batch_id: str, status: str, keep: int) -> None:
        if status == "gone":
            del self.batches[batch_id]
            return
        batch = self.batches[batch_id]
        batch.status, batch.keep, batch.polls_left = status, keep if status == "expired" else 0, 0
        self._finish(batch)

    # -- HTTP ---------------------------------------------------------------------------------

    def post(self, path: str, content_type: str, raw: bytes) -> tuple[int, Any]:
        if self.refuse is not None:
            return self.refuse, _error("refused")
        if path == "/v1/files":
            return self._upload(content_type, raw)
        if path == "/v1/batches":
            return self._create(json.loads(raw))
        if path.startswith("/v1/batches/") and path.endswith("/cancel"):
            with self._lock:
                batch = self.batches.get(path.split("/")[3])
                if batch is None:
                    return 404, _error("batch not found")
                batch.status, batch.keep = "cancelled", 0
                self._finish(batch)
                return 200, batch.view()
        return 404, _error("no such path")

    def get(self, path: str) -> tuple[int, Any]:
        if self.refuse is not None:
            return self.refuse, _error("refused")
        parts = path.split("?")[0].strip("/").split("/")
        with self._lock:
            if parts == ["v1", "batches"]:
                data = [b.view() for b in sorted(self.batches.values(), key=lambda b: b.id, reverse=True)]
                return 200, {"object": "list", "data": data, "has_more": False}
            if len(parts) == 3 and parts[:2] == ["v1", "batches"]:
                batch = self.batches.get(parts[2])
                if batch is None:
                    return 404, _error("batch not found")
                if batch.status == "in_progress":
                    if batch.polls_left <= 0 and self.finish_as[0] != "completed":
                        self._lose(batch.id, *self.finish_as)
                        if batch.id not in self.batches:
                            return 404, _error("batch not found")
                    elif batch.polls_left <= 0:
                        batch.status = "completed"
                        self._finish(batch)
                    batch.polls_left -= 1
                return 200, batch.view()
            if len(parts) == 4 and parts[:2] == ["v1", "files"] and parts[3] == "content":
                content = self.files.get(parts[2])
                return (404, _error("file not found")) if content is None else (200, content)
        return 404, _error("no such path")

    def _upload(self, content_type: str, raw: bytes) -> tuple[int, Any]:
        message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
        fields: dict[str, bytes] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)  # bytes for a non-multipart part
            fields[str(name)] = payload if isinstance(payload, bytes) else b""
        if fields.get("purpose") != b"batch" or "file" not in fields:
            return 400, _error("purpose must be batch, with a file")
        with self._lock:
            file_id = f"file-{next(self._ids)}"
            self.files[file_id] = fields["file"]
        return 200, {"id": file_id, "object": "file", "bytes": len(fields["file"]), "purpose": "batch"}

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            content = self.files.get(str(body.get("input_file_id")))
        if content is None or body.get("endpoint") != "/v1/chat/completions":
            return 400, _error("unknown input file or endpoint")
        lines = [json.loads(line) for line in content.splitlines() if line.strip()]
        results = []
        for line in lines:  # answered now, released as the batch progresses
            reply = self.server.responder(line["body"])
            results.append((line["custom_id"], reply.status, reply.render(str(line["body"].get("model", "")))))
        with self._lock:
            batch_id = f"batch_{next(self._ids)}"
            batch = _Batch(
                batch_id, body["input_file_id"], dict(body.get("metadata") or {}), lines, results, self.polls_until_done
            )
            self.batches[batch_id] = batch
            self.created += 1
        return 200, batch.view()

    def _finish(self, batch: _Batch) -> None:
        """Write the batch's output and error files as it stands (under the lock)."""
        done = batch.results if batch.keep is None else batch.results[: batch.keep]
        output = [
            {
                "id": f"req-{i}",
                "custom_id": custom_id,
                "response": {"status_code": status, "request_id": f"r{i}", "body": json.loads(body)},
                "error": None,
            }
            for i, (custom_id, status, body) in enumerate(done)
        ]
        unfinished = batch.lines[len(done) :] if batch.status in ("expired", "cancelled", "failed") else []
        errors = [
            {
                "id": f"req-x{i}",
                "custom_id": line["custom_id"],
                "response": None,
                "error": {"code": f"batch_{batch.status}", "message": "not processed"},
            }
            for i, line in enumerate(unfinished)
        ]
        if output and batch.status in ("completed", "expired"):
            batch.output_file_id = f"file-{next(self._ids)}"
            self.files[batch.output_file_id] = b"".join(json.dumps(o).encode() + b"\n" for o in output)
        if errors and batch.status == "expired":
            batch.error_file_id = f"file-{next(self._ids)}"
            self.files[batch.error_file_id] = b"".join(json.dumps(e).encode() + b"\n" for e in errors)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"type": "invalid_request_error", "code": None, "message": message}}
