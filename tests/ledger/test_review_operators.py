"""The review run config, what a reviewer sees, and the review operators (seam subclasses over a
real PostgreSQL, no Airflow run)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tests.ledger.helpers import new_jobs
from tests.ledger.test_review_store import BATCH, rows, snapshot, to_review
from triage.classifiers.taxonomy import Taxonomy
from triage.jobs.store import JobStore
from triage.operators.review import (
    REPORT_KEY,
    ApplyReviewAnswerOperator,
    PickReviewCaseOperator,
    ReviewJobsOperator,
    reviewer,
)
from triage.review.cases import decision_of, describe, options
from triage.review.config import InvalidReviewConfig, ReviewRunConfig, form_label_names, param_schemas

TAXONOMY = frozenset({"billing", "shipping"})


# -- the run config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"decision": "label"}, "needs a label", id="label-without-label"),
        pytest.param({"decision": "reject", "label": "billing"}, "only for decision 'label'", id="label-on-reject"),
        pytest.param({"decision": "approve"}, "decision", id="unknown-decision"),
        pytest.param({"decision": "reject", "job_ids": []}, "needs job ids", id="no-jobs"),
        pytest.param({"decision": "reject", "max_replays": 0}, "max_replays", id="no-replays"),
    ],
)
def test_an_invalid_run_config_is_refused_with_a_message(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidReviewConfig, match=message):
        ReviewRunConfig.from_params({"job_ids": [str(uuid.uuid4())], **params})


def test_the_form_offers_the_taxonomy_labels() -> None:
    names = form_label_names()
    assert names == [label.name for label in Taxonomy.load().labels]
    assert param_schemas(names)["label"]["enum"] == [None, *names]
    assert "enum" not in param_schemas([])["label"]  # a taxonomy unreadable at parse: free text
    required = {n for n, s in param_schemas(names).items() if "default" not in s}
    assert required == {"decision"}  # job ids too, for every decision but replay (checked at run start)


def test_a_missing_taxonomy_never_breaks_parsing(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("TRIAGE_TAXONOMY", str(tmp_path / "absent.yaml"))
    assert form_label_names() == []


def test_every_option_is_a_whole_decision() -> None:
    opts = options(["billing", "shipping"])
    assert [decision_of(o) for o in opts] == [
        ("label", "billing"),
        ("label", "shipping"),
        ("requeue", None),
        ("reject", None),
    ]
    with pytest.raises(ValueError, match="not a review option"):
        decision_of("Approve")


def test_a_case_shows_ids_reason_and_model_answer_never_the_document(store: JobStore) -> None:
    (job_id,) = to_review(store)
    shown = describe(store.review.open_reviews()[0])
    assert shown["job_id"] == str(job_id)
    assert "inconclusive" in shown["subject"]
    for expected in (str(job_id), "`billing` (confidence 0.41", "file:///payloads/", BATCH):
        assert expected in shown["body"], expected


# -- the operators ------------------------------------------------------------------------------


class FakeTI:
    def __init__(self, xcoms: dict[str, Any] | None = None) -> None:
        self.pushed: dict[str, Any] = {}
        self.xcoms = xcoms or {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str) -> Any:
        return self.xcoms.get(task_ids)


def context(params: dict[str, Any], user: str | None = "alice", **xcoms: Any) -> Any:
    dag_run = SimpleNamespace(triggering_user_name=user, run_id="manual__2026-11-30")
    return {"params": params, "dag_run": dag_run, "ti": FakeTI(xcoms)}


def seamed(cls: type, engine: sa.Engine, **kwargs: Any) -> Any:
    """The operator with the test's database and taxonomy behind its seams."""

    class Seamed(cls):
        def get_engine(self) -> sa.Engine:
            return engine

        def taxonomy_names(self) -> frozenset[str]:
            return TAXONOMY

    return Seamed(task_id="t", **kwargs)


def test_the_reviewer_is_the_triggering_user_or_the_run() -> None:
    assert reviewer(context({}, user="alice")) == "alice"
    assert reviewer(context({}, user=None)) == "airflow:manual__2026-11-30"


