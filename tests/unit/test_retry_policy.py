"""The retry policy of retryable failures: bounded exponential backoff with equal jitter.

Pure arithmetic over a random draw: the draw is the collaborator, replaced by a mock that returns
the extremes of its range (or by a seeded generator for the spread), never the policy itself.
"""

from __future__ import annotations

import random

import pytest
from pytest_mock import MockerFixture

from triage.jobs.vocabulary.backoff import RetryPolicy

POLICY = RetryPolicy(base_seconds=2.0, cap_seconds=300.0, multiplier=2.0)


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [
        pytest.param(1, 2.0, id="first-failure-waits-at-most-base"),
        pytest.param(2, 4.0, id="doubles"),
        pytest.param(3, 8.0, id="doubles-again"),
        pytest.param(8, 256.0, id="last-below-cap"),
        pytest.param(9, 300.0, id="capped"),
        pytest.param(50, 300.0, id="stays-capped"),
        pytest.param(10_000, 300.0, id="huge-attempt-capped-without-overflow"),
        pytest.param(0, 2.0, id="attempt-0-as-first"),
        pytest.param(-3, 2.0, id="negative-as-first"),
    ],
)
def test_ceiling_grows_exponentially_up_to_the_cap(attempt: int, ceiling: float) -> None:
    assert POLICY.ceiling(attempt) == ceiling


def test_ceiling_follows_base_and_multiplier() -> None:
    policy = RetryPolicy(base_seconds=5.0, cap_seconds=1000.0, multiplier=3.0)
    assert [policy.ceiling(n) for n in range(1, 7)] == [5.0, 15.0, 45.0, 135.0, 405.0, 1000.0]


@pytest.mark.parametrize("attempt", [1, 2, 5, 9, 10_000])
def test_delay_is_half_the_ceiling_plus_a_draw_from_the_other_half(mocker: MockerFixture, attempt: int) -> None:
    rng = mocker.Mock(spec=random.Random)
    ceiling = POLICY.ceiling(attempt)

    rng.uniform.return_value = 0.0  # the draw's low end: the guaranteed half
    assert POLICY.delay(attempt, rng) == ceiling / 2
    rng.uniform.assert_called_once_with(0, ceiling / 2)

    rng.uniform.return_value = ceiling / 2  # its high end: the ceiling, never more
    assert POLICY.delay(attempt, rng) == ceiling


def test_delay_without_a_generator_draws_from_the_random_module(mocker: MockerFixture) -> None:
    uniform = mocker.patch("triage.jobs.vocabulary.backoff.random.uniform", return_value=0.25)
    assert POLICY.delay(3) == 4.0 + 0.25
    uniform.assert_called_once_with(0, 4.0)


@pytest.mark.parametrize("attempt", [1, 3, 6, 9, 40])
def test_seeded_delays_stay_within_the_bounds_and_spread_over_them(attempt: int) -> None:
    rng = random.Random(20261105)
    ceiling = POLICY.ceiling(attempt)
    delays = [POLICY.delay(attempt, rng) for _ in range(2000)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    # Jitter, not a constant: a batch that failed together comes back spread over the whole half.
    assert min(delays) < ceiling / 2 + ceiling / 20
    assert max(delays) > ceiling - ceiling / 20


def test_seeded_delays_grow_with_the_attempt_until_the_cap() -> None:
    rng = random.Random(7)
    means = [sum(POLICY.delay(n, rng) for _ in range(500)) / 500 for n in range(1, 13)]
    # Equal jitter averages three quarters of the ceiling: 1.5, 3, 6, ... 192, then 225 for ever.
    expected = [0.75 * min(300.0, 2.0 * 2.0 ** (n - 1)) for n in range(1, 13)]
    assert means == pytest.approx(expected, rel=0.05)
    assert means[:9] == sorted(means[:9])


def test_a_seed_reproduces_the_delays() -> None:
    first = [POLICY.delay(n, random.Random(3)) for n in range(1, 10)]
    again = [POLICY.delay(n, random.Random(3)) for n in range(1, 10)]
    assert first == again


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"base_seconds": -1.0}, id="negative-base"),
        pytest.param({"base_seconds": 10.0, "cap_seconds": 5.0}, id="cap-below-base"),
        pytest.param({"multiplier": 0.5}, id="shrinking"),
    ],
)
def test_an_invalid_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid retry policy"):
        RetryPolicy(**kwargs)
