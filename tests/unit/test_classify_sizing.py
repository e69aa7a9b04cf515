"""How many ``classify`` instances a batch gets (issue #16, item 4): from its open jobs."""

from __future__ import annotations

import pytest

from triage.operators.sizing import classify_workers


@pytest.mark.parametrize(
    ("open_jobs", "per_worker", "most", "expected"),
    [
        pytest.param(0, 50_000, 4, 1, id="nothing-left-still-one"),
        pytest.param(10, 50_000, 4, 1, id="ten-documents-one"),
        pytest.param(50_000, 50_000, 4, 1, id="exactly-one-worker's-share"),
        pytest.param(50_001, 50_000, 4, 2, id="one-over-two"),
        pytest.param(100_000, 50_000, 4, 2, id="a-100k-keyword-day-two"),
        pytest.param(2_000_000, 50_000, 4, 4, id="a-2m-day-capped"),
        pytest.param(2_000_000, 50_000, 1, 1, id="capped-at-one"),
        pytest.param(9_000, 2_000, 8, 5, id="llm-share"),
    ],
)
def test_classify_workers_follow_the_work(open_jobs: int, per_worker: int, most: int, expected: int) -> None:
    assert classify_workers(open_jobs, jobs_per_worker=per_worker, max_workers=most) == list(range(expected))


@pytest.mark.parametrize(("per_worker", "most"), [pytest.param(0, 4, id="no-share"), pytest.param(1, 0, id="no-max")])
def test_classify_workers_refuse_nonsense_bounds(per_worker: int, most: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        classify_workers(10, jobs_per_worker=per_worker, max_workers=most)
