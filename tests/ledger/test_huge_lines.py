"""A huge inbox line through retrieve on the real database: it becomes one review row (its
position, size and claimed id, never its text), the lines after it become jobs, and the memory
retrieve uses stays bounded by the line limit, not by the line."""

from __future__ import annotations

import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from tests.unit.test_bounded_lines import HUGE, HUGE_LINE_BYTES, LIMIT, write_huge_day
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.retrieve import retrieve
from triage.sources.base import Shard
from triage.sources.jsonl import JsonlSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)


def test_a_huge_line_is_a_review_row_and_the_day_goes_on(engine: sa.Engine, tmp_path: Path) -> None:
    write_huge_day(tmp_path / "inbox")
    store = JobStore(engine)
    batch = f"huge-{uuid.uuid4().hex}"
    payloads = PayloadStore(tmp_path / "payloads")
    tracemalloc.start()
    try:
        results = []
        for shard in range(2):  # as the DAG maps retrieve: each shard reads the whole file
            source = Shard(JsonlSource(tmp_path / "inbox", max_line_bytes=LIMIT), shard, 2)
            results.append(
                retrieve(
                    store,
                    source,
                    payloads,
                    start=DAY,
                    end=DAY + timedelta(days=1),
                    batch_key=batch,
                    classifier_version="v1",
                    max_attempts=3,
                )
            )
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 8 << 20, f"retrieve of a day with a {HUGE >> 20} MiB line peaked at {peak / (1 << 20):.1f} MiB"
    assert sum(r.registered for r in results) == 3
    assert sum(r.malformed for r in results) == 1
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT j.external_id, j.status::text AS status, j.last_error, r.reason, r.context"
                " FROM triage.jobs j LEFT JOIN triage.manual_review r ON r.job_id = j.id"
                " WHERE j.batch_key = :b ORDER BY j.external_id"
            ),
            {"b": batch},
        ).all()
    assert [(r.external_id, r.status) for r in rows] == [
        ("2026-11-01/day.jsonl:2", "manual_review"),
        ("after", "queued"),
        ("before", "queued"),
    ]
    review = rows[0]
    assert review.reason == "malformed_input"
    assert review.context == {
        "external_id": "2026-11-01/day.jsonl:2",
        "malformed_reason": "line_too_long",
        "line": 2,
        "line_bytes": HUGE_LINE_BYTES,
        "claimed_id": 'T-"huge"',
    }
    assert "xxxx" not in (review.last_error or "")


def test_many_long_lines_are_registered_in_chunks_bounded_by_bytes(engine: sa.Engine, tmp_path: Path) -> None:
    # A chunk of 5,000 lines near the 1 MiB limit would hold about 5 GB: chunks are also cut by
    # their bytes. Here 240 lines of 48 KiB (11 MiB) with a 1 MiB budget.
    folder = tmp_path / "inbox" / "2026-11-01"
    folder.mkdir(parents=True)
    body = "x" * (48 << 10)
    with (folder / "long.jsonl").open("w") as out:
        for n in range(240):
            out.write(f'{{"id": "L-{n}", "subject": "s", "body": "{body}", "received_at": "2026-11-01T08:00:00Z"}}\n')
    store = JobStore(engine)
    batch = f"long-{uuid.uuid4().hex}"
    tracemalloc.start()
    try:
        result = retrieve(
            store,
            JsonlSource(tmp_path / "inbox"),
            PayloadStore(tmp_path / "payloads"),
            start=DAY,
            end=DAY + timedelta(days=1),
            batch_key=batch,
            classifier_version="v1",
            max_attempts=3,
            chunk_bytes=1 << 20,
        )
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (result.read, result.registered) == (240, 240)
    assert peak < 6 << 20, f"retrieve of 11 MiB of lines peaked at {peak / (1 << 20):.1f} MiB"
