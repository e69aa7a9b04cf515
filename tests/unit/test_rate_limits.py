"""What the provider's rate-limit headers say, and the limiter's loop over a budget, without a
database or a server (the budget is a scripted stand-in; the real one and real HTTP are tested in
tests/ledger/test_model_budgets.py)."""

from __future__ import annotations

import httpx
import pytest

from triage.classifiers.base import TransientClassifierError
from triage.classifiers.rate_limits import BUDGET_EXHAUSTED, RateLimiter, provider_block, reset_seconds


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("1s", 1.0, id="seconds"),
        pytest.param("6m0s", 360.0, id="minutes"),
        pytest.param("20ms", 0.02, id="milliseconds"),
        pytest.param("1m30.5s", 90.5, id="compound"),
        pytest.param("2.5", 2.5, id="plain-number"),
        pytest.param("1h", 3600.0, id="hours"),
        pytest.param("", None, id="absent"),
        pytest.param("soon", None, id="unreadable"),
        pytest.param("5s later", None, id="trailing-text"),
    ],
)
def test_reset_seconds(value: str, seconds: float | None) -> None:
    assert reset_seconds(value) == (pytest.approx(seconds) if seconds is not None else None)


def response(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers={k.replace("_", "-"): v for k, v in headers.items()})


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        pytest.param(response(429, retry_after_ms="250", retry_after="3"), 0.25, id="429-retry-after-ms-first"),
        pytest.param(response(429, retry_after="3"), 3.0, id="429-retry-after"),
        pytest.param(
            response(
                429,
                x_ratelimit_remaining_requests="5",
                x_ratelimit_reset_requests="2s",
                x_ratelimit_remaining_tokens="0",
                x_ratelimit_reset_tokens="7s",
            ),
            7.0,
            id="429-the-exhausted-tokens-reset",
        ),
        pytest.param(response(429, x_ratelimit_reset_requests="4s"), 4.0, id="429-any-reset"),
        pytest.param(response(429), 1.0, id="429-nothing-said"),
        pytest.param(response(429, retry_after="0"), 0.05, id="429-zero-is-a-short-pause"),
        pytest.param(response(429, retry_after="86400"), 900.0, id="429-bounded"),
        pytest.param(response(200), None, id="200-nothing"),
        pytest.param(
            response(200, x_ratelimit_remaining_requests="3", x_ratelimit_reset_requests="1s"), None, id="200-room"
        ),
        pytest.param(
            response(
                200,
                x_ratelimit_limit_requests="3000",
                x_ratelimit_remaining_requests="0",
                x_ratelimit_reset_requests="20s",
            ),
            0.02,
            id="200-exhausted-until-one-more",
        ),
    ],
)
def test_provider_block(given: httpx.Response, seconds: float | None) -> None:
    assert provider_block(given) == (pytest.approx(seconds) if seconds is not None else None)


class ScriptedBudget:
    """Takes answer from a script; blocks are recorded."""

    def __init__(self, *takes: tuple[bool, float]) -> None:
        self.takes = list(takes)
        self.asked: list[tuple[float, float]] = []
        self.blocks: list[tuple[float, bool]] = []

    def take(self, tokens: float, patience: float) -> tuple[bool, float]:
        self.asked.append((tokens, patience))
        return self.takes.pop(0) if self.takes else (True, 0.0)

    def block(self, seconds: float, *, counted: bool = True) -> None:
        self.blocks.append((seconds, counted))


def test_a_429_blocks_the_budget_and_the_call_is_sent_again() -> None:
    budget, slept = ScriptedBudget((True, 0.0), (True, 0.5)), list[float]()
    answers = iter([response(429, retry_after="2"), response(200)])
    limiter = RateLimiter(budget, max_wait_seconds=10, sleep=slept.append)
    assert limiter.call(lambda: next(answers), 100).status_code == 200
    assert budget.blocks == [(2.0, True)]
    assert slept == [0.5]
    assert [patience for _, patience in budget.asked] == [10, 10]
    assert limiter.rate_limited == 1


def test_a_call_gives_up_when_its_waits_would_pass_its_patience() -> None:
    budget = ScriptedBudget((True, 4.0), (False, 30.0))
    limiter = RateLimiter(budget, max_wait_seconds=5, sleep=lambda _s: None)
    answers = iter([response(429)])
    with pytest.raises(TransientClassifierError) as raised:
        limiter.call(lambda: next(answers), 100)
    assert raised.value.error_class == BUDGET_EXHAUSTED
    assert raised.value.retry_after == 30.0
    assert budget.asked[1][1] == pytest.approx(1.0)  # what is left of its patience


def test_the_providers_token_count_corrects_the_next_take() -> None:
    budget = ScriptedBudget()
    limiter = RateLimiter(budget, sleep=lambda _s: None)
    limiter.call(lambda: response(200), 100)
    limiter.used(100, 160)
    limiter.call(lambda: response(200), 100)
    assert [tokens for tokens, _ in budget.asked] == [100, 160]


def test_an_exhausted_answer_blocks_without_counting_a_429() -> None:
    budget = ScriptedBudget()
    limiter = RateLimiter(budget, sleep=lambda _s: None)
    limiter.call(lambda: response(200, x_ratelimit_remaining_requests="0", x_ratelimit_reset_requests="300ms"), 1)
    assert budget.blocks == [(pytest.approx(0.3), False)]
