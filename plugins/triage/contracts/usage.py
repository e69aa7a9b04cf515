"""Bounds of what a classifier reports about its own call: tokens, cost and latency.

A model's usage block is not trusted. One figure its column cannot hold (2^31 tokens or more in
an ``integer``, a cost of 10^6 or more in ``numeric(12, 6)``), a negative one, or one that is
not a finite number would fail the INSERT of the whole batch of outcomes it is recorded with,
and the batch's retry would pay the model again for every one of them. Such a figure is
recorded as NULL and its name kept in ``classifications.usage_discarded``; the outcome stands.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, Final

MAX_TOKENS: Final = 2**31 - 1
"""The largest ``integer``."""
MAX_COST_USD: Final = 999_999.999_999
"""The largest ``numeric(12, 6)``."""


def non_negative(value: object) -> float | None:
    """A finite, non-negative real number, or None (booleans and strings are not numbers)."""
    if type(value) is float:  # the usual figure (a latency), checked once per classification
        return value if 0.0 <= value < math.inf else None  # NaN fails both comparisons
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) and number >= 0 else None


def tokens(value: object) -> int | None:
    """A token count the column holds: a whole number in [0, 2^31)."""
    number = non_negative(value)
    if number is None or number != int(number) or number > MAX_TOKENS:
        return None
    return int(value) if isinstance(value, int) else int(number)


def cost_usd(value: object) -> float | None:
    """A cost the column holds: in [0, 10^6)."""
    number = non_negative(value)
    return number if number is not None and number <= MAX_COST_USD else None


def latency_ms(value: object) -> float | None:
    """A latency: finite and non-negative."""
    return non_negative(value)


BOUNDS = {"prompt_tokens": tokens, "completion_tokens": tokens, "cost_usd": cost_usd, "latency_ms": latency_ms}


def bounded(**figures: object) -> tuple[dict[str, float | int | None], tuple[str, ...]]:
    """Each figure (named as in :data:`BOUNDS`) within its bounds or None, and the names of
    those that were given but out of bounds."""
    kept: dict[str, float | int | None] = {}
    discarded: tuple[str, ...] = ()
    for name, value in figures.items():
        if value is None:  # not reported: nothing to bound (most figures of most calls)
            kept[name] = None
            continue
        kept[name] = figure = BOUNDS[name](value)
        if figure is None:
            discarded += (name,)
    return kept, discarded


def model_usage(
    usage: Any, price_per_1k_prompt: float | None, price_per_1k_completion: float | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``prompt_tokens``, ``completion_tokens`` and ``cost_usd`` within the columns' bounds
    (:mod:`triage.contracts.usage`), and the names of the figures left out because they were not."""
    if usage is None:
        return {"prompt_tokens": None, "completion_tokens": None, "cost_usd": None}, ()
    if not isinstance(usage, dict):
        return {"prompt_tokens": None, "completion_tokens": None, "cost_usd": None}, ("usage",)
    figures, discarded = bounded(
        prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens")
    )
    prompt, completion = figures["prompt_tokens"], figures["completion_tokens"]
    cost: object = None
    if (price_per_1k_prompt is not None or price_per_1k_completion is not None) and (
        prompt is not None or completion is not None
    ):
        # Prices come from the connection's extra: one that is not a number spoils the cost only.
        prices = [non_negative(p) if p is not None else 0.0 for p in (price_per_1k_prompt, price_per_1k_completion)]
        if None not in prices:
            cost = (prompt or 0) / 1000.0 * (prices[0] or 0.0) + (completion or 0) / 1000.0 * (prices[1] or 0.0)
        else:
            cost = float("nan")  # named below as discarded
    priced, over = bounded(cost_usd=cost)
    return {**figures, **priced}, discarded + over
