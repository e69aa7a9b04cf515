"""A label provider on loopback that honours ``Idempotency-Key``: it applies each key's effect
once, counts every request, and can be told to complete a request and then answer too late (the
timeout-after-success case) or not at all.

The external system of the failure drill (``make chaos``) and of the failure tests: the drill's
invariant "the sink saw each idempotency key's effect at most once" is read off :attr:`effects`
and :attr:`requests`. ``on_effect`` runs after an effect is applied and before the answer, which
is where the drill kills the caller: the effect exists, the caller never learns of it.
It also keeps each document's label by the request's ``X-Label-Order`` (:attr:`labels`): an
older job's label arriving after a newer one's does not replace it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from triage.contracts.drill import drill_fraction


class FakeProvider:
    """:param late_rate: share of keys whose first request is applied and then answered after
        ``late_by_s`` (decided by ``seed`` and the key, so a re-run makes the same choices).
    :param on_effect: called with the key and the number of effects so far, after a new effect
        is applied and before the answer is sent.
    """

    def __init__(
        self,
        *,
        late_rate: float = 0.0,
        late_by_s: float = 0.0,
        seed: int = 0,
        on_effect: Callable[[str, int], None] | None = None,
        port: int = 0,
    ) -> None:
        self.effects: dict[str, dict[str, Any]] = {}  # idempotency key -> the first body applied
        self.requests: Counter[str] = Counter()
        # Every distinct effect asked for under each key (body as canonical JSON). The provider
        # applies the first; a second, different one under the same key would be an effect the
        # caller believes happened and never did, so the drill requires one per key.
        self.asked: dict[str, set[str]] = {}
        # The label each document ends with: a request applies only if its ``X-Label-Order``
        # is not older than the document's current one (a real provider's ordering rule).
        self.labels: dict[tuple[str, str], tuple[str, str]] = {}  # (source, external_id) -> (order, label)
        self.stale = 0  # effects not applied to the document because a newer label stood
        self.delay_after_effect_s = 0.0  # > client timeout: the effect happens, the answer is late
        self.fail_next = 0  # answer 503 to the next N requests without applying them
        self.late_rate, self.late_by_s, self.seed, self.on_effect = late_rate, late_by_s, seed, on_effect
        self.late_answers = 0
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key", "")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                new_effect, delay = False, 0.0
                with provider._lock:
                    provider.requests[key] += 1
                    if provider.fail_next > 0:
                        provider.fail_next -= 1
                        status = 503
                    else:
                        new_effect = key not in provider.effects
                        if new_effect:
                            provider.effects[key] = body
                            provider._apply_label(self.headers.get("X-Label-Order", ""), body)
                        provider.asked.setdefault(key, set()).add(json.dumps(body, sort_keys=True))
                        status = 200
                        delay = provider.delay_after_effect_s
                        if (
                            new_effect
                            and provider.late_rate
                            and drill_fraction(provider.seed, "late", key) < provider.late_rate
                        ):
                            delay, provider.late_answers = max(delay, provider.late_by_s), provider.late_answers + 1
                    effects = len(provider.effects)
                if new_effect and provider.on_effect is not None:
                    provider.on_effect(key, effects)
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _apply_label(self, order: str, body: dict[str, Any]) -> None:
        """Under the lock: the document keeps the label of the highest order it was sent."""
        document = (str(body.get("source")), str(body.get("external_id")))
        current = self.labels.get(document)
        if current is not None and order < current[0]:
            self.stale += 1
            return
        self.labels[document] = (order, str(body.get("label")))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/labels"

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
