"""The Triage plugin's app (``/triage``) on the real database, behind Airflow's real auth manager.

The app is mounted as Airflow's API server mounts it, under ``/triage`` of a root app, and the
callers are Airflow users with JWTs the auth manager signed (the SimpleAuthManager: ``viewer``
may read every DAG, ``user`` may also edit them). The browser path (login, the UI's frame) is
``tests/e2e/test_triage_browser.py``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from tests.ledger.helpers import new_jobs
from triage.contracts.documents import canonical_json_bytes
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, NewJob, SendToReview
from triage.payloads import PayloadStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.web.service import TriageService

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
LABELS = ["billing", "shipping", "refund_request"]
HOSTILE = "<script>alert('owned')</script><b>bold</b> & more"


@pytest.fixture(scope="module")
def airflow_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Airflow's SimpleAuthManager with three users, as the API server initialises it."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("airflow-home")
        mp.setenv("AIRFLOW_HOME", str(home))
        mp.setenv(
            "AIRFLOW__CORE__AUTH_MANAGER",
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        )
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "viewer:viewer,editor:user,second:user")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-jwt-secret-" + uuid.uuid4().hex)
        # Airflow checks every token against its revoked tokens (metadata table revoked_token):
        # an SQLite metadata database of this module's own, holding that table.
        mp.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db")
        from airflow import settings
        from airflow.api_fastapi import app as airflow_app
        from airflow.models.revoked_token import RevokedToken

        settings.dispose_orm()
        settings.configure_vars()
        settings.configure_orm()
        RevokedToken.__table__.create(settings.engine)
        parsed_dags(settings.engine, PARSED_DAGS)
        airflow_app.purge_cached_app()
        _forget_token_keys()
        manager = airflow_app.init_auth_manager()
        yield manager
        airflow_app.purge_cached_app()
        _forget_token_keys()
        settings.dispose_orm()
    settings.configure_vars()
    settings.configure_orm()


PARSED_DAGS = ("review_jobs", "reconcile_jobs", "classify_intake")
"""The DAGs whose rights the app asks about, as Airflow knows them once its DAG processor parsed them."""


def parsed_dags(engine: Any, dag_ids: Sequence[str]) -> None:
    """Airflow's ``dag`` table (its own model) in the module's metadata database, holding
    ``dag_ids`` as parsed (not stale): a refusal about a DAG Airflow does not know yet is a 503
    (``triage.web.access.refusal``)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel

    DagBundleModel.__table__.create(engine, checkfirst=True)
    DagModel.__table__.create(engine, checkfirst=True)
    with engine.begin() as conn:
        conn.execute(sa.delete(DagModel.__table__))
        if conn.execute(sa.select(sa.func.count()).select_from(DagBundleModel.__table__)).scalar_one() == 0:
            conn.execute(sa.insert(DagBundleModel.__table__).values(name="dags-folder", active=True))
    with Session(engine) as session, session.begin():
        for dag_id in dag_ids:
            session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", is_stale=False))


