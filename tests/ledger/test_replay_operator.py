"""The ``review_jobs`` operator's decision ``replay`` (seam subclass over a real PostgreSQL, no
Airflow run): a dry run by default, the triggering user as the actor, the form's hostile input
refused before anything is read."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests.ledger.test_replay_by_filter import DAY1, failed, rows, snapshot
from tests.ledger.test_review_operators import context, seamed
from triage.jobs.store import JobStore
from triage.operators.review import ReviewJobsOperator
from triage.review.config import ReviewRunConfig, param_schemas


def form(**params: Any) -> dict[str, Any]:
    """What the trigger form sends: every param, defaults for those left alone."""
    defaults = {name: schema.get("default") for name, schema in param_schemas([]).items()}
    return {**defaults, "decision": "replay", **params}


def test_the_form_has_the_filter_fields_and_a_dry_run_by_default() -> None:
    schemas = param_schemas(["billing"])
    assert {"reason", "error_class", "states", "source", "batch_key", "since", "until", "limit", "dry_run"} <= set(
        schemas
    )
    assert schemas["dry_run"]["default"] is True
    assert schemas["states"]["items"]["enum"] == ["manual_review", "terminal_failed"]
    assert schemas["since"]["format"] == "date-time"
    assert schemas["limit"]["maximum"] == 10_000
    assert "replay" in schemas["decision"]["enum"]
    assert list(schemas)[:2] == ["job_ids", "decision"]  # the decision first, the filter after it


def test_a_dry_run_logs_and_returns_the_preview_and_changes_nothing(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    ids = failed(store, 3)
    before = snapshot(store)
    with caplog.at_level("INFO"):
        out = seamed(ReviewJobsOperator, store.engine).execute(context(form(reason="retries_exhausted")))
    assert snapshot(store) == before
    assert (out["outcome"], out["matching"], out["would_replay"]) == ("dry_run", 3, 3)
    assert {j["job_id"] for j in out["jobs"]} == {str(i) for i in ids}
    assert "dry run" in caplog.text
    assert str(ids[0]) in caplog.text


def test_an_apply_is_recorded_as_the_triggering_user_and_a_second_one_changes_nothing(store: JobStore) -> None:
    ids = failed(store, 2, terminal=True)
    params = form(
        reason="retries_exhausted", batch_key=DAY1, states=["terminal_failed"], dry_run=False, note="provider fixed"
    )
    out = seamed(ReviewJobsOperator, store.engine).execute(context(params, user="alice"))
    assert (out["outcome"], out["replayed"], set(out["job_ids"])) == ("applied", 2, {str(i) for i in ids})
    actors = rows(
        store, "SELECT DISTINCT actor, from_status::text FROM triage.job_events WHERE reason LIKE 'replayed:%'"
    )
    assert actors == [("alice", "terminal_failed")]
    before = snapshot(store)
    again = seamed(ReviewJobsOperator, store.engine).execute(context(params, user="bob"))
    assert (again["outcome"], again["replayed"], again["request"]["requested_by"]) == ("already_applied", 0, "alice")
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({}, "name at least one of", id="no-filter"),
        pytest.param({"reason": "x", "dry_run": False}, "needs a note", id="apply-without-note"),
        pytest.param({"reason": "x", "job_ids": [str(uuid.uuid4())]}, "leave job ids empty", id="ids-and-filter"),
        pytest.param({"reason": "x", "limit": 10_001}, "limit", id="over-the-bound"),
        pytest.param({"reason": "x", "states": ["completed"]}, "states", id="not-replayable"),
        pytest.param({"source": "a\u202eb"}, "source", id="bidi"),
        pytest.param({"reason": "x", "until": "2026-11-01", "since": "2026-11-02"}, "before until", id="backwards"),
        pytest.param({"reason": "x", "since": "yesterday"}, "since", id="since-not-a-date"),
        pytest.param(
            {"decision": "reject", "job_ids": [str(uuid.uuid4())], "reason": "x"}, "replay' only", id="filter-on-reject"
        ),
    ],
)
def test_hostile_form_input_fails_the_run_before_anything_changes(
    store: JobStore, params: dict[str, Any], message: str
) -> None:
    failed(store, 1)
    before = snapshot(store)
    with pytest.raises(AirflowFailException, match=message):
        seamed(ReviewJobsOperator, store.engine).execute(context(form(**params)))
    assert snapshot(store) == before


def test_the_config_builds_the_same_filter_as_the_command_line() -> None:
    config = ReviewRunConfig.from_params(form(reason="x", note="n", dry_run=False))
    assert config.replay_filter().replay_key() == config.replay_filter().replay_key()
    assert config.replay_filter().note == "n"
