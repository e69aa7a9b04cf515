"""The bounds of a classifier's usage figures (triage.contracts.usage), its float fast path included."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from triage.contracts import usage


class Seconds(float):
    """A float subclass: takes the general path, with the same answer."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12.5, 12.5),
        (0.0, 0.0),
        (-0.0, 0.0),
        (-1.5, None),
        (math.inf, None),
        (-math.inf, None),
        (math.nan, None),
        (Seconds(2.0), 2.0),
        (Seconds(math.nan), None),
        (3, 3.0),
        (Decimal("1.25"), 1.25),
        (True, None),
        ("12", None),
        (10**400, None),
    ],
)
def test_non_negative(value: object, expected: float | None) -> None:
    assert usage.non_negative(value) == expected


def test_bounded_keeps_none_and_names_what_it_discards() -> None:
    kept, discarded = usage.bounded(latency_ms=math.nan, prompt_tokens=None, completion_tokens=7, cost_usd=2e6)
    assert kept == {"latency_ms": None, "prompt_tokens": None, "completion_tokens": 7, "cost_usd": None}
    assert discarded == ("latency_ms", "cost_usd")


def test_bounded_reported_nothing() -> None:
    assert usage.bounded(latency_ms=None, cost_usd=None) == ({"latency_ms": None, "cost_usd": None}, ())
