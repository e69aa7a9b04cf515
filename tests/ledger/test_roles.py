"""Each login does one job and PostgreSQL refuses the rest (issue #25, migrations 0021 and 0022).

Every refusal is made through the login a deployment gives that job (the embedded server's
``triage_worker``, ``triage_reviewer``, ``triage_maintainer``), by the store and by raw SQL: the
database itself refuses, whatever the Python code checks first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors

from tests.ledger.helpers import new_jobs
from triage import migrations
from triage.classifiers import Taxonomy
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import ConstraintViolated, MoveNotPermitted, RoleRefused
from triage.jobs.vocabulary.models import SendToReview
from triage.jobs.vocabulary.states import JobStatus
from triage.roles import (
    MAINTAINER_ROLE,
    REVIEWER_ROLE,
    WORKER_ROLE,
    ensure_worker_role,
    maintainer_url,
    reviewer_url,
    worker_url,
)

BATCH = "roles"
NAMES = Taxonomy.load().names
LABEL = sorted(NAMES)[0]


@pytest.fixture
def logins(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> dict[str, DatabaseUrl]:
    if not pg_server.is_socket:
        pytest.skip("the deployment logins have no password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    return {"worker": worker_url(db_url), "reviewer": reviewer_url(db_url), "maintainer": maintainer_url(db_url)}


@pytest.fixture
def stores(logins: dict[str, DatabaseUrl]) -> Iterator[dict[str, JobStore]]:
    engines = {name: create_engine(url, pool_size=2) for name, url in logins.items()}
    yield {name: JobStore(engine) for name, engine in engines.items()}
    for engine in engines.values():
        engine.dispose()


def connect(url: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(url.libpq(), autocommit=True)


def in_review(worker: JobStore, n: int = 1, prefix: str = "r") -> list[uuid.UUID]:
    """``n`` jobs moved into manual_review by the pipeline's login, as a doubtful answer does."""
    worker.register(new_jobs(n, prefix=prefix), batch_key=BATCH, step="classify", max_attempts=3)
    claim = worker.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="w")
    worker.record(claim, [SendToReview(j.id, j.attempt, "inconclusive", "low confidence") for j in claim.jobs])
    return [j.id for j in claim.jobs]


def events(url: DatabaseUrl, job_id: uuid.UUID) -> list[tuple[str | None, str, str, str | None]]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT from_status::text, to_status::text, actor, login FROM triage.job_events WHERE job_id = %s"
            " ORDER BY id",
            (job_id,),
        ).fetchall()
    return [tuple(r) for r in rows]


# -- the app role cannot decide for a reviewer --------------------------------------------------


def test_the_app_role_cannot_resolve_a_job_in_review(stores: dict[str, JobStore], db_url: DatabaseUrl) -> None:
    """Issue #25: as ``triage_app``, ``resolve_with_label(..., actor="alice")`` left a trail
    identical to alice's own decision. Now the move is refused, naming login, move and role."""
    (job_id,) = in_review(stores["worker"])
    # The decision's review row is refused first (a row trigger), or its move (the statement's).
    with pytest.raises(RoleRefused, match=r"login triage_worker may not .* job .*: that .* role triage_review's"):
        stores["worker"].review.resolve_with_label(job_id, LABEL, actor="alice", taxonomy_names=NAMES)
    with pytest.raises(RoleRefused, match="role triage_review's"):
        stores["worker"].review.reject(job_id, actor="alice")
    with pytest.raises(RoleRefused):
        stores["worker"].review.resolve_with_requeue(job_id, actor="alice")
    # The move alone, no review row touched.
    with (
        pytest.raises(MoveNotPermitted, match=r"may not move job .* from manual_review to terminal_failed"),
        stores["worker"].transaction("alice") as conn,
    ):
        conn.execute(sa.text("UPDATE triage.jobs SET status = 'terminal_failed' WHERE id = :i"), {"i": job_id})
    assert stores["worker"].get_status(job_id) is JobStatus.MANUAL_REVIEW
    with connect(db_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM triage.manual_review WHERE job_id = %s AND resolved_at IS NULL", (job_id,)
        ).fetchone() == (1,)


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param(
            "UPDATE triage.jobs SET status = 'completed', status_reason = 'labelled' WHERE id = %(id)s",
            id="move-to-completed",
        ),
        pytest.param(
            "UPDATE triage.jobs SET status = 'queued', status_reason = 'requeued' WHERE id = %(id)s",
            id="move-to-queued",
        ),
        pytest.param(
            "UPDATE triage.manual_review SET resolved_at = now(), resolution = 'labelled', resolved_by = 'alice',"
            ' context = context || \'{"resolved_label": "billing"}\' WHERE job_id = %(id)s',
            id="forge-a-decision",
        ),
        pytest.param(
            "INSERT INTO triage.manual_review (job_id, reason, attempts, resolved_at, resolution, resolved_by)"
            " VALUES (%(id)s, 'x', 1, now(), 'rejected', 'alice')",
            id="insert-a-decided-row",
        ),
    ],
)
def test_the_app_role_cannot_decide_by_raw_sql(
    stores: dict[str, JobStore], logins: dict[str, DatabaseUrl], statement: str
) -> None:
    (job_id,) = in_review(stores["worker"])
    with connect(logins["worker"]) as conn:
        conn.execute("SET triage.actor = 'alice'")
        with pytest.raises(errors.InsufficientPrivilege, match="triage_review"):
            conn.execute(statement, {"id": job_id})


