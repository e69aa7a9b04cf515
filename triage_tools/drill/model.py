"""A chat model on loopback whose state the drill sets: down, hanging, or up.

The ``triage_llm`` connection of the drill's deployment points at it (only the outage's and the
last-try case's runs use the ``llm`` classifier). It starts down, which is the drill's model
outage (:mod:`triage_tools.drill.outage`), and is up again once the last-try case's kill is
done. Down: every call is answered ``503`` with ``Retry-After``,
an outage that opens the classify step's circuit breaker, so ``classify`` fails each try at
once and its retry policy retries after the hint, not after Airflow's backoff. Hanging: a call
is held open until the state changes (at most ``hang_limit_s``), so the try that made it holds
its claim for as long as the drill needs to find and kill it. Up: every call answers one label
of the taxonomy with high confidence. A call held while hanging is answered by the state that
ended the hang.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ModelState(StrEnum):
    DOWN = "down"
    HANGING = "hanging"
    UP = "up"


class FakeModel:
    """:param label: the label an up model answers (one of the taxonomy's).
    :param retry_after_s: the ``Retry-After`` of a down model's 503.
    """

    def __init__(self, *, label: str, retry_after_s: int = 2, hang_limit_s: float = 120.0) -> None:
        self.state = ModelState.DOWN
        self.calls: Counter[str] = Counter()  # by the state a call found
        self._changed = threading.Condition()
        model = self
        answer = json.dumps(
            {
                "id": "chaos",
                "object": "chat.completion",
                "model": "chaos-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps({"label": label, "confidence": 0.95})},
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with model._changed:
                    model.calls[model.state] += 1
                    model._changed.wait_for(lambda: model.state != ModelState.HANGING, timeout=hang_limit_s)
                    state = model.state
                body = answer if state == ModelState.UP else b'{"error": {"message": "overloaded"}}'
                self.send_response(200 if state == ModelState.UP else 503)
                if state != ModelState.UP:
                    self.send_header("Retry-After", str(retry_after_s))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def set(self, state: ModelState) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()

    @property
    def url(self) -> str:
        """The API root, as the ``triage_llm`` connection's host takes it."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def connection(self) -> str:
        """The ``triage_llm`` connection (``AIRFLOW_CONN_TRIAGE_LLM``): a call's timeout longer
        than the drill needs to kill the try that hangs on it."""
        return json.dumps({"conn_type": "http", "host": self.url, "extra": {"model": "chaos-model", "timeout": 60}})

    def __enter__(self) -> FakeModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.set(ModelState.UP)  # release every call still held
        self._server.shutdown()
        self._server.server_close()
