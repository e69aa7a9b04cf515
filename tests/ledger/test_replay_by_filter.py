"""Replay by filter (issue #13, item 4) against a real PostgreSQL: the filter selects exactly
the jobs it names, a preview changes nothing, an apply moves them through the state machine
(``terminal_failed`` included) with the actor and note on record, a second apply is a no-op,
the bound holds, and hostile filters are refused with a typed error."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.contracts.replay import MAX_REPLAY_LIMIT, InvalidReplayFilter, ReplayFilter
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Fail, SendToReview
from triage.jobs.vocabulary.states import JobStatus

DAY1 = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
DAY2 = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"


def failed(
    store: JobStore,
    n: int,
    *,
    batch: str = DAY1,
    source: str = "synthetic",
    reason: str = "retries_exhausted",
    error_class: str | None = "ModelTimeout",
    terminal: bool = False,
    prefix: str | None = None,
) -> list[uuid.UUID]:
    """``n`` jobs brought to ``manual_review`` (or ``terminal_failed``) by a worker's outcome."""
    prefix = prefix or f"{source}-{reason}-{error_class}-{terminal}-{batch[:10]}"
    store.register(new_jobs(n, prefix=prefix, source=source), batch_key=batch, step="classify", max_attempts=3)
    claim = store.claim(batch_key=batch, step="classify", limit=n, lease_seconds=60, owner="worker-1")
    assert len(claim.jobs) == n
    outcome = Fail if terminal else SendToReview
    store.record(claim, [outcome(j.id, j.attempt, reason, error_class=error_class, error="boom") for j in claim.jobs])
    return [j.id for j in claim.jobs]


def rows(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def snapshot(store: JobStore) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "jobs": rows(
            store,
            "SELECT id, status, status_reason, attempt, attempt_base, max_attempts, replays, updated_at"
            " FROM triage.jobs ORDER BY id",
        ),
        "events": rows(store, "SELECT id FROM triage.job_events ORDER BY id"),
        "reviews": rows(store, "SELECT id, resolution, resolved_by, note FROM triage.manual_review ORDER BY id"),
        "outbox": rows(store, "SELECT event_id FROM triage.outbox ORDER BY event_id"),
        "requests": rows(store, "SELECT replay_key FROM triage.replay_requests"),
    }


def flt(**data: Any) -> ReplayFilter:
    return ReplayFilter.parse(data)


def selected(store: JobStore, **data: Any) -> set[uuid.UUID]:
    preview = store.review.preview_replay(flt(**data))
    assert preview.matching == len(preview.jobs)  # the tests stay under the preview's rows
    return {j.job_id for j in preview.jobs}


@pytest.fixture
def ledger(store: JobStore) -> dict[str, list[uuid.UUID]]:
    """Failed jobs that differ in one field each from the ``base`` ones."""
    return {
        "base": failed(store, 2),
        "other_reason": failed(store, 1, reason="inconclusive"),
        "other_class": failed(store, 1, error_class="RateLimited"),
        "other_source": failed(store, 1, source="jsonl"),
        "other_batch": failed(store, 1, batch=DAY2),
        "terminal": failed(store, 2, terminal=True),
    }


def test_each_field_selects_exactly_its_jobs(store: JobStore, ledger: dict[str, list[uuid.UUID]]) -> None:
    everything_in_review = set(
        ledger["base"] + ledger["other_reason"] + ledger["other_class"] + ledger["other_source"] + ledger["other_batch"]
    )
    assert selected(store, reason="retries_exhausted") == everything_in_review - set(ledger["other_reason"])
    assert selected(store, reason="inconclusive") == set(ledger["other_reason"])
    assert selected(store, error_class="RateLimited") == set(ledger["other_class"])
    assert selected(store, source="jsonl") == set(ledger["other_source"])
    assert selected(store, batch_key=DAY2) == set(ledger["other_batch"])
    assert selected(
        store, batch_key=DAY1, source="synthetic", reason="retries_exhausted", error_class="ModelTimeout"
    ) == set(ledger["base"])
    # states: manual_review by default; terminal_failed only when asked for
    assert selected(store, reason="retries_exhausted", states=["terminal_failed"]) == set(ledger["terminal"])
    both = selected(store, reason="retries_exhausted", states=["manual_review", "terminal_failed"])
    assert both == everything_in_review - set(ledger["other_reason"]) | set(ledger["terminal"])
    # the date range bounds when the job entered its state
    now = datetime.now(UTC)
    assert selected(store, source="jsonl", since=now - timedelta(hours=1)) == set(ledger["other_source"])
    assert selected(store, source="jsonl", until=now - timedelta(hours=1)) == set()
    assert selected(store, source="jsonl", since=now + timedelta(hours=1)) == set()


