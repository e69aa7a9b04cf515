"""The drill's waits for Airflow's runs (:mod:`triage_tools.drill.runs`) end: at the drill's
deadline, or at once when Airflow is lost, with an error naming the runs they waited for (a
drill that waited forever on a run someone else had cleared hung ``make test`` in session 6)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from triage_tools.drill.runs import RunWatcher


@dataclass
class Api:
    """Airflow's REST API as the waits read it: ``run_id -> (state, end_date)``."""

    runs: dict[str, tuple[str, str]]
    asked: list[str] = field(default_factory=list)

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.asked.append(path)
        if path.endswith("/dagRuns"):
            rows = [
                {"dag_run_id": r, "state": s, "data_interval_start": "2026-09-30T00:00:00Z"}
                for r, (s, _) in self.runs.items()
            ]
            return {"dag_runs": rows}
        state, end = self.runs[path.rsplit("/", 1)[1]]
        return {"state": state, "end_date": end}


@dataclass
class Faults:
    airflow_lost: bool = False


def watcher(runs: dict[str, tuple[str, str]], *, deadline_in: float = 60.0, lost: bool = False) -> RunWatcher:
    w = RunWatcher()
    w.api, w.deadline, w.faults = Api(runs), time.monotonic() + deadline_in, Faults(lost)
    return w


def test_finished_runs_are_returned_with_their_states() -> None:
    w = watcher({"a": ("success", "t1"), "b": ("failed", "t2")})
    assert w.wait_runs() == {"a": "success", "b": "failed"}
    assert w.wait_runs(["b"]) == {"b": "failed"}


def test_a_run_still_running_at_the_deadline_is_named() -> None:
    w = watcher({"a": ("success", "t1"), "chaos_outage__x": ("running", "")}, deadline_in=-1.0)
    with pytest.raises(TimeoutError, match=r"unfinished at the drill's deadline.*chaos_outage__x.*running"):
        w.wait_runs()


def test_a_lost_airflow_ends_the_wait_at_once() -> None:
    w = watcher({"a": ("queued", "")}, lost=True)
    with pytest.raises(RuntimeError, match=r"Airflow could not be started again.*\"a\": \"queued\""):
        w.wait_runs(["a"])


def test_a_cleared_run_counts_as_finished_again_only_with_a_new_end() -> None:
    w = watcher({"r": ("failed", "t2")})
    assert w.wait_rerun("r", ("failed", "t1")) == "failed"
    stale = watcher({"r": ("failed", "t1")}, deadline_in=-1.0)
    with pytest.raises(
        TimeoutError, match=r"run r, cleared when it was failed, is still failed at the drill's deadline"
    ):
        stale.wait_rerun("r", ("failed", "t1"))