def _forget_token_keys() -> None:
    """Drop the JWT signer and validator Airflow caches per auth manager class for the life of the
    process (as a fresh API server starts): else a module's tokens would be signed and checked with
    the secret of whichever module set up Airflow's auth first, and a server process started with
    this module's environment would refuse them."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

    for name in ("_get_token_signer", "_get_token_validator"):
        BaseAuthManager.__dict__[name].__func__.cache_clear()


def token(manager: Any, name: str, role: str) -> str:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return str(manager.generate_jwt(SimpleAuthManagerUser(username=name, role=role)))


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


@pytest.fixture
def client(store: JobStore, payloads: PayloadStore, tmp_path: Path, airflow_auth: Any) -> TestClient:
    from triage.web.app import create_app

    root = FastAPI()
    service = TriageService(store, payload_base=str(tmp_path / "payloads"), taxonomy_names=LABELS)
    root.mount("/triage", create_app(service))
    return TestClient(root, base_url="http://airflow.test")


def as_user(manager: Any, name: str, role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(manager, name, role)}"}


def to_review(
    store: JobStore, payloads: PayloadStore, n: int, *, prefix: str = "doc", reason: str = "inconclusive"
) -> list[uuid.UUID]:
    """``n`` documents stored in the payload store, registered and sent to review."""
    docs = []
    for i, job in enumerate(new_jobs(n, prefix=prefix)):
        body = canonical_json_bytes({"subject": f"Subject {prefix} {i}", "body": f"{HOSTILE} #{i}"})
        sha, ref = payloads.put(body)
        docs.append(NewJob(job.idempotency_key, job.source, job.external_id, sha, ref, job.classifier_version))
    registered = store.register(docs, batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="worker-1")
    model = ClassificationRecord("billing", 0.41, "inconclusive", "keyword-v1")
    store.record(claim, [SendToReview(j.id, j.attempt, reason, classification=model) for j in claim.jobs])
    return list(registered.new_ids)


def ledger(store: JobStore) -> dict[str, list[tuple[Any, ...]]]:
    with store.engine.connect() as conn:
        return {
            table: [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM triage.{table} ORDER BY 1"))]
            for table in ("jobs", "job_events", "manual_review", "document_labels", "outbox")
        }


# -- access -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/triage/api/reviews", "/triage/review", "/triage/api/reports/latest", "/triage/reports/trend"]
)
def test_anonymous_callers_get_401(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 401
    if "/api/" not in path:  # a page says so as a page, with Airflow's login link
        assert "/auth/login" in response.text


def test_a_forged_token_gets_403(client: TestClient) -> None:
    response = client.get("/triage/api/reviews", headers={"Authorization": "Bearer not.a.jwt"})
    assert response.status_code == 403


def test_a_reader_may_look_but_not_decide(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    [job_id] = to_review(store, payloads, 1)
    viewer = as_user(airflow_auth, "viewer", "viewer")
    assert client.get("/triage/api/reviews", headers=viewer).json()["reviews"][0]["job_id"] == str(job_id)
    page = client.get(f"/triage/review/jobs/{job_id}", headers=viewer)
    assert page.status_code == 200
    assert 'id="read-only"' in page.text
    assert 'id="decide"' not in page.text
    before = ledger(store)
    refused = client.post(f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=viewer)
    assert refused.status_code == 403
    assert "look but not decide" in refused.json()["detail"]
    assert ledger(store) == before


def test_an_editor_labels_a_job_recorded_as_them(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    [job_id] = to_review(store, payloads, 1)
    body = {"action": "label", "label": "shipping", "note": "it is about a parcel"}
    done = client.post(f"/triage/api/reviews/{job_id}", json=body, headers=as_user(airflow_auth, "editor", "user"))
    assert done.status_code == 200, done.text
    assert done.json() | {"resolved_at": None} == {
        "job_id": str(job_id),
        "outcome": "applied",
        "status": "completed",
        "resolved_by": "editor",
        "resolved_at": None,
        "label_action": None,
    }
    detail = client.get(f"/triage/api/jobs/{job_id}", headers=as_user(airflow_auth, "viewer", "viewer")).json()
    last = detail["events"][-1]
    assert (last["from_status"], last["to_status"], last["actor"]) == ("manual_review", "completed", "editor")
    assert detail["reviews"][-1]["resolution"] == "labelled"
    assert detail["reviews"][-1]["note"] == "it is about a parcel"
    assert detail["classifications"][-1]["label"] == "billing"  # the model's; the human's is the label row
    with store.engine.connect() as conn:
        label = conn.execute(sa.text("SELECT label, classifier_version FROM triage.document_labels")).one()
    assert tuple(label) == ("shipping", "human:editor")


# -- bad input changes nothing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "body", "status", "says"),
    [
        pytest.param("unknown", {"action": "reject"}, 404, "does not exist", id="unknown-job"),
        pytest.param("not-a-uuid", {"action": "reject"}, 422, "uuid", id="not-a-uuid"),
        pytest.param("open", {"action": "label", "label": "pizza"}, 422, "not in the taxonomy", id="label-outside"),
        pytest.param("open", {"action": "label"}, 422, "needs a label", id="label-missing"),
        pytest.param("open", {"action": "reject", "label": "billing"}, 422, "only for decision", id="label-on-reject"),
        pytest.param("open", {"action": "delete"}, 422, "action", id="unknown-action"),
        pytest.param("open", {"label": "billing"}, 422, "action", id="no-action"),
        pytest.param("open", {"action": "reject", "extra": 1}, 422, "extra", id="extra-field"),
        pytest.param("open", {"action": "reject", "note": "x" * 2001}, 422, "note", id="note-too-long"),
        pytest.param("done", {"action": "reject"}, 409, "not in manual_review", id="no-longer-in-review"),
    ],
)
def test_bad_decisions_get_a_4xx_and_change_nothing(
    client: TestClient,
    store: JobStore,
    payloads: PayloadStore,
    airflow_auth: Any,
    target: str,
    body: dict[str, Any],
    status: int,
    says: str,
) -> None:
    open_id, done_id = to_review(store, payloads, 2)
    editor = as_user(airflow_auth, "editor", "user")
    assert client.post(f"/triage/api/reviews/{done_id}", json={"action": "requeue"}, headers=editor).status_code == 200
    job = {"unknown": str(uuid.uuid4()), "not-a-uuid": "not-a-uuid", "open": str(open_id), "done": str(done_id)}
    before = ledger(store)
    response = client.post(f"/triage/api/reviews/{job[target]}", json=body, headers=editor)
    assert response.status_code == status, response.text
    assert says in str(response.json()["detail"]).lower()
    assert ledger(store) == before


@pytest.mark.parametrize(
    ("query", "says"),
    [
        pytest.param("limit=0", "limit", id="limit-zero"),
        pytest.param("limit=501", "limit", id="limit-too-big"),
        pytest.param("limit=ten", "limit", id="limit-text"),
        pytest.param("cursor=bm9wZQ", "cursor", id="forged-cursor"),
        pytest.param("older_than=-5", "older_than", id="negative-age"),
        pytest.param("older_than=soon", "older_than", id="age-text"),
        pytest.param("reason=" + "r" * 501, "reason", id="reason-too-long"),
    ],
)
def test_bad_queries_get_400(client: TestClient, airflow_auth: Any, query: str, says: str) -> None:
    response = client.get(f"/triage/api/reviews?{query}", headers=as_user(airflow_auth, "viewer", "viewer"))
    assert response.status_code == 400
    assert says in response.json()["detail"]


def test_unknown_job_and_report_get_404(client: TestClient, airflow_auth: Any) -> None:
    viewer = as_user(airflow_auth, "viewer", "viewer")
    assert client.get(f"/triage/api/jobs/{uuid.uuid4()}", headers=viewer).status_code == 404
    assert client.get("/triage/api/reports/latest", headers=viewer).status_code == 404
    assert client.get("/triage/api/reports/12345", headers=viewer).status_code == 404


# -- concurrent reviewers -------------------------------------------------------------------------


def test_the_second_of_two_reviewers_sees_already_decided(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    [job_id] = to_review(store, payloads, 1)
    first = client.post(
        f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=as_user(airflow_auth, "editor", "user")
    )
    second = client.post(
        f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=as_user(airflow_auth, "second", "user")
    )
    assert first.status_code == 200
    assert second.status_code == 409
    assert "already decided (reject) by editor" in second.json()["detail"]
    again = client.post(
        f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=as_user(airflow_auth, "editor", "user")
    )
    assert again.status_code == 200
    assert again.json()["outcome"] == "already_applied"


@pytest.mark.own_database  # two threads race for one row's lock
def test_concurrent_reviewers_never_both_win(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    job_ids = to_review(store, payloads, 8)
    reviewers = [("editor", {"action": "label", "label": "shipping"}), ("second", {"action": "reject"})]
    results: dict[tuple[str, uuid.UUID], int] = {}
    start = threading.Barrier(2)

    def review(name: str, body: dict[str, Any]) -> None:
        headers = as_user(airflow_auth, name, "user")
        start.wait()
        for job_id in job_ids:
            results[(name, job_id)] = client.post(
                f"/triage/api/reviews/{job_id}", json=body, headers=headers
            ).status_code

    threads = [threading.Thread(target=review, args=r) for r in reviewers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job_id in job_ids:
        codes = sorted(results[(name, job_id)] for name, _ in reviewers)
        assert codes == [200, 409], (job_id, codes)
    with store.engine.connect() as conn:
        decided = conn.execute(
            sa.text("SELECT count(*) FROM triage.job_events WHERE from_status = 'manual_review'")
        ).scalar_one()
    assert decided == len(job_ids)


# -- the queue, a page at a time -------------------------------------------------------------------


def test_the_queue_pages_with_a_cursor_and_filters(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    ids = to_review(store, payloads, 7)
    other = to_review(store, payloads, 2, prefix="odd", reason="rejected_output")
    viewer = as_user(airflow_auth, "viewer", "viewer")
    seen: list[str] = []
    cursor = None
    for expected in (3, 3, 3):
        query = "limit=3&reason=inconclusive" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(f"/triage/api/reviews?{query}", headers=viewer).json()
        seen += [r["job_id"] for r in page["reviews"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert len(page["reviews"]) == expected
    assert sorted(seen) == sorted(str(i) for i in ids)
    assert len(seen) == 7
    odd = client.get("/triage/api/reviews?reason=rejected_output", headers=viewer).json()["reviews"]
    assert sorted(r["job_id"] for r in odd) == sorted(str(i) for i in other)
    assert client.get("/triage/api/reviews?source=elsewhere", headers=viewer).json()["reviews"] == []
    assert len(client.get("/triage/api/reviews", params={"batch": BATCH}, headers=viewer).json()["reviews"]) == 9
    assert client.get("/triage/api/reviews?older_than=3600", headers=viewer).json()["reviews"] == []
    html = client.get("/triage/review?limit=4", headers=viewer).text
    assert html.count('class="job"') == 4
    assert 'id="next"' in html


# -- the job page ---------------------------------------------------------------------------------


def test_the_job_page_shows_the_document_as_text(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    [job_id] = to_review(store, payloads, 1)
    page = client.get(f"/triage/review/jobs/{job_id}", headers=as_user(airflow_auth, "editor", "user"))
    assert page.status_code == 200
    assert "<script>" not in page.text
    assert "&lt;script&gt;alert(" in page.text
    assert "Subject doc 0" in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none': no script runs
    assert page.text.count("<option") == len(LABELS)
    assert 'id="decide"' in page.text
    assert page.text.count("<td>running</td>") == 2  # the transitions: queued -> running -> manual_review
    document = client.get(f"/triage/api/jobs/{job_id}/document", headers=as_user(airflow_auth, "viewer", "viewer"))
    assert document.headers["content-type"].startswith("text/plain")
    assert HOSTILE in document.text


def test_a_document_whose_hash_does_not_match_is_not_shown(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    [job_id] = to_review(store, payloads, 1)
    with store.engine.connect() as conn:
        ref = conn.execute(sa.text("SELECT payload_ref FROM triage.jobs WHERE id = :id"), {"id": job_id}).scalar_one()
    path = payloads.object_path(ref)
    path.write_bytes(path.read_bytes().replace(b"Subject", b"Tampered"))
    page = client.get(f"/triage/review/jobs/{job_id}", headers=as_user(airflow_auth, "viewer", "viewer"))
    assert 'id="document-problem"' in page.text
    assert "Tampered" not in page.text


# -- the pages' forms: cookie, form token, origin -------------------------------------------------


def test_a_form_post_needs_the_page_s_token(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    first, second = to_review(store, payloads, 2)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    page = client.get(f"/triage/review/jobs/{first}").text
    csrf = page.split('name="csrf_token" value="')[1].split('"')[0]
    before = ledger(store)
    forged = client.post(f"/triage/review/jobs/{first}", data={"action": "reject"})
    assert forged.status_code == 403
    assert ledger(store) == before
    elsewhere = client.post(
        f"/triage/review/jobs/{first}",
        data={"action": "reject", "csrf_token": csrf},
        headers={"Origin": "http://evil.test"},
    )
    assert elsewhere.status_code == 403
    assert ledger(store) == before
    as_text = client.post(
        f"/triage/api/reviews/{first}", content='{"action": "reject"}', headers={"Content-Type": "text/plain"}
    )
    assert as_text.status_code == 422
    assert ledger(store) == before
    done = client.post(
        f"/triage/review/jobs/{first}",
        data={"action": "label", "label": "refund_request", "note": "n", "csrf_token": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"].endswith("decided=applied")
    assert 'id="decided"' in client.get(done.headers["location"]).text
    late = client.post(f"/triage/review/jobs/{first}", data={"action": "reject", "csrf_token": csrf})
    assert late.status_code == 409
    assert "already resolved" in late.text
    # a bulk decision: previewed, then applied to the ticked jobs only
    preview = client.get("/triage/review/bulk?reason=inconclusive").text
    assert str(second) in preview
    assert str(first) not in preview
    bulk = client.post("/triage/review/bulk", data={"action": "reject", "job_id": [str(second)], "csrf_token": csrf})
    assert bulk.status_code == 200
    assert "applied 1" in bulk.text
    client.cookies.clear()


# -- reports from the database ----------------------------------------------------------------------


def test_reports_render_from_the_database(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any, tmp_path: Path
) -> None:
    to_review(store, payloads, 3)
    first = reconcile(store, ReconcileParams(dry_run=True), dag_run_id="manual__2026-12-01T00:00:00+00:00")
    second = reconcile(store, ReconcileParams(dry_run=True), dag_run_id="scheduled__2026-12-01T00:15:00+00:00")
    viewer = as_user(airflow_auth, "viewer", "viewer")
    latest = client.get("/triage/api/reports/latest", headers=viewer).json()
    assert latest["id"] == second.run_id
    assert latest["before"] == first.run_id
    assert latest["after"] is None
    assert latest["summary"]["totals"]["open_reviews"] == 3
    tab = client.get("/triage/reports/airflow/reconcile_jobs/manual__2026-12-01T00:00:00+00:00", headers=viewer)
    assert tab.status_code == 200
    assert f"Triage reconciliation run {first.run_id}" in tab.text
    assert tab.text.count("<svg") == 8  # six, and the Quality section's two
    assert "/triage/review/jobs/" in tab.text
    other = client.get("/triage/reports/airflow/classify_documents/manual__x", headers=viewer)
    assert other.status_code == 404
    assert "belong to reconcile_jobs runs" in other.text
    trend = client.get("/triage/api/reports/trend", headers=viewer).json()["runs"]
    assert [r["id"] for r in trend] == [first.run_id, second.run_id]
    assert trend[-1]["open_reviews"] == 3
    assert trend[-1]["unfinished"] == 0
    # Each run's quality per classifier version (three inconclusive answers: none accepted, none audited).
    assert [r["quality"] for r in trend] == [[{"version": "keyword-v1", "coverage": 0.0, "precision": None}]] * 2
    trend_page = client.get("/triage/reports/trend", headers=viewer).text
    assert trend_page.count("<svg") == 4  # backlog, repairs, and coverage and audited precision per version
    assert "Coverage per classifier version (%)" in trend_page
    assert f"run {first.run_id} keyword-v1: 0" in trend_page  # the first run's point of the version


# -- the form token and the origin (issue #25, finding 5) ----------------------------------------------


def _form_token(client: TestClient, job_id: uuid.UUID) -> str:
    page = client.get(f"/triage/review/jobs/{job_id}").text
    return page.split('name="csrf_token" value="')[1].split('"')[0]


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param("Basic ZWRpdG9yOmVkaXRvcg==", id="basic"),
        pytest.param("Bearer", id="bearer-without-token"),
        pytest.param("Token whatever", id="other-scheme"),
    ],
)
def test_an_authorization_header_does_not_switch_off_a_cookie_form_s_checks(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any, authorization: str
) -> None:
    """Airflow takes the caller from the cookie when the header is no bearer token: the request
    is the session's, and its form token and origin are checked as for any form post."""
    [job_id] = to_review(store, payloads, 1)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    csrf = _form_token(client, job_id)
    before = ledger(store)
    headers = {"Authorization": authorization}
    assert client.post(f"/triage/review/jobs/{job_id}", data={"action": "reject"}, headers=headers).status_code == 403
    elsewhere = {**headers, "Origin": "http://evil.test"}
    answer = client.post(
        f"/triage/review/jobs/{job_id}", data={"action": "reject", "csrf_token": csrf}, headers=elsewhere
    )
    assert answer.status_code == 403
    api = client.post(f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=elsewhere)
    assert api.status_code == 403
    assert ledger(store) == before
    client.cookies.clear()


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param("null", id="null"),
        pytest.param("NULL", id="null-upper"),
        pytest.param(" null ", id="null-spaced"),
        pytest.param("", id="empty"),
        pytest.param("http://airflow.test:9999", id="another-port"),
        pytest.param("http://airflow.test.evil.test", id="a-longer-host"),
        pytest.param("http://[", id="unparsable"),  # urlsplit raises ValueError: a 500 before
        pytest.param("http://[zz]", id="not-an-address"),
    ],
)
def test_origin_null_is_refused(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any, origin: str
) -> None:
    [job_id] = to_review(store, payloads, 1)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    csrf = _form_token(client, job_id)
    before = ledger(store)
    null = {"Origin": origin}
    form = client.post(f"/triage/review/jobs/{job_id}", data={"action": "reject", "csrf_token": csrf}, headers=null)
    assert form.status_code == 403
    assert client.post(f"/triage/api/reviews/{job_id}", json={"action": "reject"}, headers=null).status_code == 403
    assert ledger(store) == before
    client.cookies.clear()


