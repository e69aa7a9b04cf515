"""One review at a time, least sure first (issue #27, item 6), through the FastAPI app on the real
database behind Airflow's real auth manager: the API's ``order=uncertainty`` and its cursors, the
page's HTML, and its decisions (same rules as the job page's form) with the next review opening.
The keys in a real browser: ``tests/e2e/test_triage_browser.py``."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.ledger import test_triage_web
from tests.ledger.helpers import new_jobs
from tests.ledger.test_triage_web import BATCH, HOSTILE, as_user, ledger, token
from triage.contracts.documents import canonical_json_bytes
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, NewJob, SendToReview
from triage.payloads import PayloadStore

airflow_auth = test_triage_web.airflow_auth  # the fixtures: Airflow's auth manager, the app under /triage
client = test_triage_web.client

# (name, reason, candidates): margins 0.05, 0.6, and a label without candidates at 0.3
SEEDED = [
    ("sure", "inconclusive", (("billing", 0.75), ("shipping", 0.15))),
    ("close", "inconclusive", (("shipping", 0.5), ("billing", 0.45), ("refund_request", 0.05))),
    ("audit", "audit_sample", ()),
]


NAN_CURSOR = base64.urlsafe_b64encode(b"u|nan|2026-11-01T00:00:00+00:00|1").decode().rstrip("=")


def seed(store: JobStore, payloads: PayloadStore) -> dict[str, uuid.UUID]:
    """Three documents sent to review one after another, each with its model answer."""
    ids = {}
    for name, reason, candidates in SEEDED:
        [job] = new_jobs(1, prefix=name)
        sha, ref = payloads.put(canonical_json_bytes({"subject": f"Subject {name}", "body": f"{HOSTILE} ({name})"}))
        doc = NewJob(job.idempotency_key, job.source, job.external_id, sha, ref, job.classifier_version)
        store.register([doc], batch_key=BATCH, step="classify", max_attempts=3)
        claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="w")
        [held] = claim.jobs
        label, confidence = candidates[0] if candidates else ("billing", 0.3)
        model = ClassificationRecord(label, confidence, "inconclusive", "learned-t", candidates=candidates or None)
        store.record(claim, [SendToReview(held.id, held.attempt, reason, classification=model)])
        ids[name] = held.id
    return ids


def csrf(html: str) -> str:
    return html.split('name="csrf_token" value="')[1].split('"')[0]


def buttons(html: str) -> list[str]:
    """The label buttons' values in the order shown."""
    return [part.split('"')[0] for part in html.split('name="decision" value="label:')[1:]]


@pytest.fixture
def ids(store: JobStore, payloads: PayloadStore) -> dict[str, uuid.UUID]:
    return seed(store, payloads)


