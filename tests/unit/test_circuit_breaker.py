"""The classify step's circuit breaker: when transient failures dominate the recent calls, it
opens, and stays open for the run (no database: the breaker is pure bookkeeping)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@given(
    calls=st.text(alphabet="F.", max_size=120),
    window=st.integers(1, 30),
    min_calls=st.integers(1, 30),
    threshold=st.sampled_from([0.1, 0.3, 0.5, 0.8, 1.0]),
)
def test_the_window_rule_judges_the_sum_of_the_last_window_calls(
    calls: str, window: int, min_calls: int, threshold: float
) -> None:
    """The breaker keeps a running count of the window's failures (a sum of the window at each
    call cost ~0.4 µs a job): it opens exactly when the sum of the last ``window`` calls would."""
    states, opened = [], False
    for n in range(1, len(calls) + 1):
        last = calls[max(0, n - window) : n]
        opened = opened or (len(last) >= min_calls and last.count("F") / len(last) >= threshold)
        states.append(opened)
    assert feed(CircuitBreaker(window=window, threshold=threshold, min_calls=min_calls), calls) == states


def test_by_default_it_judges_twenty_calls_of_the_last_fifty_at_half() -> None:
    breaker = CircuitBreaker()
    assert feed(breaker, "F" * 20)[18:] == [False, True]
    breaker = CircuitBreaker()
    feed(breaker, "." * 50 + "F" * 24)
    assert breaker.is_open is False, "24 of the last 50"
    assert feed(breaker, "F") == [True], "25 of the last 50"


# -- the all-down rule: a try of fewer jobs than min_calls --------------------------------------


def down(breaker: CircuitBreaker, calls: str) -> list[bool]:
    """Record ``calls``: a digit, a dependency-class failure (5xx, timeout, refused) of that job on
    its first attempt; "o", one of a job that had failed before; "r", a 429; ".", an answer."""
    states = []
    for call in calls:
        if call.isdigit():
            breaker.record(True, dependency_down=True, job=int(call))
        else:
            breaker.record(call != ".", dependency_down=call == "o", job=None)
        states.append(breaker.is_open)
    return states


@pytest.mark.parametrize(
    ("claimed", "calls", "states"),
    [
        pytest.param(5, "123", [False, False, True], id="five-claimed-three-distinct-jobs"),
        pytest.param(50, "123", [False, False, True], id="a-large-try-too"),
        pytest.param(2, "12", [False, True], id="two-claimed-both"),
        pytest.param(1, "1" * 19, [False] * 19, id="one-job-never-it-spends-its-attempts"),
        pytest.param(5, "1111122", [False] * 7, id="retries-of-one-job-count-once"),
        pytest.param(5, "o1o2oo3", [False] * 6 + [True], id="jobs-that-failed-before-prove-nothing"),
        pytest.param(5, ".123", [False] * 4, id="an-answer-first-ends-the-rule"),
        pytest.param(5, "1.23", [False] * 4, id="an-answer-between"),
        pytest.param(5, "1r23", [False] * 4, id="a-429-is-not-the-dependency-down"),
    ],
)
def test_every_call_failing_across_a_few_jobs_opens_it(claimed: int, calls: str, states: list[bool]) -> None:
    breaker = CircuitBreaker()  # window 50, min_calls 20: the window rule never judges these
    breaker.claimed(range(1, claimed + 1))
    assert down(breaker, calls) == states


def test_the_jobs_wanted_are_bounded_by_min_calls_min_jobs_and_the_claim() -> None:
    assert CircuitBreaker().jobs_needed() == 3, "none claimed yet: min_jobs"
    breaker = CircuitBreaker(min_calls=20, min_jobs=3)
    breaker.claimed([1, 2])
    assert breaker.jobs_needed() == 2
    breaker.claimed([1, 2, 3, 4])  # a job handed again is one job
    assert breaker.jobs_needed() == 3
    assert CircuitBreaker(min_calls=4, min_jobs=10).jobs_needed() == 4
    one = CircuitBreaker()
    one.claimed([1])
    assert one.jobs_needed() == 2, "one job is never enough"


def test_one_job_alone_still_opens_it_by_the_window_rule() -> None:
    breaker = CircuitBreaker(window=50, threshold=0.5, min_calls=20)
    breaker.claimed([1])
    assert down(breaker, "1" * 20)[18:] == [False, True]
