"""What a task's context names for the ledger: the bound of a run's moves in time."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from triage.adapters.task_context import CLOCK_SLACK, run_began_after


def test_a_runs_moves_are_bounded_by_its_run_after_less_the_clock_slack() -> None:
    run_after = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    context = cast("Any", {"dag_run": SimpleNamespace(run_after=run_after)})
    assert run_began_after(context) == run_after - CLOCK_SLACK
    assert CLOCK_SLACK.total_seconds() >= 60  # clocks of separate hosts drift by seconds, not by a minute


def test_without_a_run_the_read_is_unbounded() -> None:
    assert run_began_after(cast("Any", {})) is None
    assert run_began_after(cast("Any", {"dag_run": SimpleNamespace()})) is None
