"""The Triage plugin in a real Airflow, driven by a real headless Chromium (slow).

A reviewer logs in on Airflow's own login page (the SimpleAuthManager, as under ``make up``),
opens the "Triage" entry of the navigation, opens a job from the queue, sees its document (as
text: a script in it stays text) and its transitions, and labels it; the ledger then shows the
move with the reviewer as its actor. On the one-at-a-time page (least sure first) a key press
labels the document with the model's first candidate and the next document opens; ``s`` skips.
The report tab of a ``reconcile_jobs`` run page shows that run's report, rendered from the
database.

Owns the batch :data:`BATCH` and ``reconcile_jobs``' run ``browser_report``; the queue it reads is
filtered to its batch (other tests of the e2e deployment leave reviews of their own).

``TRIAGE_SCREENSHOTS=DIR`` keeps the screenshots (docs/review.md's are made so); else they go to
the test's tmp folder.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from pathlib import Path

import sqlalchemy as sa

from tests.e2e.conftest import E2E
from tests.harness.airflow import wait_for_runs
from tests.harness.cdp import Chromium
from tests.harness.deployment import Deployment
from tests.ledger.helpers import new_jobs
from tests.ledger.test_reconcile_report import chromium, png_size

ROOT = Path(__file__).resolve().parents[2]
BATCH = "2026-10-05T00:00:00+00:00/2026-10-06T00:00:00+00:00"
SCRIPT = "<script>document.title = 'owned'</script>"
REPORT_RUN = "browser_report"


def seed_reviews(deployment: Deployment, n: int) -> list[str]:
    """``n`` documents in the deployment's payload store, registered and sent to review."""
    from triage.contracts.documents import canonical_json_bytes
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.models import ClassificationRecord, NewJob, SendToReview
    from triage.payloads import PayloadStore

    payloads = PayloadStore(deployment.home / "payloads")  # TRIAGE_HOME/payloads: the server's default
    docs = []
    for i, job in enumerate(new_jobs(n, prefix=f"ui-{uuid.uuid4().hex[:6]}")):
        body = f"Where is my parcel? It was due on Monday. {SCRIPT} (order {i})"
        sha, ref = payloads.put(canonical_json_bytes({"subject": f"Parcel question {i}", "body": body}))
        docs.append(NewJob(job.idempotency_key, job.source, job.external_id, sha, ref, job.classifier_version))
    engine = deployment.engine()
    try:
        store = JobStore(engine)
        registered = store.register(docs, batch_key=BATCH, step="classify", max_attempts=3)
        claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="test-worker")
        # the same label, closer calls first: margins 0.03, 0.13, 0.23 (in the order registered)
        models = {
            j.id: ClassificationRecord(
                "billing",
                0.38,
                "inconclusive",
                "keyword-v1",
                candidates=(("billing", 0.38), ("shipping", 0.35 - i / 10)),
            )
            for i, j in enumerate(sorted(claim.jobs, key=lambda j: j.id))
        }
        store.record(
            claim, [SendToReview(j.id, j.attempt, "inconclusive", classification=models[j.id]) for j in claim.jobs]
        )
    finally:
        engine.dispose()
    return [str(i) for i in registered.new_ids]


def screenshots(tmp_path: Path) -> Path:
    return Path(os.environ.get("TRIAGE_SCREENSHOTS") or tmp_path / "shots")


