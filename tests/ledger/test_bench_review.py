"""``make bench``'s review suite runs to its figure (it crashed once its baseline query lost a bind
parameter, and nothing but a full `make bench` would have said so)."""

from __future__ import annotations

import pytest

from bench import review_queue
from triage.database import DatabaseUrl


def test_review_page_figure_beside_the_whole_query(pg_server: DatabaseUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", pg_server.libpq())
    monkeypatch.setenv("BENCH_REVIEWS", str(2 * review_queue.BATCH_SIZE))  # both reasons, 50 rare
    monkeypatch.setattr(review_queue, "REPEATS", 1)

    figure = review_queue.bench_queue_page()

    assert figure.value > 0
    assert figure.baseline > 0
    assert figure.details["open_reviews"] == 2 * review_queue.BATCH_SIZE
    for variant in ("head", "deep", "reason", "rare source", "batch"):
        assert figure.details[variant]["queries"] == 1, variant
        assert figure.details[variant]["plan"], variant