def test_the_log_tells_the_login_from_the_actor_it_claims(
    stores: dict[str, JobStore], logins: dict[str, DatabaseUrl]
) -> None:
    """The actor is a setting any session may set; ``job_events.login`` is ``session_user``, so a
    worker claiming to be alice is told from alice's own decision."""
    (reviewed,) = in_review(stores["worker"])
    stores["worker"].register(new_jobs(1, prefix="claims"), batch_key="claims", step="classify", max_attempts=3)
    with connect(logins["worker"]) as conn:
        conn.execute("SET triage.actor = 'alice'")
        (queued,) = conn.execute(
            "UPDATE triage.jobs SET status = 'terminal_failed', status_reason = 'x' WHERE batch_key = 'claims'"
            " RETURNING id"
        ).fetchone()  # type: ignore[misc]  # RETURNING the row just written: never None
    stores["reviewer"].review.reject(reviewed, actor="alice", note="no")
    assert events(logins["worker"], queued)[-1] == ("queued", "terminal_failed", "alice", WORKER_ROLE)
    assert events(logins["worker"], reviewed) == [
        (None, "queued", "triage", WORKER_ROLE),
        ("queued", "running", "w", WORKER_ROLE),
        ("running", "manual_review", "w", WORKER_ROLE),
        ("manual_review", "terminal_failed", "alice", REVIEWER_ROLE),
    ]


# -- the review role can, and only that ---------------------------------------------------------


def test_the_review_role_decides_and_is_logged_as_itself(
    stores: dict[str, JobStore], logins: dict[str, DatabaseUrl]
) -> None:
    labelled, requeued, rejected = in_review(stores["worker"], 3)
    reviewer = stores["reviewer"]
    result = reviewer.review.resolve_with_label(labelled, LABEL, actor="alice", taxonomy_names=NAMES)
    assert (result.status, result.label_written) == (JobStatus.COMPLETED, True)
    assert reviewer.review.resolve_with_requeue(requeued, actor="bob").status is JobStatus.QUEUED
    assert reviewer.review.reject(rejected, actor="carol").status is JobStatus.TERMINAL_FAILED
    for job_id, actor in ((labelled, "alice"), (requeued, "bob"), (rejected, "carol")):
        assert events(logins["reviewer"], job_id)[-1][2:] == (actor, REVIEWER_ROLE)
    with connect(logins["reviewer"]) as conn:
        row = conn.execute(
            "SELECT label, classifier_version FROM triage.document_labels WHERE job_id = %s", (labelled,)
        ).fetchone()
    assert row == (LABEL, "human:alice")


