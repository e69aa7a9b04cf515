"""The DAGs' least-privilege role (migrations 0003 and 0004) on a real PostgreSQL: the whole
pipeline works through it, and every schema change, history rewrite or forged event is refused
by PostgreSQL itself. Reviewers' decisions are the review role's (test_roles.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors

from tests.ledger.helpers import new_jobs
from triage import migrations
from triage.classifiers import Taxonomy, build_classifier
from triage.contracts.drill import DrillSettings
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import MoveNotPermitted
from triage.jobs.vocabulary.models import RetryLater
from triage.jobs.vocabulary.states import JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.publish import JsonlEventSink, publish_all
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, WorkRemains, run_step
from triage.roles import APP_ROLE, REVIEWER_ROLE, WORKER_ROLE, ensure_worker_role, reviewer_url, worker_url
from triage.sources.synthetic import SyntheticSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = "app-role"


@pytest.fixture
def app_url(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> DatabaseUrl:
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    return worker_url(db_url)


@pytest.fixture
def app_store(app_url: DatabaseUrl) -> Iterator[JobStore]:
    import random

    engine = create_engine(app_url, pool_size=4)
    yield JobStore(engine, rng=random.Random(3))
    engine.dispose()


@pytest.fixture
def review_store(app_url: DatabaseUrl, db_url: DatabaseUrl) -> Iterator[JobStore]:
    """The review role's login (the web service and review_jobs)."""
    engine = create_engine(reviewer_url(db_url), pool_size=2)
    yield JobStore(engine)
    engine.dispose()


def as_app(url: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(url.libpq(), autocommit=True)


def test_the_worker_logs_in_as_a_member_of_the_app_role_and_owns_nothing(app_url: DatabaseUrl) -> None:
    with as_app(app_url) as conn:
        row = conn.execute(
            "SELECT current_user, pg_has_role(current_user, %s, 'USAGE'), r.rolsuper, r.rolcreaterole,"
            " r.rolcreatedb, has_schema_privilege('triage', 'CREATE'), has_database_privilege(current_database(),"
            " 'CREATE') FROM pg_roles r WHERE r.rolname = current_user",
            (APP_ROLE,),
        ).fetchone()
        owned = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'triage' AND pg_has_role(c.relowner, 'USAGE')"
        ).fetchone()
    assert row == (WORKER_ROLE, True, False, False, False, False, False)
    assert owned == (0,)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_pipeline_runs_through_the_app_role(app_store: JobStore, review_store: JobStore, tmp_path: Path) -> None:
    """register → claim → record (complete, retry, review) → relay as ``triage_worker``, then the
    review decisions as ``triage_reviewer``: the triggers write job_events as the schema's owner
    (``SECURITY DEFINER``, migration 0004), which neither role itself may, naming each login."""
    payloads = PayloadStore(tmp_path / "payloads")
    drill = DrillSettings(transient_error_rate=0.2, inconclusive_rate=0.2, seed=5)
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load(), drill=drill)
    result = retrieve(
        app_store,
        SyntheticSource(60, seed=4),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    assert result.registered == 60
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7))
    try:
        report = run_step(
            app_store,
            handler,
            batch_key=BATCH,
            settings=RunSettings(owner="app-role-test", batch_size=25, retry_soon_seconds=0.0),
        )
    except WorkRemains as exc:  # retries not due in this run: the Airflow retry's job
        report = exc.report  # type: ignore[attr-defined]  # run_step sets it on the error it raises
    finally:
        handler.close()
    assert report.outcomes["Complete"] > 0
    assert report.outcomes["RetryLater"] > 0
    assert report.outcomes["SendToReview"] > 0

    sent = publish_all(app_store, JsonlEventSink(tmp_path / "events.jsonl"))
    assert sent > 0

    reviews = app_store.review.open_reviews(limit=10)
    assert len(reviews) >= 3
    names = Taxonomy.load().names
    labelled = review_store.review.resolve_with_label(
        reviews[0].job_id, sorted(names)[0], actor="reviewer", taxonomy_names=names
    )
    assert labelled.status is JobStatus.COMPLETED
    review_store.review.resolve_with_requeue(reviews[1].job_id, actor="reviewer")
    assert review_store.review.reject(reviews[2].job_id, actor="reviewer").status is JobStatus.TERMINAL_FAILED
    app_store.release_expired_leases()

    with app_store.engine.connect() as conn:
        actors = dict(conn.execute(sa.text("SELECT DISTINCT actor, login FROM triage.job_events")).tuples().all())
    assert actors["reviewer"] == REVIEWER_ROLE
    assert {login for actor, login in actors.items() if actor.startswith("app-role-test")} == {WORKER_ROLE}


