"""The state machine as the database enforces it, for anyone who writes SQL.

One connection is the point of every test here: each runs in the ``ledger`` transaction that is
rolled back after it (tests/ledger/conftest.py), a refused statement in a savepoint of it."""

from __future__ import annotations

import itertools
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import insert_job, job_in, move
from triage.jobs.vocabulary.errors import AppendOnly, ConstraintViolated, IllegalTransition, translate
from triage.jobs.vocabulary.states import (
    INITIAL_STATES,
    TRANSITION_ROLES,
    TRANSITION_STEPS,
    TRANSITIONS,
    JobStatus,
    Step,
    is_allowed,
)

PAIRS = list(itertools.product(JobStatus, JobStatus))


def test_python_and_database_enums_are_equal(ledger: sa.Connection) -> None:
    labels = ledger.execute(sa.text("SELECT unnest(enum_range(NULL::triage.job_status))::text")).scalars().all()
    assert labels == [s.value for s in JobStatus]


def test_python_and_database_transition_tables_are_equal(ledger: sa.Connection) -> None:
    rows = ledger.execute(sa.text("SELECT from_status::text, to_status::text FROM triage.job_transitions")).all()
    in_db = {(a, b) for a, b in rows if a is not None}
    initial_in_db = {b for a, b in rows if a is None}
    assert in_db == {(a.value, b.value) for a, b in TRANSITIONS}
    assert initial_in_db == {s.value for s in INITIAL_STATES}


def test_python_and_database_transition_owners_are_equal(ledger: sa.Connection) -> None:
    """Every allowed move has one owning role, the same in both tables (migration 0021)."""
    rows = ledger.execute(sa.text("SELECT from_status::text, to_status::text, role FROM triage.transition_roles")).all()
    assert {(a, b): role for a, b, role in rows} == {
        (None if a is None else a.value, b.value): role.value for (a, b), role in TRANSITION_ROLES.items()
    }
    assert set(TRANSITION_ROLES) == {(None, s) for s in INITIAL_STATES} | set(TRANSITIONS)


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_transition_matrix(ledger: sa.Connection, old: JobStatus, new: JobStatus) -> None:
    """Every one of the 64 pairs: the database accepts exactly the allowed moves."""
    job_id = job_in(ledger, old)
    allowed = old == new or is_allowed(old, new)  # a same-state UPDATE is no transition
    try:
        with ledger.begin_nested():
            move(ledger, job_id, new)
    except sa.exc.DBAPIError as exc:  # the refusal itself is under test, with its details
        error = translate(exc)
        assert not allowed, f"{old}->{new} should be allowed, got {exc}"  # noqa: PT017
        assert isinstance(error, IllegalTransition)
        assert (error.job_id, error.from_status, error.to_status) == (str(job_id), old.value, new.value)
    else:
        assert allowed, f"{old}->{new} should be refused"
    status = ledger.execute(sa.text("SELECT status::text FROM triage.jobs WHERE id = :id"), {"id": job_id}).scalar()
    assert status == (new if allowed else old).value


def test_ad_hoc_sql_cannot_complete_a_received_job(ledger: sa.Connection) -> None:
    job_id = insert_job(ledger, JobStatus.RECEIVED)
    with pytest.raises(sa.exc.DBAPIError) as caught, ledger.begin_nested():
        ledger.execute(sa.text("UPDATE triage.jobs SET status = 'completed'"))
    message = str(caught.value.orig)
    assert str(job_id) in message
    assert "received" in message
    assert "completed" in message


@pytest.mark.parametrize("status", sorted(set(JobStatus) - INITIAL_STATES), ids=str)
def test_jobs_cannot_be_created_in_a_later_state(ledger: sa.Connection, status: JobStatus) -> None:
    with pytest.raises(sa.exc.DBAPIError) as caught, ledger.begin_nested():
        insert_job(ledger, status)
    # The trigger refuses the state; for running and retryable_failed a CHECK (no lease, no
    # next_attempt_at) may refuse the row first. Either way it is a named ledger error.
    assert isinstance(translate(caught.value), IllegalTransition | ConstraintViolated)


def test_a_refused_statement_changes_nothing(ledger: sa.Connection) -> None:
    """One illegal row in a set-based UPDATE refuses the whole statement."""
    illegal = insert_job(ledger, JobStatus.RECEIVED)  # received -> completed is not allowed
    legal = insert_job(ledger, JobStatus.MANUAL_REVIEW)  # manual_review -> completed is
    statement = sa.text("UPDATE triage.jobs SET status = 'completed' WHERE id IN (:a, :b)")
    with pytest.raises(sa.exc.DBAPIError), ledger.begin_nested():
        ledger.execute(statement, {"a": illegal, "b": legal})
    rows: dict[uuid.UUID, str] = dict(
        ledger.execute(sa.text("SELECT id, status::text FROM triage.jobs")).tuples().all()
    )
    events = ledger.execute(sa.text("SELECT count(*) FROM triage.job_events WHERE to_status = 'completed'")).scalar()
    assert rows == {illegal: "received", legal: "manual_review"}
    assert events == 0