@pytest.mark.parametrize(
    ("login", "statement", "match"),
    [
        pytest.param(
            "reviewer",
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
            " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'queued', 3)",
            "permission denied for table jobs",
            id="reviewer-registers",
        ),
        pytest.param(
            "reviewer",
            "UPDATE triage.jobs SET status = 'terminal_failed', status_reason = 'x' WHERE status = 'queued'",
            "that move is role triage_app's",
            id="reviewer-fails-pipeline-work",
        ),
        pytest.param(
            "reviewer",
            "SELECT * FROM triage.drop_expired_partitions('job_events', now())",
            "permission denied",
            id="reviewer-runs-retention",
        ),
        pytest.param(
            "maintainer",
            "UPDATE triage.jobs SET status = 'terminal_failed' WHERE status = 'queued'",
            "permission denied for table jobs",
            id="maintainer-moves-jobs",
        ),
        pytest.param(
            "maintainer",
            "INSERT INTO triage.document_labels (source, external_id, label, classifier_version, content_sha256,"
            " job_id, job_created_at) VALUES ('s', 'e', 'billing', 'v', 'h', gen_random_uuid(), now())",
            "permission denied for table document_labels",
            id="maintainer-writes-labels",
        ),
        pytest.param(
            "maintainer",
            "UPDATE triage.retention_policy SET keep_days = 8",
            "permission denied",
            id="maintainer-shortens-the-policy",
        ),
        pytest.param(
            "worker",
            "UPDATE triage.taxonomy_labels SET retired_at = NULL",
            "permission denied",
            id="worker-edits-the-taxonomy",
        ),
        pytest.param(
            "worker", "DELETE FROM triage.transition_roles", "permission denied", id="worker-edits-move-owners"
        ),
    ],
)
def test_each_role_is_refused_the_others_jobs(
    stores: dict[str, JobStore], logins: dict[str, DatabaseUrl], login: str, statement: str, match: str
) -> None:
    stores["worker"].register(new_jobs(1, prefix="q"), batch_key=BATCH, step="classify", max_attempts=3)
    with connect(logins[login]) as conn, pytest.raises(errors.InsufficientPrivilege, match=match):
        conn.execute(statement)


# -- labels only from the taxonomy ------------------------------------------------------------------


LABEL_ROW = (
    "INSERT INTO triage.document_labels (source, external_id, label, classifier_version, content_sha256, job_id,"
    " job_created_at) VALUES ('s', %(e)s, %(label)s, %(version)s, 'h', gen_random_uuid(), now())"
)


@pytest.mark.parametrize("login", ["worker", "reviewer"])
def test_no_login_writes_a_label_outside_the_taxonomy_even_by_raw_sql(
    logins: dict[str, DatabaseUrl], login: str
) -> None:
    """Issue #25: the taxonomy was checked only in Python."""
    version = "keyword-v1" if login == "worker" else "human:alice"
    with connect(logins[login]) as conn:
        with pytest.raises(errors.CheckViolation, match="label 'pizza' is not in the taxonomy"):
            conn.execute(LABEL_ROW, {"e": "e1", "label": "pizza", "version": version})
        conn.execute(LABEL_ROW, {"e": "e1", "label": LABEL, "version": version})
        with pytest.raises(errors.CheckViolation, match="not in the taxonomy"):
            conn.execute("UPDATE triage.document_labels SET label = 'pizza'")


def test_only_the_review_role_writes_a_reviewers_label(logins: dict[str, DatabaseUrl]) -> None:
    with connect(logins["worker"]) as conn, pytest.raises(errors.InsufficientPrivilege, match="reviewer's label"):
        conn.execute(LABEL_ROW, {"e": "e1", "label": LABEL, "version": "human:alice"})


def test_a_reviewers_label_outside_the_taxonomy_is_refused_by_the_database(
    stores: dict[str, JobStore], db_url: DatabaseUrl
) -> None:
    """Python's list said yes (a stale taxonomy in a process); the table says no."""
    (job_id,) = in_review(stores["worker"])
    with pytest.raises(ConstraintViolated, match="manual_review_label_in_taxonomy"):
        stores["reviewer"].review.resolve_with_label(job_id, "pizza", actor="alice", taxonomy_names={"pizza"})
    assert stores["reviewer"].get_status(job_id) is JobStatus.MANUAL_REVIEW


