"""The classify step's circuit breaker: when transient failures dominate the recent calls, it
opens, and stays open for the run (no database: the breaker is pure bookkeeping)."""

from __future__ import annotations

import pytest

from triage.pipeline.breaker import CircuitBreaker


def feed(breaker: CircuitBreaker, calls: str) -> list[bool]:
    """Record ``calls`` ("F" a transient failure, "." a call that was not); the state after each."""
    states = []
    for call in calls:
        breaker.record(call == "F")
        states.append(breaker.is_open)
    return states


def test_a_new_breaker_is_closed() -> None:
    assert CircuitBreaker().is_open is False


def test_it_waits_for_min_calls_before_judging() -> None:
    breaker = CircuitBreaker(window=50, threshold=0.5, min_calls=20)
    states = feed(breaker, "F" * 20)
    assert states[:19] == [False] * 19, "19 failures are too few calls to judge a dependency"
    assert states[19] is True


@pytest.mark.parametrize(
    ("calls", "is_open"),
    [
        pytest.param("F" * 10 + "." * 10, True, id="exactly-the-threshold-opens"),
        pytest.param("F" * 9 + "." * 11, False, id="just-below-stays-closed"),
        pytest.param("." * 19 + "F", False, id="one-failure-in-twenty"),
        pytest.param(".F" * 10, True, id="interleaved-half"),
    ],
)
def test_it_opens_when_transient_failures_reach_the_threshold(calls: str, is_open: bool) -> None:
    breaker = CircuitBreaker(window=50, threshold=0.5, min_calls=20)
    feed(breaker, calls)
    assert breaker.is_open is is_open


def test_only_the_last_window_calls_count() -> None:
    # Over all seven calls the failures are 4/7; over the last four, what counts, 3/4 then 4/4.
    breaker = CircuitBreaker(window=4, threshold=0.8, min_calls=4)
    assert feed(breaker, "...FFF") == [False] * 6, "3 of the last 4 is below 0.8"
    assert feed(breaker, "F") == [True], "4 of the last 4"


def test_successes_before_the_window_do_not_hold_it_closed() -> None:
    breaker = CircuitBreaker(window=10, threshold=0.5, min_calls=10)
    feed(breaker, "." * 100)
    assert feed(breaker, "F" * 5) == [False, False, False, False, True], "5 of the last 10 failed"


def test_once_open_it_stays_open_for_the_run() -> None:
    breaker = CircuitBreaker(window=10, threshold=0.5, min_calls=10)
    feed(breaker, "F" * 10)
    assert feed(breaker, "." * 30) == [True] * 30


def test_by_default_it_judges_twenty_calls_of_the_last_fifty_at_half() -> None:
    breaker = CircuitBreaker()
    assert feed(breaker, "F" * 20)[18:] == [False, True]
    breaker = CircuitBreaker()
    feed(breaker, "." * 50 + "F" * 24)
    assert breaker.is_open is False, "24 of the last 50"
    assert feed(breaker, "F") == [True], "25 of the last 50"
