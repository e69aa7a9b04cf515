"""A model connection's shared requests/tokens-per-minute budget, one row of
``triage.model_budgets`` (migration 0017), as named SQLAlchemy Core statements: a generic cell
rate algorithm (GCRA) for requests and one for tokens. How a worker uses them (blocks of slots,
its threads, its patience) is :class:`triage.classifiers.budgets.ModelBudget`'s; the store's
budget part (:mod:`triage.jobs.store.budgets`) runs these.

``request_tat`` is when the request budget would be full again if no call came ("theoretical
arrival time"); a call of ``n`` requests moves it on by ``n × 60 / requests_per_minute`` seconds,
and may start as soon as it is at most ``burst_seconds`` ahead of now. Tokens likewise. Waits are
computed by the database's clock only: hosts' clocks never meet.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import model_budgets as b

NOW = sa.func.clock_timestamp()  # not now(): a statement may wait for the row lock
SECOND: Any = sa.literal_column("interval '1 second'")


def _seconds(value: Any) -> Any:
    return value * SECOND


def _step(per_minute: Any, amount: Any) -> Any:
    return _seconds(sa.cast(amount, sa.Float) * 60.0 / per_minute)


def _next(tat: Any, per_minute: Any, amount: Any) -> Any:
    """The budget's ``tat`` once a call of ``amount`` took its slot (unchanged when not set)."""
    base = sa.func.greatest(tat, NOW, b.c.blocked_until + _seconds(b.c.burst_seconds))
    return sa.case((per_minute.is_(None), tat), else_=base + _step(per_minute, amount))


def _start(next_tat: Any, per_minute: Any, amount: Any) -> Any:
    """When the call whose slot ended at ``next_tat`` may start (NULL: the budget is not set)."""
    start = next_tat - _step(per_minute, amount) - _seconds(b.c.burst_seconds)
    return sa.case((per_minute.is_(None), None), else_=start)


def _params() -> tuple[Any, Any]:
    return sa.bindparam("requests", type_=sa.Float), sa.bindparam("tokens", type_=sa.Float)


@cache
def take_statement() -> Any:
    """Reserve a call's slot if it starts within ``:patience`` seconds; returns ``wait`` (seconds
    from now, may be below 0: go). No row: not within patience (:func:`wait_statement` says how
    long). The condition and the new values are computed on the latest row (a concurrent taker
    holds its lock until it commits); the wait is read back from the new row, not a snapshot."""
    requests, tokens = _params()
    r, t = b.c.requests_per_minute, b.c.tokens_per_minute
    next_request, next_token = _next(b.c.request_tat, r, requests), _next(b.c.token_tat, t, tokens)
    before = sa.func.greatest(_start(next_request, r, requests), _start(next_token, t, tokens), b.c.blocked_until)
    after = sa.func.greatest(_start(b.c.request_tat, r, requests), _start(b.c.token_tat, t, tokens), b.c.blocked_until)
    patience = _seconds(sa.bindparam("patience", type_=sa.Float))
    return (
        sa.update(b)
        .where(b.c.name == sa.bindparam("budget"), before <= NOW + patience)
        .values(request_tat=next_request, token_tat=next_token, updated_at=NOW)
        .returning(sa.extract("epoch", after - NOW).label("wait"))
    )


@cache
def wait_statement() -> Any:
    """How long until a call of ``:requests``/``:tokens`` could start (seconds from now)."""
    requests, tokens = _params()
    r, t = b.c.requests_per_minute, b.c.tokens_per_minute
    start = sa.func.greatest(
        _start(_next(b.c.request_tat, r, requests), r, requests),
        _start(_next(b.c.token_tat, t, tokens), t, tokens),
        b.c.blocked_until,
    )
    return sa.select(sa.extract("epoch", start - NOW).label("wait")).where(b.c.name == sa.bindparam("budget"))


@cache
def configure_statement() -> Any:
    """Create the connection's row, or set its rates to this worker's configuration."""
    insert = pg.insert(b).values(
        name=sa.bindparam("budget"),
        requests_per_minute=sa.bindparam("rpm", type_=sa.Float),
        tokens_per_minute=sa.bindparam("tpm", type_=sa.Float),
        burst_seconds=sa.bindparam("burst", type_=sa.Float),
    )
    rates = ("requests_per_minute", "tokens_per_minute", "burst_seconds")
    return insert.on_conflict_do_update(
        index_elements=[b.c.name],
        set_={**{r: insert.excluded[r] for r in rates}, "updated_at": NOW},
        where=sa.tuple_(*(b.c[r] for r in rates)).is_distinct_from(sa.tuple_(*(insert.excluded[r] for r in rates))),
    )


@cache
def block_statement() -> Any:
    """The provider asked to be left alone for ``:seconds``: every worker's next call waits."""
    return (
        sa.update(b)
        .where(b.c.name == sa.bindparam("budget"))
        .values(
            blocked_until=sa.func.greatest(b.c.blocked_until, NOW + _seconds(sa.bindparam("seconds", type_=sa.Float))),
            rate_limited=b.c.rate_limited + sa.bindparam("counted", type_=sa.BigInteger),
            updated_at=NOW,
        )
    )