def test_an_unnamed_move_is_logged_with_the_login_that_made_it(app_store: JobStore, app_url: DatabaseUrl) -> None:
    """No ``triage.actor`` and no lease: the log names the session's login, not the owner the
    trigger runs as."""
    app_store.register(new_jobs(1), batch_key=BATCH, step="classify", max_attempts=3)
    with as_app(app_url) as conn:
        conn.execute("UPDATE triage.jobs SET status = 'terminal_failed', status_reason = 'by hand'")
        actor = conn.execute("SELECT actor FROM triage.job_events WHERE to_status = 'terminal_failed'").fetchone()
    assert actor == (WORKER_ROLE,)


def test_a_retry_of_an_exhausted_job_goes_to_review_as_the_app_role(app_store: JobStore) -> None:
    from tests.ledger.helpers import new_jobs

    app_store.register(new_jobs(1, prefix="exhaust"), batch_key=BATCH, step="classify", max_attempts=1)
    claim = app_store.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="w")
    recorded = app_store.record(claim, [RetryLater(j.id, j.attempt, "timeout") for j in claim.jobs])
    assert recorded.exhausted == 1


def test_a_replay_by_filter_runs_as_the_review_role_not_the_app_role(
    app_store: JobStore, review_store: JobStore
) -> None:
    from triage.contracts.replay import ReplayFilter
    from triage.jobs.vocabulary.models import Fail

    app_store.register(new_jobs(2, prefix="replay"), batch_key=BATCH, step="classify", max_attempts=3)
    claim = app_store.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="w")
    app_store.record(claim, [Fail(j.id, j.attempt, "permanent_error") for j in claim.jobs])
    selection = ReplayFilter.parse({"batch_key": BATCH, "states": ["terminal_failed"], "dry_run": False, "note": "n"})
    assert app_store.review.preview_replay(selection).matching == 2
    with pytest.raises(MoveNotPermitted, match="that move is role triage_review's"):
        app_store.review.replay(selection, actor="alice")
    assert review_store.review.replay(selection, actor="alice").replayed_now == 2
    assert review_store.review.replay(selection, actor="alice").outcome == "already_applied"


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("CREATE TABLE triage.extra (id int)", id="create-table-in-triage"),
        pytest.param("CREATE TABLE public.extra (id int)", id="create-table-in-public"),
        pytest.param("CREATE FUNCTION triage.f() RETURNS int LANGUAGE sql AS 'SELECT 1'", id="create-function"),
        pytest.param("CREATE SCHEMA elsewhere", id="create-schema"),
        pytest.param("ALTER TABLE triage.jobs ADD COLUMN x int", id="alter-table"),
        pytest.param("ALTER TABLE triage.job_events DISABLE TRIGGER job_events_append_only", id="disable-trigger"),
        pytest.param("DROP TABLE triage.job_events", id="drop-table"),
        pytest.param("DROP TRIGGER jobs_check_update ON triage.jobs", id="drop-trigger"),
        pytest.param("DROP FUNCTION triage.refuse_change()", id="drop-function"),
        pytest.param("TRUNCATE triage.job_events", id="truncate-events"),
        pytest.param("TRUNCATE triage.jobs", id="truncate-jobs"),
        pytest.param("UPDATE triage.job_events SET reason = 'rewritten'", id="update-events"),
        pytest.param("DELETE FROM triage.job_events", id="delete-events"),
        pytest.param(
            "INSERT INTO triage.job_events (job_id, to_status, step, attempt, actor)"
            " VALUES (gen_random_uuid(), 'completed', 'classify', 1, 'forged')",
            id="forge-event",
        ),
        pytest.param("DELETE FROM triage.classifications", id="delete-classifications"),
        pytest.param("UPDATE triage.classifications SET label = 'x'", id="update-classifications"),
        pytest.param("DELETE FROM triage.jobs", id="delete-jobs"),
        pytest.param("INSERT INTO triage.job_transitions VALUES ('completed', 'queued')", id="add-transition"),
        pytest.param("UPDATE triage.alembic_version SET version_num = '0001'", id="alembic-version"),
        pytest.param("GRANT triage_app TO triage_worker WITH ADMIN OPTION", id="grant-role"),
    ],
)
def test_the_app_role_is_refused_ddl_and_history_rewrites(app_url: DatabaseUrl, statement: str) -> None:
    with as_app(app_url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement)


def test_the_owner_still_migrates_down_and_up_with_the_role_in_place(db_url: DatabaseUrl, app_url: DatabaseUrl) -> None:
    """Roles outlive a database: a downgrade revokes this database's grants and leaves the role;
    upgrading again finds it and grants again (no "role already exists")."""
    migrations.downgrade(db_url, "0002")
    with as_app(app_url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SELECT count(*) FROM triage.jobs")
    migrations.upgrade(db_url)
    with as_app(app_url) as conn:
        assert conn.execute("SELECT count(*) FROM triage.jobs").fetchone() == (0,)