def test_the_form_token_is_bound_to_the_session(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    import hashlib
    import hmac

    from airflow.configuration import conf

    [job_id] = to_review(store, payloads, 1)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    first_session = _form_token(client, job_id)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))  # the same user logs in again
    second_session = _form_token(client, job_id)
    assert first_session != second_session
    key = conf.get("api_auth", "jwt_secret").encode()
    of_the_user_alone = hmac.new(key, b"triage-form:editor", hashlib.sha256).hexdigest()  # the old, eternal token
    before = ledger(store)
    for stale in (first_session, of_the_user_alone):
        refused = client.post(f"/triage/review/jobs/{job_id}", data={"action": "reject", "csrf_token": stale})
        assert refused.status_code == 403
        assert "stale" in refused.text
    client.cookies.clear()
    bearer = as_user(airflow_auth, "editor", "user")  # a form post without a session has no token to show
    no_session = client.post(
        f"/triage/review/jobs/{job_id}", data={"action": "reject", "csrf_token": second_session}, headers=bearer
    )
    assert no_session.status_code == 403
    assert ledger(store) == before
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    fresh = _form_token(client, job_id)
    done = client.post(
        f"/triage/review/jobs/{job_id}", data={"action": "reject", "csrf_token": fresh}, follow_redirects=False
    )
    assert done.status_code == 303
    client.cookies.clear()


