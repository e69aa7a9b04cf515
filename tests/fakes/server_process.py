"""The fake OpenAI-compatible server in a process of its own, as a provider is: its threads do not
share the caller's interpreter lock, so a benchmark or a multi-process test times the client's
work only. ``ServerProcess`` starts it (spawned) and stops it; ``base_url`` and ``request_count``
read the child's state."""

from __future__ import annotations

import multiprocessing
from types import TracebackType
from typing import Any


def _serve(ready: Any, stop: Any, count: Any, options: dict[str, Any]) -> None:
    from tests.fakes.openai_server import FakeOpenAIServer, keyword_responder
    from triage.classifiers.taxonomy import Taxonomy

    responder = keyword_responder(Taxonomy.load()) if options.pop("keyword", False) else None
    with FakeOpenAIServer(responder=responder, **options) as server:
        ready.put(server.base_url)
        while not stop.wait(0.05):
            count.value = server.request_count
        count.value = server.request_count


class ServerProcess:
    """``FakeOpenAIServer(**options)`` in a spawned process; ``keyword=True`` answers as the
    keyword classifier would (:func:`~tests.fakes.openai_server.keyword_responder`)."""

    def __init__(self, **options: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready, self._stop, self._count = context.Queue(), context.Event(), context.Value("q", 0)
        self._process = context.Process(target=_serve, args=(self._ready, self._stop, self._count, options))
        self.base_url = ""

    @property
    def request_count(self) -> int:
        """Requests served so far (refreshed every 50 ms, exact once stopped)."""
        return int(self._count.value)

    def __enter__(self) -> ServerProcess:
        self._process.start()
        self.base_url = self._ready.get(timeout=60)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._process.join(timeout=30)
