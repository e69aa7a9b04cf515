"""A scriptable OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1.

A real HTTP server (``ThreadingHTTPServer``, one thread per connection, HTTP/1.1 keep-alive)
in a daemon thread, so the classifier's own HTTP client, pool and timeouts are what is tested.
Tests choose each reply::

    with FakeOpenAIServer(responder=fixed_label("billing")) as server:
        server.enqueue(Reply.status(429), Reply.slow(500))   # the next two requests
        classifier = OpenAICompatibleClassifier(base_url=server.base_url, ...)

Requests take the queued replies first, then ``responder(body)``. ``latency_ms`` delays every
reply (benchmarks); the server sustains many concurrent requests (a deep listen backlog, a
thread per connection). It records every JSON body it received. ``refuse_json_schema`` plays a
provider without structured outputs: a request asking for ``response_format: json_schema`` gets
the 400 OpenAI answers for a model that lacks it, before any queued reply. ``requests_per_second``
plays a provider's rate limit: a token bucket of that rate (holding ``burst_seconds`` of it) per
server, and a request finding it empty gets a 429 with ``retry-after-ms`` and OpenAI's
``x-ratelimit-*`` headers (``rate_limited`` counts them); answered requests carry the headers too.
``batches`` serves OpenAI's batch interface (``/v1/files``, ``/v1/batches``: :mod:`triage_tools.drill.openai_batches`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage_tools.drill.openai_batches import FakeBatches

__all__ = ["SCHEMA_REFUSED", "FakeOpenAIServer", "Reply", "fixed_label", "keyword_responder"]


@dataclass(frozen=True)
class Reply:
    """One scripted reply. ``content`` is the model's message text; ``body`` replaces the
    whole response body; ``delay_ms`` sleeps before answering."""

    status: int = 200
    label: str = "general_inquiry"
    confidence: float = 0.9
    content: str | None = None
    body: bytes | None = None
    delay_ms: float = 0.0
    prompt_tokens: int = 120
    completion_tokens: int = 12
    usage: Any = None  # replaces the whole usage object as given (anything JSON, NaN included)
    retry_after: str | None = None  # sent as the Retry-After header (seconds or an HTTP date)
    refusal: str | None = None  # structured outputs: the model declined (content null)
    headers: tuple[tuple[str, str], ...] = ()  # sent as they are (x-ratelimit-*, retry-after-ms)

    @classmethod
    def ok(cls, label: str, confidence: float = 0.9, **kwargs: Any) -> Reply:
        return cls(label=label, confidence=confidence, **kwargs)

    @classmethod
    def status_only(cls, status: int, retry_after: str | None = None) -> Reply:
        return cls(status=status, retry_after=retry_after)

    @classmethod
    def slow(cls, delay_ms: float, label: str = "general_inquiry") -> Reply:
        return cls(label=label, delay_ms=delay_ms)

    @classmethod
    def malformed_content(cls, content: str = '{"label": "billing", "confidence":') -> Reply:
        return cls(content=content)

    @classmethod
    def raw_body(cls, body: bytes, status: int = 200) -> Reply:
        return cls(status=status, body=body)

    @classmethod
    def refused(cls, refusal: str = "I'm sorry, I cannot help with that.") -> Reply:
        return cls(refusal=refusal)

    def render(self, model: str) -> bytes:
        """The response body: an OpenAI error object for errors, a chat completion for 200."""
        if self.body is not None:
            return self.body
        if self.status != 200:
            return json.dumps(
                {"error": {"type": "fake_error", "code": str(self.status), "message": "scripted"}}
            ).encode()
        content = self.content
        if content is None:
            content = json.dumps({"label": self.label, "confidence": self.confidence})
        return json.dumps(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "refusal": self.refusal}
                        if self.refusal is not None
                        else {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": self.usage
                if self.usage is not None
                else {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens,
                },
            }
        ).encode()


Responder = Callable[[dict[str, Any]], Reply]

SCHEMA_REFUSED = Reply.raw_body(
    json.dumps(
        {
            "error": {
                "message": "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.",
                "type": "invalid_request_error",
                "param": "response_format",
                "code": None,
            }
        }
    ).encode(),
    400,
)
"""What OpenAI answers a ``json_schema`` request for a model without structured outputs."""


def fixed_label(label: str, confidence: float = 0.9) -> Responder:
    """Always answer ``label``."""
    reply = Reply.ok(label, confidence)
    return lambda _body: reply


def keyword_responder(taxonomy: Taxonomy, fallback: str = "general_inquiry") -> Responder:
    """Answer what the keyword classifier finds in the user message (a plausible model)."""
    classifier = KeywordClassifier(taxonomy)

    def respond(body: dict[str, Any]) -> Reply:
        text = next((m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"), "")
        scores = classifier.scores(str(text))
        total = sum(scores)
        if not total:
            return Reply.ok(fallback, 0.3)
        best = scores.index(max(scores))
        return Reply.ok(taxonomy.labels[best].name, round(max(scores) / total, 3))

    return respond


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real APIs; needs Content-Length
    # A reply leaves in one write (the status line, headers and body buffered, flushed once after
    # do_POST): written in two, Nagle's algorithm held the body back until the client's delayed
    # ACK of the headers, about 40 ms on Linux, which every timed call paid (docs/performance.md).
    wbufsize = -1
    server: _Server
    timeout = 10  # an idle keep-alive connection ends its thread after this

    def _send_batch_api(self, status: int, answer: Any) -> None:
        payload = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "application/octet-stream" if isinstance(answer, bytes) else "application/json"
        )
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._send_batch_api(*self.server.fake.batches.get(self.path))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.startswith(("/v1/files", "/v1/batches")):
            fake = self.server.fake
            self._send_batch_api(*fake.batches.post(self.path, self.headers.get("Content-Type", ""), raw))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_unparseable": raw.decode("utf-8", "replace")}
        fake = self.server.fake
        reply = fake._next_reply(body, dict(self.headers), self.path)
        delay = (reply.delay_ms + fake.latency_ms) / 1000.0
        if delay:
            time.sleep(delay)
        if self.path.rstrip("/") != "/v1/chat/completions":
            reply = Reply.status_only(404)
        payload = reply.render(str(body.get("model", "")))
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        if reply.retry_after is not None:
            self.send_header("Retry-After", reply.retry_after)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default of 5 refuses bursts of concurrent connections
    fake: FakeOpenAIServer

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with contextlib.suppress(OSError):  # as a real API server: no Nagle delay on small replies
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End idle keep-alive connections so their handler threads exit now."""
        with self.connections_lock:
            connections = list(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by the client
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out closes its socket before the slow reply is written; that
        # is the scenario under test, not a server failure.
        pass


class FakeOpenAIServer:
    """Context manager running the fake server; ``base_url`` ends in ``/v1``."""

    def __init__(
        self,
        responder: Responder | None = None,
        latency_ms: float = 0.0,
        *,
        refuse_json_schema: bool = False,
        requests_per_second: float | None = None,
        burst_seconds: float = 1.0,
    ) -> None:
        self.responder: Responder = responder or fixed_label("general_inquiry")
        self.requests_per_second, self.burst_seconds = requests_per_second, burst_seconds
        self.rate_limited = 0
        self.batches = FakeBatches(self)
        """The batch interface (:mod:`triage_tools.drill.openai_batches`): its files and batches."""
        self._bucket = (requests_per_second or 0.0) * burst_seconds
        self._bucket_at = time.monotonic()
        self.latency_ms = latency_ms
        self.refuse_json_schema = refuse_json_schema
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("server not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def enqueue(self, *replies: Reply) -> None:
        """Script the next requests, in order; later ones fall back to the responder."""
        with self._lock:
            self._queue.extend(replies)

    def _next_reply(self, body: dict[str, Any], headers: dict[str, str], path: str) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self.paths.append(path)
            response_format = body.get("response_format")
            mode = response_format.get("type") if isinstance(response_format, dict) else None
            if self.refuse_json_schema and mode == "json_schema":
                return SCHEMA_REFUSED
            limit = self._rate_limit()
            if limit is not None and limit.status == 429:
                return limit
            if self._queue:
                reply = self._queue.popleft()
                return reply if limit is None else dataclasses.replace(reply, headers=reply.headers + limit.headers)
        reply = self.responder(body)
        return reply if limit is None else dataclasses.replace(reply, headers=reply.headers + limit.headers)

    def _rate_limit(self) -> Reply | None:
        """Take one request from the bucket (under the lock): None without a limit, a 429 when it
        is empty, else a reply carrying only the headers to add."""
        rate = self.requests_per_second
        if rate is None:
            return None
        now, capacity = time.monotonic(), rate * self.burst_seconds
        self._bucket = min(capacity, self._bucket + (now - self._bucket_at) * rate)
        self._bucket_at = now
        if self._bucket < 1.0:
            self.rate_limited += 1
            wait_ms = max((1.0 - self._bucket) / rate * 1000.0, 1.0)
            headers = (
                ("retry-after-ms", f"{wait_ms:.0f}"),
                ("x-ratelimit-limit-requests", f"{rate * 60:.0f}"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", f"{wait_ms:.0f}ms"),
            )
            return Reply(status=429, headers=headers)
        self._bucket -= 1.0
        full_ms = (capacity - self._bucket) / rate * 1000.0
        return Reply(
            headers=(
                ("x-ratelimit-limit-requests", f"{rate * 60:.0f}"),
                ("x-ratelimit-remaining-requests", f"{int(self._bucket)}"),
                ("x-ratelimit-reset-requests", f"{full_ms:.0f}ms"),
            )
        )

    def start(self) -> FakeOpenAIServer:
        server = _Server(("127.0.0.1", 0))
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