def test_a_bearer_token_beside_the_cookie_does_not_borrow_the_session_s_form(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    """Airflow takes the caller from a bearer token over the cookie; the form token is the
    (caller, session) pair's, so another user's bearer token with the editor's session and form
    token is refused, and the editor's own bearer token with them is the editor's form post."""
    [job_id] = to_review(store, payloads, 1)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    csrf = _form_token(client, job_id)
    before = ledger(store)
    form = {"action": "reject", "csrf_token": csrf}
    other = client.post(f"/triage/review/jobs/{job_id}", data=form, headers=as_user(airflow_auth, "boss", "admin"))
    assert other.status_code == 403
    assert ledger(store) == before
    own = as_user(airflow_auth, "editor", "user")
    assert (
        client.post(f"/triage/review/jobs/{job_id}", data=form, headers=own, follow_redirects=False).status_code == 303
    )
    client.cookies.clear()


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param("\u00e9" * 64, id="non-ascii"),
        pytest.param("0" * 100_000, id="long"),
    ],
)
def test_a_forged_form_token_of_any_text_is_refused_not_a_crash(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any, forged: str
) -> None:
    """``hmac.compare_digest`` raises TypeError for a str that is not ASCII: a form token is
    compared as bytes, so any text posted is a 403, never a 500."""
    [job_id] = to_review(store, payloads, 1)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    before = ledger(store)
    for path, data in ((f"/triage/review/jobs/{job_id}", {}), ("/triage/review/bulk", {"job_id": str(job_id)})):
        answer = client.post(path, data={"action": "reject", "csrf_token": forged, **data})
        assert answer.status_code == 403, answer.text
        assert "stale" in answer.text
    assert ledger(store) == before
    client.cookies.clear()


