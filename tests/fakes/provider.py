"""A fake external provider on loopback that honours ``Idempotency-Key``: it applies each key's
effect once, counts every request, and can be told to complete a request and then answer too
late (the timeout-after-success case) or not at all."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeProvider:
    def __init__(self) -> None:
        self.effects: dict[str, dict[str, Any]] = {}  # idempotency key -> the first body applied
        self.requests: Counter[str] = Counter()
        self.delay_after_effect_s = 0.0  # > client timeout: the effect happens, the answer is late
        self.fail_next = 0  # answer 503 to the next N requests without applying them
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key", "")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with provider._lock:
                    provider.requests[key] += 1
                    if provider.fail_next > 0:
                        provider.fail_next -= 1
                        status = 503
                    else:
                        provider.effects.setdefault(key, body)
                        status = 200
                if status == 200 and provider.delay_after_effect_s:
                    time.sleep(provider.delay_after_effect_s)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/labels"

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
