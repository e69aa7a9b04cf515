"""The failure drill's model (``triage_tools.drill.model``): the one fake OpenAI-compatible server
with the drill's states as its responder."""

from __future__ import annotations

import threading
import time

import httpx

from triage_tools.drill.model import FakeModel, ModelState

BODY = {"model": "chaos-model", "messages": [{"role": "user", "content": "hello"}]}


def call(model: FakeModel) -> httpx.Response:
    return httpx.post(f"{model.url}/chat/completions", json=BODY, timeout=30)


def test_down_answers_503_with_the_hint_and_up_answers_the_label() -> None:
    with FakeModel(label="billing", retry_after_s=3) as model:
        down = call(model)
        model.set(ModelState.UP)
        up = call(model)
    assert (down.status_code, down.headers["retry-after"]) == (503, "3")
    assert up.status_code == 200
    assert '"label": "billing"' in up.json()["choices"][0]["message"]["content"]
    assert dict(model.calls) == {"down": 1, "up": 1}


def test_a_hanging_call_is_held_until_the_state_changes_and_answered_by_the_new_one() -> None:
    answers: list[int] = []
    with FakeModel(label="billing") as model:
        model.set(ModelState.HANGING)
        caller = threading.Thread(target=lambda: answers.append(call(model).status_code))
        caller.start()
        deadline = time.monotonic() + 10
        while model.calls["hanging"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert answers == []  # held
        model.set(ModelState.UP)
        caller.join(timeout=10)
    assert answers == [200]