@pytest.mark.parametrize(
    "review_id",
    [
        pytest.param(2**63, id="2^63"),
        pytest.param(-1, id="negative"),
        pytest.param(10**30, id="huge"),
        pytest.param("9" * 5000, id="past-int-parsing"),
        pytest.param("12a", id="not-a-number"),
    ],
)
def test_a_cursor_outside_the_columns_range_answers_400(
    client: TestClient, airflow_auth: Any, review_id: int | str
) -> None:
    import base64

    cursor = base64.urlsafe_b64encode(f"2026-12-01T00:00:00+00:00|{review_id}".encode()).decode().rstrip("=")
    viewer = as_user(airflow_auth, "viewer", "viewer")
    response = client.get(f"/triage/api/reviews?cursor={cursor}", headers=viewer)
    assert response.status_code == 400
    assert "cursor" in response.json()["detail"]
    assert client.get(f"/triage/review?cursor={cursor}", headers=viewer).status_code == 400
    assert client.get(f"/triage/api/reports/{2**63}", headers=viewer).status_code == 422
    assert client.get(f"/triage/reports/{2**63}", headers=viewer).status_code == 422


def test_a_cursor_at_the_top_of_the_columns_range_is_a_page(client: TestClient, airflow_auth: Any) -> None:
    import base64

    cursor = base64.urlsafe_b64encode(f"2026-12-01T00:00:00+00:00|{2**63 - 1}".encode()).decode().rstrip("=")
    viewer = as_user(airflow_auth, "viewer", "viewer")
    assert client.get(f"/triage/api/reviews?cursor={cursor}", headers=viewer).status_code == 200
    assert client.get(f"/triage/api/reports/{2**63 - 1}", headers=viewer).status_code == 404


