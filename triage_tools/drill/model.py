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

The model is the one fake OpenAI-compatible server of the project
(:class:`~triage_tools.drill.openai_server.FakeOpenAIServer`, the tests' too), whose responder
is the state above.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from enum import StrEnum
from typing import Any

from triage_tools.drill.openai_server import FakeOpenAIServer, Reply


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
        self._label, self._retry_after_s, self._hang_limit_s = label, retry_after_s, hang_limit_s
        self._server = FakeOpenAIServer(responder=self._answer)

    def _answer(self, body: dict[str, Any]) -> Reply:
        """The reply of the state a call finds, or, while hanging, of the state that ends the hang."""
        with self._changed:
            self.calls[self.state] += 1
            self._changed.wait_for(lambda: self.state != ModelState.HANGING, timeout=self._hang_limit_s)
            state = self.state
        if state == ModelState.UP:
            return Reply.ok(self._label, 0.95, prompt_tokens=100, completion_tokens=10)
        return Reply.status_only(503, retry_after=str(self._retry_after_s))

    def set(self, state: ModelState) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()

    @property
    def url(self) -> str:
        """The API root, as the ``triage_llm`` connection's host takes it."""
        return self._server.base_url

    def connection(self) -> str:
        """The ``triage_llm`` connection (``AIRFLOW_CONN_TRIAGE_LLM``): a call's timeout longer
        than the drill needs to kill the try that hangs on it."""
        return json.dumps({"conn_type": "http", "host": self.url, "extra": {"model": "chaos-model", "timeout": 60}})

    def __enter__(self) -> FakeModel:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.set(ModelState.UP)  # release every call still held
        self._server.stop()