def test_the_operator_applies_the_valid_jobs_then_fails_listing_the_refused(store: JobStore) -> None:
    good = to_review(store, 2)
    unknown, malformed = str(uuid.uuid4()), "not-a-uuid"
    ctx = context(
        {
            "job_ids": [str(good[0]), unknown, malformed, str(good[1]), str(good[0])],
            "decision": "reject",
            "label": None,
            "note": "spam",
            "max_replays": 3,
        }
    )
    with pytest.raises(AirflowFailException, match=r"2 of 4 jobs refused") as caught:
        seamed(ReviewJobsOperator, store.engine).execute(ctx)
    assert f"{unknown}: JobNotFound" in str(caught.value)
    assert "not-a-uuid: NotAJobId" in str(caught.value)
    assert rows(store, "SELECT status::text, count(*) FROM triage.jobs GROUP BY 1") == [("terminal_failed", 2)]
    report = ctx["ti"].pushed[REPORT_KEY]
    assert (report["applied"], report["already_applied"], report["refused"], report["reviewer"]) == (2, 0, 2, "alice")


def test_the_operator_reports_a_repeat_as_already_applied(store: JobStore) -> None:
    ids = [str(i) for i in to_review(store, 2)]
    params = {"job_ids": ids, "decision": "label", "label": "shipping", "note": None, "max_replays": 3}
    first = seamed(ReviewJobsOperator, store.engine).execute(context(params))
    before = snapshot(store)
    second = seamed(ReviewJobsOperator, store.engine).execute(context(params, user="bob"))
    assert (first["applied"], second["already_applied"]) == (2, 2)
    assert all("by alice" in j["detail"] for j in second["jobs"])  # the decision that stands
    assert snapshot(store) == before


def test_an_invalid_run_fails_before_touching_anything(store: JobStore) -> None:
    ids = [str(i) for i in to_review(store, 1)]
    before = snapshot(store)
    with pytest.raises(AirflowFailException, match="needs a label"):
        seamed(ReviewJobsOperator, store.engine).execute(context({"job_ids": ids, "decision": "label"}))
    with pytest.raises(AirflowFailException, match="'spam' is not in the taxonomy"):
        seamed(ReviewJobsOperator, store.engine).execute(
            context({"job_ids": ids, "decision": "label", "label": "spam"})
        )
    assert snapshot(store) == before


def test_the_answer_is_applied_as_the_user_who_answered(store: JobStore) -> None:
    (job_id,) = to_review(store)
    answer = {
        "chosen_options": ["Reject"],
        "params_input": {"note": "duplicate"},
        "responded_by_user": {"id": "7", "name": "erin"},
    }
    ctx = context({"job_id": None, "max_replays": 3}, user="Anonymous", pick={"job_id": str(job_id)}, ask=answer)
    result = seamed(ApplyReviewAnswerOperator, store.engine, case_task_id="pick", answer_task_id="ask").execute(ctx)
    assert result["applied"] == 1
    assert rows(store, "SELECT resolution, resolved_by, note FROM triage.manual_review") == [
        ("rejected", "erin", "duplicate")
    ]


def test_picking_a_case(store: JobStore) -> None:
    pick = seamed(PickReviewCaseOperator, store.engine)
    with pytest.raises(AirflowSkipException):
        pick.execute(context({"job_id": None}))
    first, second = to_review(store, 2)
    assert pick.execute(context({"job_id": None}))["job_id"] == str(first)
    assert pick.execute(context({"job_id": str(second)}))["job_id"] == str(second)
    queued = store.register(new_jobs(1, prefix="other"), batch_key=BATCH, step="classify", max_attempts=3).new_ids[0]
    with pytest.raises(AirflowFailException, match="is queued, not waiting for review"):
        pick.execute(context({"job_id": str(queued)}))
    with pytest.raises(AirflowFailException, match="does not exist"):
        pick.execute(context({"job_id": str(uuid.uuid4())}))