def test_a_preview_changes_nothing_and_lists_the_jobs(store: JobStore, ledger: dict[str, list[uuid.UUID]]) -> None:
    before = snapshot(store)
    preview = store.review.preview_replay(flt(reason="retries_exhausted", batch_key=DAY1, limit=2))
    assert snapshot(store) == before
    assert (preview.matching, preview.would_replay, preview.request) == (4, 2, None)
    first = preview.jobs[0]
    assert (first.status, first.reason, first.error_class) == (
        JobStatus.MANUAL_REVIEW,
        "retries_exhausted",
        "ModelTimeout",
    )


def test_apply_requeues_through_the_state_machine_with_actor_and_note(
    store: JobStore, ledger: dict[str, list[uuid.UUID]]
) -> None:
    selection = flt(
        reason="retries_exhausted",
        batch_key=DAY1,
        source="synthetic",
        error_class="ModelTimeout",
        states=["manual_review", "terminal_failed"],
        dry_run=False,
        note="model API was down 02:00-03:00",
    )
    done = store.review.replay(selection, actor="alice")
    wanted = set(ledger["base"] + ledger["terminal"])
    assert (done.outcome, done.replayed_now, set(done.job_ids)) == ("applied", 4, wanted)
    assert done.request.requested_by == "alice"
    assert done.request.applied_at is not None
    reason = f"replayed:{selection.replay_key()}"
    events = rows(
        store,
        "SELECT job_id, from_status::text, to_status::text, actor, reason FROM triage.job_events"
        " WHERE reason LIKE 'replayed:%'",
    )
    assert sorted(events) == sorted(
        [(j, "manual_review", "queued", "alice", reason) for j in ledger["base"]]
        + [(j, "terminal_failed", "queued", "alice", reason) for j in ledger["terminal"]]
    )
    # a fresh budget, a replay counted, the last error cleared; the review rows resolved with the note
    jobs = rows(
        store,
        "SELECT status::text, attempt_base = attempt, max_attempts - attempt, replays, last_error_class"
        " FROM triage.jobs WHERE id = ANY(:ids)",
        ids=list(wanted),
    )
    assert set(jobs) == {("queued", True, 3, 1, None)}
    reviews = rows(
        store,
        "SELECT job_id, resolution, resolved_by, note FROM triage.manual_review WHERE job_id = ANY(:ids)",
        ids=ledger["base"],
    )
    assert sorted(reviews) == sorted((j, "requeued", "alice", "model API was down 02:00-03:00") for j in ledger["base"])
    assert rows(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.requeued'") == [(4,)]
    note = rows(store, "SELECT requested_by, note, replayed FROM triage.replay_requests")
    assert note == [("alice", "model API was down 02:00-03:00", 4)]
    # the replayed jobs can be claimed again, the terminal ones included
    claim = store.claim(batch_key=DAY1, step="classify", limit=10, lease_seconds=60, owner="worker-2")
    assert {j.id for j in claim.jobs} == wanted


def test_a_second_identical_apply_changes_nothing(store: JobStore, ledger: dict[str, list[uuid.UUID]]) -> None:
    selection = flt(reason="retries_exhausted", batch_key=DAY1, dry_run=False, note="retry")
    assert store.review.replay(selection, actor="alice").outcome == "applied"
    # one of the replayed jobs fails again: the same submission still leaves it alone
    claim = store.claim(batch_key=DAY1, step="classify", limit=1, lease_seconds=60, owner="worker-2")
    store.record(
        claim, [SendToReview(claim.jobs[0].id, claim.jobs[0].attempt, "retries_exhausted", error_class="ModelTimeout")]
    )
    before = snapshot(store)
    again = store.review.replay(selection, actor="bob")
    assert (again.outcome, again.replayed_now, again.request.requested_by) == ("already_applied", 0, "alice")
    assert snapshot(store) == before
    assert store.review.preview_replay(selection).request is not None  # the preview says so too
    # a new note is a new request: it takes the job that came back
    fresh = store.review.replay(
        flt(reason="retries_exhausted", batch_key=DAY1, dry_run=False, note="again"), actor="bob"
    )
    assert (fresh.outcome, fresh.job_ids) == ("applied", (claim.jobs[0].id,))


def test_the_limit_bounds_an_apply_in_batches(store: JobStore) -> None:
    ids = failed(store, 7)
    selection = flt(reason="retries_exhausted", limit=5, dry_run=False, note="bounded")
    from triage.jobs.store import replays

    done = replays.apply(store.transaction, selection, actor="alice", max_replays=3, batch_size=2)
    assert (done.outcome, done.replayed_now, done.request.replayed) == ("applied", 5, 5)
    assert set(done.job_ids) < set(ids)
    assert store.status_counts()[JobStatus.MANUAL_REVIEW] == 2
    assert store.review.replay(selection, actor="alice").outcome == "already_applied"


def test_jobs_replayed_max_replays_times_are_left_alone(store: JobStore) -> None:
    [job] = failed(store, 1)
    store.review.replay(flt(reason="retries_exhausted", dry_run=False, note="first"), actor="a", max_replays=1)
    claim = store.claim(batch_key=DAY1, step="classify", limit=1, lease_seconds=60, owner="w")
    store.record(claim, [Fail(job, claim.jobs[0].attempt, "retries_exhausted", error_class="ModelTimeout")])
    preview = store.review.preview_replay(flt(reason="retries_exhausted", states=["terminal_failed"]), max_replays=1)
    assert (preview.matching, preview.at_replay_limit) == (0, 1)
    done = store.review.replay(
        flt(reason="retries_exhausted", states=["terminal_failed"], dry_run=False, note="second"),
        actor="a",
        max_replays=1,
    )
    assert done.replayed_now == 0
    assert store.get_status(job) == JobStatus.TERMINAL_FAILED


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"states": ["manual_review"]}, id="no-narrowing-field"),
        pytest.param({"reason": "x", "limit": MAX_REPLAY_LIMIT + 1}, id="over-the-hard-limit"),
        pytest.param({"reason": "x", "limit": 0}, id="zero-limit"),
        pytest.param({"reason": "x", "limit": "10"}, id="limit-as-text"),
        pytest.param({"reason": "x", "limit": True}, id="limit-as-bool"),
        pytest.param({"reason": "x", "states": ["completed"]}, id="state-not-replayable"),
        pytest.param({"reason": "x", "states": ["queued"]}, id="queued-not-replayable"),
        pytest.param({"reason": "x", "states": []}, id="no-state"),
        pytest.param({"reason": "x", "states": ["manual_review", "manual_review"]}, id="state-twice"),
        pytest.param({"reason": "x'; DROP TABLE triage.jobs; --"}, id="sql-in-reason"),
        pytest.param({"reason": "a" * 129}, id="long-reason"),
        pytest.param({"error_class": "Model\nTimeout"}, id="newline-in-class"),
        pytest.param({"source": "syn\x1b[31mthetic"}, id="escape-in-source"),
        pytest.param({"batch_key": "b\u202egnp.exe"}, id="bidi-in-batch"),
        pytest.param({"source": ""}, id="empty-source"),
        pytest.param({"reason": "x", "since": "yesterday"}, id="since-not-a-date"),
        pytest.param({"reason": "x", "since": "2026-11-02", "until": "2026-11-01"}, id="range-backwards"),
        pytest.param({"reason": "x", "dry_run": False}, id="apply-without-note"),
        pytest.param({"reason": "x", "dry_run": False, "note": "   "}, id="apply-with-blank-note"),
        pytest.param({"reason": "x", "dry_run": "no"}, id="dry-run-as-text"),
        pytest.param({"reason": "x", "note": "a\x00b"}, id="nul-in-note"),
        pytest.param({"reason": "x", "note": "n" * 2001}, id="long-note"),
        pytest.param({"reason": "x", "job_ids": ["1"]}, id="unknown-key"),
        pytest.param({"reason": ["x"]}, id="reason-as-list"),
    ],
)
def test_hostile_filters_are_refused_with_a_typed_error(store: JobStore, data: dict[str, Any]) -> None:
    failed(store, 1)
    before = snapshot(store)
    with pytest.raises(InvalidReplayFilter):
        ReplayFilter.parse(data)
    assert snapshot(store) == before