def test_the_taxonomy_table_follows_the_file_at_each_migrate(
    db_url: DatabaseUrl, engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``triage migrate`` (``migrations.upgrade``) adds the file's labels and retires the others,
    never deletes them: a retired label is refused to new writes."""
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(
        "labels:\n"
        f"  - {{name: {LABEL}, description: kept, keywords: [a]}}\n"
        "  - {name: warranty_claim, description: new, keywords: [warranty]}\n"
    )
    monkeypatch.setenv("TRIAGE_TAXONOMY", str(taxonomy))
    migrations.upgrade(db_url)
    with engine.connect() as conn:
        rows = {
            r.name: r.active
            for r in conn.execute(sa.text("SELECT name, retired_at IS NULL AS active FROM triage.taxonomy_labels"))
        }
    assert rows == {**{name: False for name in NAMES}, LABEL: True, "warranty_claim": True}
    with engine.begin() as conn:
        conn.execute(
            sa.text(LABEL_ROW.replace("%(", ":").replace(")s", "")),
            {"e": "n", "label": "warranty_claim", "version": "v"},
        )
    retired = sorted(NAMES - {LABEL})[0]
    with engine.begin() as conn, pytest.raises(sa.exc.IntegrityError, match="not in the taxonomy"):
        conn.execute(
            sa.text(LABEL_ROW.replace("%(", ":").replace(")s", "")), {"e": "r", "label": retired, "version": "v"}
        )
    monkeypatch.delenv("TRIAGE_TAXONOMY")
    migrations.upgrade(db_url)  # back to the file of the checkout: the retired labels are active again
    with engine.connect() as conn:
        active = set(
            conn.execute(sa.text("SELECT name FROM triage.taxonomy_labels WHERE retired_at IS NULL")).scalars()
        )
    assert active == set(NAMES)


def test_an_existing_ledger_migrates_with_its_data(fresh_database: DatabaseUrl, pg_server: DatabaseUrl) -> None:
    """A database at 0020 with a job in review and a label: after the upgrade the review role
    decides it, the old log rows keep no login, the new ones name it."""
    if not pg_server.is_socket:
        pytest.skip("the deployment logins have no password: needs the embedded (trusting) server")
    migrations.upgrade(fresh_database, "0020")
    with connect(fresh_database) as conn:
        job_id = conn.execute(
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, status_reason, max_attempts)"
            " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'manual_review', 'inconclusive', 3)"
            " RETURNING id"
        ).fetchone()[0]  # type: ignore[index]  # RETURNING the row just written: never None
        conn.execute(
            "INSERT INTO triage.manual_review (job_id, reason, attempts) VALUES (%s, 'inconclusive', 1)", (job_id,)
        )
    migrations.upgrade(fresh_database)
    ensure_worker_role(pg_server)
    engine = create_engine(reviewer_url(fresh_database), poolclass=sa.NullPool)
    try:
        JobStore(engine).review.resolve_with_label(job_id, LABEL, actor="alice", taxonomy_names=NAMES)
    finally:
        engine.dispose()
    assert [e[3] for e in events(fresh_database, job_id)] == [None, REVIEWER_ROLE]
    assert MAINTAINER_ROLE  # the third login exists too


def test_a_web_service_whose_review_login_may_not_decide_says_so(stores: dict[str, JobStore]) -> None:
    """A deployment that points ``triage_db_review`` at the pipeline's login: every decision is
    refused by the database, and the API says why (503) instead of a conflict."""
    from triage.web.service import Refused, TriageService

    (job_id,) = in_review(stores["worker"])
    service = TriageService(stores["worker"], review_store=stores["worker"], taxonomy_names=sorted(NAMES))
    with pytest.raises(Refused) as refused:
        service.decide(job_id, "reject", label=None, note=None, reviewer="alice")
    assert refused.value.status == 503
    assert "triage_db_review" in refused.value.message
    decided = TriageService(stores["worker"], review_store=stores["reviewer"], taxonomy_names=sorted(NAMES))
    assert decided.decide(job_id, "reject", label=None, note=None, reviewer="alice").outcome == "applied"
