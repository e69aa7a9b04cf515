"""The Quality section of the reconciliation report on a known small ledger (issue #27, item 5)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClaimedJob, ClassificationRecord, Complete, LabelWrite, Outcome, SendToReview
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.quality import figures, wilson_interval
from triage.reconciliation.runner import reconcile

NAMES = frozenset({"billing", "shipping", "refund_request"})
TODAY = datetime.now(UTC).date().isoformat()


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        pytest.param(9, 10, (0.5958, 0.9821), id="9-of-10"),
        pytest.param(4, 5, (0.3755, 0.9638), id="4-of-5"),
        pytest.param(0, 10, (0.0, 0.2775), id="none"),
        pytest.param(10, 10, (0.7225, 1.0), id="all"),
        pytest.param(95, 100, (0.8882, 0.9785), id="95-of-100"),
    ],
)
def test_the_wilson_interval_matches_the_textbook(successes: int, n: int, expected: tuple[float, float]) -> None:
    """Values as published for the Wilson score interval at 95 % (e.g. Newcombe 1998, method 3)."""
    interval = wilson_interval(successes, n)
    assert interval is not None
    assert interval == pytest.approx(expected, abs=1e-4)


def test_no_decision_no_interval() -> None:
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError, match="within"):
        wilson_interval(3, 2)


def classify(store: JobStore, version: str, n: int, accepted: int, audited: int, prefix: str) -> tuple[ClaimedJob, ...]:
    """``n`` jobs of ``version``: ``accepted`` auto-accepted (the first ``audited`` of them audit
    samples), the rest inconclusive with the model proposing ``shipping``. The claimed jobs."""
    store.register(new_jobs(n, prefix=prefix, version=version), batch_key="q", step="classify", max_attempts=3)
    claim = store.claim(
        batch_key="q", step="classify", limit=n, lease_seconds=60, owner="w", classifier_version=version
    )
    outcomes: list[Outcome] = []
    for i, job in enumerate(claim.jobs):
        if i < accepted:
            record = ClassificationRecord("shipping", 0.95, "accepted", version)
            label = LabelWrite("shipping", 0.95, version)
            outcomes.append(Complete(job.id, job.attempt, label, record, audit=i < audited))
        else:
            record = ClassificationRecord("shipping", 0.4, "inconclusive", version)
            outcomes.append(
                SendToReview(job.id, job.attempt, "inconclusive", classification=record, context={"label": "shipping"})
            )
    store.record(claim, outcomes)
    return claim.jobs


def known_ledger(store: JobStore) -> None:
    """kw-1: 10 classified, 8 accepted, 5 audited (4 confirmed, 1 corrected), 2 inconclusive
    labelled (1 with the model's proposal); kw-2: 4 classified, all accepted, 1 audit open."""
    jobs = classify(store, "kw-1", 10, accepted=8, audited=5, prefix="a")
    decide = store.review.resolve_with_label
    for job in jobs[:4]:
        decide(job.id, "shipping", actor="alice", taxonomy_names=NAMES)  # confirmed
    decide(jobs[4].id, "billing", actor="bob", note="an invoice", taxonomy_names=NAMES)  # corrected
    decide(jobs[8].id, "shipping", actor="bob", taxonomy_names=NAMES)  # the model's proposal
    decide(jobs[9].id, "refund_request", actor="alice", taxonomy_names=NAMES)  # another label
    classify(store, "kw-2", 4, accepted=4, audited=1, prefix="b")


def test_the_figures_of_a_known_ledger(store: JobStore) -> None:
    known_ledger(store)
    with store.reading() as conn:
        quality = figures(conn)
    kw1, kw2 = quality["by_version"]
    assert (kw1["version"], kw1["classified"], kw1["accepted"], kw1["coverage"]) == ("kw-1", 10, 8, 0.8)
    assert (kw1["confirmed"], kw1["corrected"], kw1["audited"], kw1["precision"]) == (4, 1, 5, 0.8)
    assert (kw1["precision_low"], kw1["precision_high"]) == pytest.approx((0.3755, 0.9638), abs=1e-4)
    assert (kw1["inconclusive_labelled"], kw1["inconclusive_agreed"], kw1["inconclusive_agreement"]) == (2, 1, 0.5)
    assert kw1["audit_open"] == 0
    assert (kw2["version"], kw2["coverage"], kw2["audited"], kw2["precision"], kw2["audit_open"]) == (
        "kw-2",
        1.0,
        0,
        None,
        1,
    )
    assert (kw2["precision_low"], kw2["inconclusive_agreement"]) == (None, None)
    totals = quality["totals"]
    assert (totals["classified"], totals["accepted"], totals["coverage"]) == (14, 12, round(12 / 14, 4))
    assert (totals["precision"], totals["audit_open"]) == (0.8, 1)
    assert [(r["version"], r["day"], r["classified"]) for r in quality["by_version_day"]] == [
        ("kw-1", TODAY, 10),
        ("kw-2", TODAY, 4),
    ]
    # 7 decisions by 2 reviewers, every one on a model's proposal: 5 agreed (4 confirmed, 1 label).
    assert quality["reviewers_by_day"] == [
        {
            "day": TODAY,
            "decisions": 7,
            "reviewers": 2,
            "decisions_per_reviewer": 3.5,
            "with_proposal": 7,
            "agreed": 5,
            "agreement": round(5 / 7, 4),
        }
    ]
    assert quality["trend"] == []


def test_the_report_shows_the_quality_section_and_its_trend_over_runs(store: JobStore, tmp_path: Path) -> None:
    known_ledger(store)
    first = reconcile(store, ReconcileParams(grace_seconds=0), publish=lambda events: None, reports_dir=tmp_path)
    second = reconcile(store, ReconcileParams(grace_seconds=0), publish=lambda events: None, reports_dir=tmp_path)
    quality = second.summary["quality"]
    assert quality["totals"]["precision"] == 0.8
    assert [(p["run_id"], p["coverage"], p["precision"]) for p in quality["trend"]] == [
        (first.run_id, round(12 / 14, 4), 0.8)
    ]
    assert "## Quality (last 14 days)" in second.markdown
    assert "| kw-1 | 10 | 80.0 % | 80.0 % (37.6-96.4 %, n=5) | 0 | 50.0 % of 2 |" in second.markdown
    assert second.html_path is not None
    page = second.html_path.read_text()
    assert "<title>Quality over runs (%)</title>" in page
    assert "<title>Coverage and audited precision per version (%)</title>" in page
    assert f"run {first.run_id} audited precision %: 80" in page  # the earlier run's point
    assert "80.0 % (37.6-96.4 %, n=5)" in page