# -- audit samples (issue #27, item 5) ----------------------------------------------------------


def audit_sample(store: JobStore, payloads: PayloadStore) -> uuid.UUID:
    """A document auto-accepted as ``shipping`` and completed as an audit sample."""
    [job] = new_jobs(1, prefix="audit")
    sha, ref = payloads.put(canonical_json_bytes({"subject": "Where is my parcel", "body": "It is late."}))
    doc = NewJob(job.idempotency_key, job.source, job.external_id, sha, ref, job.classifier_version)
    store.register([doc], batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-1")
    model = ClassificationRecord("shipping", 0.95, "accepted", "keyword-v1")
    label = LabelWrite("shipping", 0.95, "keyword-v1")
    store.record(claim, [Complete(j.id, j.attempt, label, model, audit=True) for j in claim.jobs])
    return claim.jobs[0].id


def test_an_audit_sample_is_confirmed_or_corrected_never_requeued_or_rejected(
    client: TestClient, store: JobStore, payloads: PayloadStore, airflow_auth: Any
) -> None:
    job_id = audit_sample(store, payloads)
    editor, viewer = as_user(airflow_auth, "editor", "user"), as_user(airflow_auth, "viewer", "viewer")
    [in_review] = to_review(store, payloads, 1)
    queue = client.get("/triage/api/reviews?reason=audit_sample", headers=viewer).json()
    assert [r["job_id"] for r in queue["reviews"]] == [str(job_id)]
    of_batch = client.get("/triage/api/reviews", params={"batch": BATCH}, headers=viewer).json()
    assert {r["job_id"] for r in of_batch["reviews"]} == {str(job_id), str(in_review)}
    page = client.get(f"/triage/review/jobs/{job_id}", headers=editor).text
    assert 'id="audit-sample"' in page
    assert 'id="decide"' in page
    assert 'value="requeue"' not in page
    assert 'value="reject"' not in page
    before = ledger(store)
    for action in ("reject", "requeue"):
        refused = client.post(f"/triage/api/reviews/{job_id}", json={"action": action}, headers=editor)
        assert refused.status_code == 409, refused.text
        assert (
            f"audit sample: confirm or correct its label (action label); {action} applies" in refused.json()["detail"]
        )
    assert ledger(store) == before
    body = {"action": "label", "label": "billing", "note": "an invoice"}
    done = client.post(f"/triage/api/reviews/{job_id}", json=body, headers=editor)
    assert (done.status_code, done.json()["outcome"], done.json()["status"]) == (200, "applied", "completed")
    after = ledger(store)
    again = client.post(f"/triage/api/reviews/{job_id}", json=body, headers=editor)
    assert (again.status_code, again.json()["outcome"]) == (200, "already_applied")
    assert ledger(store) == after
    second = client.post(f"/triage/api/reviews/{job_id}", json=body, headers=as_user(airflow_auth, "second", "user"))
    assert second.status_code == 409
    detail = client.get(f"/triage/api/jobs/{job_id}", headers=viewer).json()
    last = detail["events"][-1]
    assert (last["from_status"], last["to_status"], last["actor"]) == ("completed", "completed", "editor")
    assert last["reason"] == "corrected: label 'shipping' -> 'billing'; note: an invoice"
    decided = client.get(f"/triage/review/jobs/{job_id}", headers=editor).text
    assert 'id="decided"' in decided
    assert "corrected by <strong>editor</strong>" in decided