def test_a_filter_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidReplayFilter, match="is an object"):
        ReplayFilter.parse(["reason", "x"])


def test_the_key_is_the_submission() -> None:
    a = flt(reason="x", since="2026-11-01T00:00:00", dry_run=False, note="n")
    b = flt(reason="x", since="2026-11-01T01:00:00+01:00", dry_run=True, note="n")  # the same instant, a preview
    assert a.replay_key() == b.replay_key()
    assert a.replay_key() != flt(reason="x", since="2026-11-01", note="other").replay_key()


@pytest.mark.own_database  # two threads race
def test_two_identical_submissions_at_once_share_the_bound(store: JobStore) -> None:
    import threading

    from triage.jobs.store import replays

    failed(store, 6)
    selection = flt(reason="retries_exhausted", limit=4, dry_run=False, note="twice at once")
    results: list[replays.ReplayApplied] = []

    def submit(actor: str) -> None:
        results.append(replays.apply(store.transaction, selection, actor=actor, max_replays=3, batch_size=1))

    threads = [threading.Thread(target=submit, args=(name,)) for name in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.replayed_now for r in results) == 4
    assert len({j for r in results for j in r.job_ids}) == 4
    assert rows(store, "SELECT requested_by, replayed FROM triage.replay_requests") in ([("alice", 4)], [("bob", 4)])
    assert store.status_counts()[JobStatus.MANUAL_REVIEW] == 2
