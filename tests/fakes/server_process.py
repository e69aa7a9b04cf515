"""The fake OpenAI-compatible server in a process of its own, as a provider is: its threads do not
share the caller's interpreter lock, so a benchmark or a multi-process test times the client's
work only. ``ServerProcess`` starts it (spawned) and stops it; ``base_url`` and ``request_count``
read the child's state."""

from __future__ import annotations

import multiprocessing
from types import TracebackType
from typing import Any


def _serve(ready: Any, stop: Any, counts: Any, options: dict[str, Any]) -> None:
    from tests.fakes.openai_server import FakeOpenAIServer, fixed_label, keyword_responder
    from triage.classifiers.taxonomy import Taxonomy

    label = options.pop("label", None)
    responder = keyword_responder(Taxonomy.load()) if options.pop("keyword", False) else None
    with FakeOpenAIServer(responder=fixed_label(label) if label else responder, **options) as server:
        ready.put(server.base_url)
        while not stop.wait(0.05):
            counts[0], counts[1] = server.request_count, server.rate_limited
        counts[0], counts[1] = server.request_count, server.rate_limited


class ServerProcess:
    """``FakeOpenAIServer(**options)`` in a spawned process; ``keyword=True`` answers as the
    keyword classifier would (:func:`~tests.fakes.openai_server.keyword_responder`), ``label=…``
    always that label."""

    def __init__(self, **options: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready, self._stop, self._counts = context.Queue(), context.Event(), context.Array("q", 2)
        self._process = context.Process(target=_serve, args=(self._ready, self._stop, self._counts, options))
        self.base_url = ""

    @property
    def request_count(self) -> int:
        """Requests served so far (refreshed every 50 ms, exact once stopped)."""
        return int(self._counts[0])

    @property
    def rate_limited(self) -> int:
        """429s answered above ``requests_per_second`` (refreshed as ``request_count``)."""
        return int(self._counts[1])

    def __enter__(self) -> ServerProcess:
        self._process.start()
        self.base_url = self._ready.get(timeout=60)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._process.join(timeout=30)