def test_the_api_orders_by_uncertainty_with_its_own_cursors(
    client: TestClient, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    viewer = as_user(airflow_auth, "viewer", "viewer")
    first = client.get("/triage/api/reviews?order=uncertainty&limit=2", headers=viewer).json()
    assert [r["job_id"] for r in first["reviews"]] == [str(ids["close"]), str(ids["audit"])]
    assert first["order"] == "uncertainty"
    assert first["reviews"][0]["candidates"][0] == {"label": "shipping", "score": 0.5}
    assert first["reviews"][0]["uncertainty"] == pytest.approx(0.05)
    rest = client.get(f"/triage/api/reviews?order=uncertainty&cursor={first['next_cursor']}", headers=viewer).json()
    assert [r["job_id"] for r in rest["reviews"]] == [str(ids["sure"])]
    assert rest["next_cursor"] is None
    oldest = client.get("/triage/api/reviews", headers=viewer).json()  # the default order is unchanged
    assert [r["job_id"] for r in oldest["reviews"]] == [str(ids[n]) for n in ("sure", "close", "audit")]
    # a cursor of one order is refused by the other, never misread; so are bad orders and cursors
    default_cursor = client.get("/triage/api/reviews?limit=1", headers=viewer).json()["next_cursor"]
    for query, says in [
        (f"order=uncertainty&cursor={default_cursor}", "order=uncertainty"),
        (f"cursor={first['next_cursor']}", "not a cursor"),
        ("order=newest", "order: one of oldest, uncertainty"),
        (f"order=uncertainty&cursor={NAN_CURSOR}", "order=uncertainty"),
    ]:
        response = client.get(f"/triage/api/reviews?{query}", headers=viewer)
        assert response.status_code == 400, query
        assert says in response.json()["detail"]


def test_the_page_shows_the_least_sure_document_its_candidates_and_keys(
    client: TestClient, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    page = client.get("/triage/review/next", headers=as_user(airflow_auth, "editor", "user"))
    assert page.status_code == 200
    html = page.text
    assert "Subject close" in html
    assert "<script>alert" not in html  # the document's text, escaped
    assert "&lt;script&gt;alert(" in html
    assert '<code id="reason">inconclusive</code>' in html
    assert 'id="candidates"' in html
    assert html.index("<code>shipping</code>") < html.index("<code>billing</code>") < html.index("<code>refund")
    assert buttons(html) == ["shipping", "billing", "refund_request"]  # the candidates first, best first
    assert 'data-key="1" accesskey="1"' in html
    for key in "rxs":
        assert f'data-key="{key}" accesskey="{key}"' in html
    assert "Keys:" in html
    assert str(ids["sure"]) not in html  # one document, not a list of jobs
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    script = client.get("/triage/review/keys.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "data-key" in script.text
    queue = client.get("/triage/review", headers=as_user(airflow_auth, "viewer", "viewer")).text
    assert 'id="one-at-a-time"' in queue
    assert (
        "script-src"
        not in client.get("/triage/review", headers=as_user(airflow_auth, "viewer", "viewer")).headers[
            "content-security-policy"
        ]
    )


def test_deciding_opens_the_next_one_through_the_same_decisions(
    client: TestClient, store: JobStore, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    html = client.get("/triage/review/next").text
    done = client.post(
        f"/triage/review/next/{ids['close']}",
        data={"decision": "label:shipping", "note": "a parcel", "cursor": "", "csrf_token": csrf(html)},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/triage/review/next?decided=applied"
    following = client.get(done.headers["location"]).text
    assert 'id="notice"' in following
    assert "Subject audit" in following  # the next least sure: the audit sample, its one label shown
    assert '<code id="reason">audit_sample</code>' in following
    assert buttons(following)[0] == "billing"
    with store.engine.connect() as conn:
        review = conn.execute(
            sa.text("SELECT resolution, resolved_by, note FROM triage.manual_review WHERE job_id = :id"),
            {"id": ids["close"]},
        ).one()
        label = conn.execute(
            sa.text("SELECT label, classifier_version FROM triage.document_labels WHERE job_id = :id"),
            {"id": ids["close"]},
        ).one()
        actor = conn.execute(
            sa.text("SELECT actor FROM triage.job_events WHERE job_id = :id ORDER BY id DESC LIMIT 1"),
            {"id": ids["close"]},
        ).scalar_one()
    assert tuple(review) == ("labelled", "editor", "a parcel")
    assert tuple(label) == ("shipping", "human:editor")
    assert actor == "editor"
    # the same key again (a double press): already applied, nothing written
    before = ledger(store)
    again = client.post(
        f"/triage/review/next/{ids['close']}",
        data={"decision": "label:shipping", "cursor": "", "csrf_token": csrf(html)},
        follow_redirects=False,
    )
    assert again.headers["location"].endswith("decided=already_applied")
    assert ledger(store) == before
    client.cookies.clear()


def test_skip_moves_past_a_review_and_decisions_keep_the_place(
    client: TestClient, store: JobStore, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    first = client.get("/triage/review/next").text
    skip = first.split('id="skip" data-key="s" accesskey="s"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = client.get(skip.replace("&amp;", "&")).text
    assert "Subject audit" in second
    cursor = second.split('name="cursor" value="')[1].split('"')[0]
    assert cursor
    rejected = client.post(
        f"/triage/review/next/{ids['audit']}",
        data={"decision": "reject", "cursor": cursor, "csrf_token": csrf(second)},
        follow_redirects=False,
    )
    assert rejected.status_code == 303
    third = client.get(rejected.headers["location"]).text
    assert "Subject sure" in third  # after the skipped one, past the decided one
    requeued = client.post(
        f"/triage/review/next/{ids['sure']}",
        data={"decision": "requeue", "cursor": cursor, "csrf_token": csrf(third)},
        follow_redirects=False,
    )
    end = client.get(requeued.headers["location"]).text
    assert 'id="empty"' in end
    restart = end.split('id="restart" href="')[1].split('"')[0]
    assert "Subject close" in client.get(restart).text  # the skipped one is still open
    assert store.get_status(ids["audit"]).value == "terminal_failed"
    assert store.get_status(ids["sure"]).value == "queued"
    client.cookies.clear()


def test_the_page_s_decisions_keep_the_form_s_rules(
    client: TestClient, store: JobStore, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))
    html = client.get("/triage/review/next").text
    before = ledger(store)
    target = f"/triage/review/next/{ids['close']}"
    assert client.post(target, data={"decision": "reject", "cursor": ""}).status_code == 403  # no form token
    foreign = client.post(
        target, data={"decision": "reject", "csrf_token": csrf(html)}, headers={"Origin": "http://evil.test"}
    )
    assert foreign.status_code == 403
    bad = client.post(target, data={"decision": "label:not_a_label", "csrf_token": csrf(html)})
    assert bad.status_code == 422
    assert "not in the taxonomy" in bad.text
    assert "Subject close" in bad.text  # the same review again, saying why
    assert client.post(target, data={"decision": "replay", "csrf_token": csrf(html)}).status_code == 422
    assert ledger(store) == before
    client.cookies.clear()
    # a reader sees the page without buttons and may not decide
    client.cookies.set("_token", token(airflow_auth, "viewer", "viewer"))
    reader = client.get("/triage/review/next").text
    assert 'id="read-only"' in reader
    assert 'name="decision"' not in reader
    assert client.post(target, data={"decision": "reject", "csrf_token": "x"}).status_code == 403
    client.cookies.clear()
    # the second of two reviewers: 409, the next review opens with the reason
    store.review.reject(ids["close"], actor="second", note=None)
    client.cookies.set("_token", token(airflow_auth, "editor", "user"))  # a new session: its own form token
    fresh = csrf(client.get("/triage/review/next").text)
    late = client.post(target, data={"decision": "label:billing", "csrf_token": fresh})
    assert late.status_code == 409
    assert 'id="problem"' in late.text
    assert "Subject audit" in late.text
    client.cookies.clear()


def test_the_queue_page_pages_least_sure_first(
    client: TestClient, ids: dict[str, uuid.UUID], airflow_auth: Any
) -> None:
    viewer = as_user(airflow_auth, "viewer", "viewer")
    first = client.get("/triage/review?order=uncertainty&limit=2", headers=viewer)
    assert first.status_code == 200
    html = first.text
    assert "least sure first</span></h1>" in html
    assert html.index(str(ids["close"])) < html.index(str(ids["audit"]))
    assert str(ids["sure"]) not in html
    assert '<td class="n uncertainty">0.05</td>' in html
    following = html.split('id="next" href="')[1].split('"')[0].replace("&amp;", "&")
    assert "order=uncertainty" in following
    rest = client.get(following, headers=viewer).text
    assert str(ids["sure"]) in rest
    assert str(ids["close"]) not in rest
    oldest = client.get("/triage/review", headers=viewer).text  # the default order and page, unchanged
    assert "oldest first</span></h1>" in oldest
    assert 'class="n uncertainty"' not in oldest
    assert (
        client.get(
            f"/triage/review?{following.split('?')[1].replace('order=uncertainty', '')}", headers=viewer
        ).status_code
        == 400
    )