def test_a_reviewer_labels_a_job_in_the_airflow_ui(e2e: E2E, tmp_path: Path) -> None:
    binary = chromium()
    af, password = e2e.airflow, e2e.passwords["reviewer"]
    job_ids = seed_reviews(e2e.deployment, 3)
    shots = screenshots(tmp_path)
    ours = " || ".join(f"a.href.includes('{job_id}')" for job_id in job_ids)
    with Chromium(binary, tmp_path / "profile") as page:
        # log in on Airflow's own page; it comes back to the Triage entry of the navigation
        page.go(f"{af.base_url}/auth/login?next=%2Fplugin%2Ftriage")
        page.wait_for("document.querySelector('input[name=username]')", timeout=60)
        page.type_into("input[name=username]", "reviewer")
        page.type_into("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for("location.pathname.startsWith('/plugin/triage')", timeout=60)
        framed = "document.querySelector('iframe')?.contentDocument?.querySelector('#queue')"
        page.wait_for(framed, timeout=60)
        rows = page.evaluate("document.querySelector('iframe').contentDocument.querySelectorAll('a.job').length")
        assert rows > 0  # the oldest open reviews: other tests' come before this one's
        page.wait_for("document.fonts.status === 'loaded'")
        assert png_size(page.screenshot(shots / "review-queue-in-airflow.png")) == (1400, 900)
        # the queue on its own, filtered to this test's batch: its three jobs; one of them: the
        # document as text, the transitions, the form
        page.go(f"{af.base_url}/triage/review?batch={urllib.parse.quote(BATCH, safe='')}")
        assert page.text("#who").startswith("reviewer")
        assert page.evaluate("document.querySelectorAll('a.job').length") == 3
        assert page.evaluate(f"[...document.querySelectorAll('a.job')].filter(a => {ours}).length") == 3
        page.click_and_wait("a.job")
        job_id = page.evaluate("location.pathname.split('/').pop()")
        assert job_id in job_ids
        assert "Parcel question" in page.text("#subject")
        assert SCRIPT in page.text("#body")  # shown as the text it is
        assert page.evaluate("document.querySelectorAll('#body *').length") == 0  # not as markup
        assert page.evaluate("document.title") != "owned"
        events = page.text("#events")
        assert "running" in events
        assert "manual_review" in events
        assert "billing" in page.text("#model")
        assert "0.38" in page.text("#model")
        page.evaluate("document.querySelector('#label').value = 'shipping'")
        page.type_into("textarea[name=note]", "a parcel, not an invoice")
        page.screenshot(shots / "review-job.png")
        page.click_and_wait("#submit")
        assert "Decision applied" in page.text("#notice")
        assert "labelled by reviewer" in page.text("#decided")

        # one at a time, least sure first (filtered to this test's batch): a key decides and the
        # next document opens
        page.go(f"{af.base_url}/triage/review/next?batch={urllib.parse.quote(BATCH, safe='')}")
        first = page.text("#subject")
        assert first.startswith("Parcel question")
        assert "shipping" in page.text("#candidates")
        assert page.evaluate("document.querySelector('[data-key=\"1\"]').value") == "label:billing"
        assert "Keys:" in page.text("#keys")
        page.screenshot(shots / "review-next.png")
        page.evaluate("window.__leaving = true")
        page.press("1")
        page.wait_for("window.__leaving === undefined && document.readyState === 'complete'")
        assert "decided=applied" in page.url()
        assert "Decision applied" in page.text("#notice")
        second = page.text("#subject")
        assert second.startswith("Parcel question")
        assert second != first
        keyed = page.evaluate("document.querySelector('#decide').action.split('/').pop()")
        page.evaluate("window.__leaving = true")
        page.press("s")  # skip: the batch's queue has nothing after it
        page.wait_for("window.__leaving === undefined && document.readyState === 'complete'")
        assert page.evaluate("!!document.querySelector('#empty')")

        # a reconcile_jobs run page's report tab (a run of this test's: the e2e deployment
        # schedules nothing)
        af.post("/api/v2/dags/reconcile_jobs/dagRuns", {"dag_run_id": REPORT_RUN, "logical_date": None})
        wait_for_runs(af.env, "reconcile_jobs", 1, ("success",), timeout=300, where=lambda r: r["run_id"] == REPORT_RUN)
        run_id = REPORT_RUN
        page.go(f"{af.base_url}/dags/reconcile_jobs/runs/{run_id}/plugin/triage-report")
        report = "document.querySelector('iframe')?.contentDocument?.querySelector('#total-reviews')"
        page.wait_for(report, timeout=60)
        framed_text = page.evaluate("document.querySelector('iframe').contentDocument.body.innerText")
        assert "Triage reconciliation run" in framed_text
        page.screenshot(shots / "report-tab.png")

    engine = e2e.deployment.engine()
    try:
        with engine.connect() as conn:
            last = conn.execute(
                sa.text(
                    "SELECT from_status, to_status, actor FROM triage.job_events WHERE job_id = :id ORDER BY id DESC"
                ),
                {"id": job_id},
            ).first()
            review = conn.execute(
                sa.text("SELECT resolution, resolved_by, note FROM triage.manual_review WHERE job_id = :id"),
                {"id": job_id},
            ).one()
            label = conn.execute(
                sa.text("SELECT label, classifier_version FROM triage.document_labels WHERE job_id = :id"),
                {"id": job_id},
            ).one()
            by_key = conn.execute(
                sa.text(
                    "SELECT r.resolved_by, l.label FROM triage.manual_review r JOIN triage.document_labels l"
                    " ON l.job_id = r.job_id WHERE r.resolution = 'labelled' AND r.job_id <> :id"
                    " AND r.job_id = ANY(CAST(:ours AS uuid[]))"
                ),
                {"id": job_id, "ours": job_ids},
            ).all()
            still_open = (
                conn.execute(
                    sa.text(
                        "SELECT job_id::text FROM triage.manual_review"
                        " WHERE resolved_at IS NULL AND job_id = ANY(CAST(:ours AS uuid[]))"
                    ),
                    {"ours": job_ids},
                )
                .scalars()
                .all()
            )
            recorded = conn.execute(
                sa.text("SELECT count(*) FROM triage.reconciliation_runs WHERE dag_run_id = :run"), {"run": run_id}
            ).scalar_one()
    finally:
        engine.dispose()
    assert last is not None
    assert tuple(last) == ("manual_review", "completed", "reviewer")
    assert tuple(review) == ("labelled", "reviewer", "a parcel, not an invoice")
    assert tuple(label) == ("shipping", "human:reviewer")
    assert recorded == 1
    assert [tuple(r) for r in by_key] == [("reviewer", "billing")]  # the key "1": the first candidate
    assert still_open == [keyed]  # skipped, still open