def test_every_transition_is_logged_with_actor_and_reason(ledger: sa.Connection) -> None:
    ledger.execute(sa.text("SELECT set_config('triage.actor', 'alice', true)"))
    job_id = insert_job(ledger, JobStatus.QUEUED)
    move(ledger, job_id, JobStatus.RUNNING)
    ledger.execute(sa.text("SELECT set_config('triage.reason', 'testing', true)"))
    move(ledger, job_id, JobStatus.COMPLETED)
    move(ledger, job_id, JobStatus.COMPLETED)  # no change, no event
    events = ledger.execute(
        sa.text(
            "SELECT from_status::text, to_status::text, actor, reason, attempt FROM triage.job_events"
            " WHERE job_id = :id ORDER BY id"
        ),
        {"id": job_id},
    ).all()
    assert [tuple(e) for e in events] == [
        (None, "queued", "alice", None, 0),
        ("queued", "running", "alice", None, 1),
        ("running", "completed", "alice", "testing", 1),
    ]


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("UPDATE triage.job_events SET reason = 'rewritten'", id="update-events"),
        pytest.param("DELETE FROM triage.job_events", id="delete-events"),
        pytest.param("TRUNCATE triage.job_events", id="truncate-events"),
        pytest.param("DELETE FROM triage.jobs", id="delete-jobs"),
        pytest.param("UPDATE triage.jobs SET idempotency_key = 'other'", id="rekey-job"),
        pytest.param("DELETE FROM triage.job_transitions", id="edit-transitions"),
    ],
)
def test_history_and_identity_cannot_be_rewritten(ledger: sa.Connection, statement: str) -> None:
    insert_job(ledger, JobStatus.QUEUED)
    with pytest.raises(sa.exc.DBAPIError) as caught, ledger.begin_nested():
        ledger.execute(sa.text(statement))
    assert isinstance(translate(caught.value), AppendOnly)


@pytest.mark.parametrize(
    ("sql", "constraint"),
    [
        pytest.param(
            "UPDATE triage.jobs SET lease_owner = 'x'", "jobs_lease_only_while_running_check", id="lease-not-running"
        ),
        pytest.param(
            "UPDATE triage.jobs SET next_attempt_at = now()",
            "jobs_next_attempt_only_while_retryable_or_parked_check",
            id="next-attempt-not-retryable",
        ),
        pytest.param("UPDATE triage.jobs SET attempt = 9", "jobs_attempt_bounds_check", id="attempt-over-max"),
    ],
)
def test_check_constraints_tie_columns_to_states(ledger: sa.Connection, sql: str, constraint: str) -> None:
    insert_job(ledger, JobStatus.QUEUED)
    with pytest.raises(sa.exc.IntegrityError) as caught, ledger.begin_nested():
        ledger.execute(sa.text(sql))
    assert isinstance(caught.value.orig, psycopg.Error)
    assert caught.value.orig.diag.constraint_name == constraint


def test_running_needs_a_lease(ledger: sa.Connection) -> None:
    job_id = insert_job(ledger, JobStatus.QUEUED)
    with pytest.raises(sa.exc.IntegrityError), ledger.begin_nested():
        ledger.execute(sa.text("UPDATE triage.jobs SET status = 'running' WHERE id = :id"), {"id": job_id})


def test_python_and_database_transition_steps_are_equal(ledger: sa.Connection) -> None:
    """The moves allowed only at one step, the same in both tables (migration 0033)."""
    rows = ledger.execute(
        sa.text(
            "SELECT from_status::text, to_status::text, at_step FROM triage.job_transitions WHERE at_step IS NOT NULL"
        )
    ).all()
    assert {(a, b): step for a, b, step in rows} == {
        (a.value, b.value): step.value for (a, b), step in TRANSITION_STEPS.items()
    }
    assert TRANSITION_STEPS == {(JobStatus.QUEUED, JobStatus.COMPLETED): Step.CLASSIFY}


@pytest.mark.parametrize("step", ["persist", "anything_else"])
def test_a_queued_job_at_another_step_than_classify_cannot_be_completed(ledger: sa.Connection, step: str) -> None:
    """``queued -> completed`` is the one-transaction chunk's move (0030): the classifier's answer
    is the outcome, so only at step classify. At another step the database refuses it, whoever
    sends it (0033), with the error of any refused move, naming both steps."""
    job_id = insert_job(ledger, JobStatus.QUEUED)
    ledger.execute(sa.text("UPDATE triage.jobs SET step = :step WHERE id = :id"), {"step": step, "id": job_id})
    with pytest.raises(sa.exc.DBAPIError) as caught, ledger.begin_nested():
        move(ledger, job_id, JobStatus.COMPLETED)
    error = translate(caught.value)
    assert isinstance(error, IllegalTransition)
    assert (error.job_id, error.from_status, error.to_status) == (str(job_id), "queued", "completed")
    assert f"at step {step}: that move is allowed only at step classify" in str(caught.value.orig)
    assert not is_allowed(JobStatus.QUEUED, JobStatus.COMPLETED, step)
    status = ledger.execute(sa.text("SELECT status::text FROM triage.jobs WHERE id = :id"), {"id": job_id}).scalar()
    assert status == "queued"
    # The other moves out of queued keep any step: the chunk's review move, a claim.
    move(ledger, job_id, JobStatus.RUNNING)
    move(ledger, job_id, JobStatus.COMPLETED)  # running -> completed at persist is the leased path's


def test_a_queued_job_at_classify_may_be_completed(ledger: sa.Connection) -> None:
    job_id = insert_job(ledger, JobStatus.QUEUED)
    move(ledger, job_id, JobStatus.COMPLETED)
    assert is_allowed(JobStatus.QUEUED, JobStatus.COMPLETED, Step.CLASSIFY)
    logged = ledger.execute(
        sa.text("SELECT step FROM triage.job_events WHERE job_id = :id AND to_status = 'completed'"), {"id": job_id}
    ).scalar()
    assert logged == "classify"
