"""The learning loop under a running Airflow, driven through its REST API as a user would from the UI
(issue #27, "Done when: under make up"): a reviewer's label reaches the labelled examples,
``train_classifier`` triggered with the trigger form's params produces a model, and the report of a
``reconcile_jobs`` run shows the Quality section with the figures of the version that ran.

1. ``classify_documents`` (keyword) for :data:`KEYWORD_DAY` leaves inconclusive jobs in review; the
   ``reviewer`` user labels one with ``POST /triage/api/reviews/{job_id}`` (its own bearer token, as
   the browser's session would act), and the label is a labelled example of source ``review``.
2. Labelled history is posted as ``admin`` (``POST /triage/api/labels``: :data:`HISTORY`, two labels),
   then ``train_classifier`` is triggered with params; its model is in ``triage.classifier_models``,
   made by that run, with the examples of both labels counted.
3. ``classify_documents`` with ``classifier: learned`` for :data:`LEARNED_DAY` runs the champion;
   the report of a ``reconcile_jobs`` run shows the Quality section, and the row of the champion's
   version there has this run's documents and the coverage the ledger gives for them.

Owns ``classify_documents``' runs ``learning_keyword`` and ``learning_learned`` (logical dates
:data:`KEYWORD_DAY`, :data:`LEARNED_DAY` and their batches), ``train_classifier``'s run
``learning_train``, ``reconcile_jobs``' run ``learning_report``, and the labelled examples of source
:data:`SOURCE`. The model it trains becomes the deployment's champion when it is the first: later
runs that leave ``classifier`` at ``auto`` classify with it, so a module with such runs must not
depend on which classifier ran (``test_backfill.py`` counts settled jobs only).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.conftest import E2E
from tests.harness.airflow import HarnessError, api_client, task_log, task_states, wait_for_runs

KEYWORD_DAY = "2026-09-15"
LEARNED_DAY = "2026-09-16"
KEYWORD_RUN, LEARNED_RUN, TRAIN_RUN, REPORT_RUN = (
    "learning_keyword",
    "learning_learned",
    "learning_train",
    "learning_report",
)
SOURCE = "e2e-learning"
LEARNED_DOCUMENTS = 20

# Labelled history as a help desk would export it: short, distinct, in customers' words.
HISTORY: dict[str, list[tuple[str, str]]] = {
    "billing": [
        ("Invoice total looks wrong", "The invoice for March shows 120 EUR but our plan costs 99 EUR."),
        ("Charged twice this month", "My credit card was charged twice for the same subscription."),
        ("VAT number missing", "Please add our VAT number to the last three invoices."),
        ("Card declined", "My card was declined when paying the annual fee, can you check?"),
        ("Receipt needed", "I need a receipt for the payment made on 4 May for expenses."),
        ("Change payment method", "How do I switch from credit card to direct debit?"),
        ("Unexpected charge", "There is an unexpected charge of 15 USD on my statement."),
        ("Billing address update", "Our billing address changed, please update it on future invoices."),
        ("Price increase question", "Why did the monthly price go up from 20 to 25?"),
        ("Invoice in PDF", "Could you send the January invoice as a PDF attachment?"),
        ("Proration on upgrade", "I upgraded mid-month; how is the proration calculated on my bill?"),
        ("Payment failed", "The payment failed again although the card is valid until 2028."),
        ("Tax invoice request", "Our accountant needs a tax invoice with the company name on it."),
        ("Overcharged for seats", "We were billed for 12 seats but only have 9 users."),
        ("Annual plan billing", "If we move to the annual plan, when will the next invoice be issued?"),
        ("Statement mismatch", "The amounts on the statement do not match what the dashboard shows."),
        ("Invoice currency", "Can invoices be issued in GBP instead of USD from now on?"),
        ("Subscription fee", "The subscription fee this month is higher than last month."),
        ("Double charge on renewal", "The renewal created a double charge on our company card."),
        ("Billing contact", "Please send future invoices to finance@example.org as well."),
    ],
    "shipping": [
        ("Parcel not arrived", "My parcel was due on Monday and has still not arrived."),
        ("Tracking number", "The tracking number you sent does not work on the courier site."),
        ("Delivery address wrong", "The package is going to my old address, can you redirect it?"),
        ("Package damaged", "The box arrived crushed and the item inside is broken."),
        ("Delivery time abroad", "How long does delivery to Canada usually take?"),
        ("Stuck in transit", "Tracking says in transit for nine days without any update."),
        ("Courier left no note", "The courier claims delivery but nothing was left at my door."),
        ("Express shipping", "Can I upgrade my order to express shipping before it ships?"),
        ("Customs fees", "The carrier asks me to pay customs before handing over the parcel."),
        ("Partial delivery", "Only two of the three items in my order were in the package."),
        ("Shipping to a locker", "Is it possible to ship the order to a parcel locker?"),
        ("Order not dispatched", "My order is paid but still not dispatched after a week."),
        ("Wrong item delivered", "I received blue shoes instead of the black ones in the shipment."),
        ("Delivery window", "Can the delivery come after 5 pm? Nobody is home during the day."),
        ("Lost shipment", "The shipment shows as delivered to another city, it seems lost."),
        ("Return shipping label", "I need a prepaid shipping label to send the parcel back."),
        ("Shipping cost question", "Why is shipping 14 EUR when the site said free delivery?"),
        ("Pick up at the depot", "Can I collect the package at the depot myself tomorrow?"),
        ("Tracking stopped updating", "The tracking page has not changed since the parcel left the warehouse."),
        ("Delivery to office", "Please deliver the order to our office reception instead."),
    ],
}
# The trigger form's params: a small history trains a model whose thresholds may accept (at least
# 5 training examples and 5 held-out predictions a label, a 0.9 target on ~10 held out a label).
TRAIN_PARAMS = {"target_precision": 0.9, "holdout_percent": 50, "min_examples": 5}


def iso(day: str) -> str:
    return f"{day}T00:00:00Z"


def wait_for_success(e2e: E2E, dag_id: str, run_id: str, timeout: float = 240) -> dict[str, Any]:
    """The run once it succeeded; its tasks' states and logs in the message if it did not."""
    try:
        runs = wait_for_runs(e2e.env, dag_id, 1, ("success",), timeout=timeout, where=lambda r: r["run_id"] == run_id)
        return runs[0]
    except HarnessError as exc:
        states = task_states(e2e.env, dag_id, run_id)
        logs = "\n".join(
            f"--- {task}\n{task_log(e2e.env, dag_id, run_id, task.split('[')[0])}"
            for task, state in states.items()
            if state not in ("success", "skipped")
        )
        raise AssertionError(f"{dag_id}/{run_id}: {exc}\n{states}\n{logs}\n{e2e.airflow.logs(60)}") from None


def batch_of(run: dict[str, Any]) -> str:
    """The run's batch key (its data interval, as :func:`triage.jobs.vocabulary.models.batch_key_for` writes it)."""
    from triage.jobs.vocabulary.models import batch_key_for

    start, end = (datetime.fromisoformat(run[f"data_interval_{e}"].replace("Z", "+00:00")) for e in ("start", "end"))
    return batch_key_for(start, end)


def rows(e2e: E2E, sql: str, **params: object) -> list[tuple[Any, ...]]:
    import sqlalchemy as sa

    engine = e2e.deployment.engine()
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


@pytest.fixture
def reviewer(e2e: E2E) -> Iterator[Any]:
    """The ``reviewer`` user's API client (its own bearer token, as its browser session acts)."""
    with api_client(e2e.airflow.base_url, "reviewer", e2e.passwords["reviewer"]) as client:
        yield client


def test_a_reviewer_s_label_trains_a_model_whose_quality_the_report_shows(e2e: E2E, reviewer: Any) -> None:
    af = e2e.airflow
    for dag_id in ("classify_documents", "train_classifier", "reconcile_jobs"):
        af.unpause(dag_id)

    # 1. a keyword run; meanwhile an admin posts the labelled history (the two do not meet)
    keyword_run = af.post(
        "/api/v2/dags/classify_documents/dagRuns",
        {
            "dag_run_id": KEYWORD_RUN,
            "logical_date": iso(KEYWORD_DAY),
            "conf": {"source": "synthetic", "documents": 30, "classifier": "keyword", "audit_rate": 0.0},
        },
    )
    history = [
        {"source": SOURCE, "external_id": f"{label}-{i}", "subject": subject, "body": body, "label": label}
        for label, texts in HISTORY.items()
        for i, (subject, body) in enumerate(texts)
    ]
    posted = af.post("/triage/api/labels", {"examples": history})
    assert [e["status"] for e in posted["examples"]] == ["added"] * len(history), posted
    wait_for_success(e2e, "classify_documents", KEYWORD_RUN)

    # the reviewer opens the batch's inconclusive jobs and labels the first
    batch = batch_of(keyword_run)
    listed = reviewer.get("/triage/api/reviews", params={"batch": batch, "reason": "inconclusive"})
    assert listed.status_code == 200, listed.text
    reviews = listed.json()["reviews"]
    assert reviews, f"the keyword run of {KEYWORD_DAY} left no inconclusive job in review"
    job_id = str(reviews[0]["job_id"])
    decided = reviewer.post(
        f"/triage/api/reviews/{job_id}", json={"action": "label", "label": "shipping", "note": "a parcel question"}
    )
    assert decided.status_code == 200, decided.text
    assert (decided.json()["outcome"], decided.json()["resolved_by"]) == ("applied", "reviewer")
    example = rows(
        e2e,
        "SELECT e.label, e.labelled_by, e.job_id::text, e.content_sha256 = j.content_sha256"
        " FROM triage.labelled_examples e JOIN triage.jobs j ON j.id = e.job_id"
        " WHERE e.source = 'review' AND e.external_id = :id",
        id=job_id,
    )
    assert example == [("shipping", "reviewer", job_id, True)]

    # 2. train_classifier from the trigger form, with its params
    af.post(
        "/api/v2/dags/train_classifier/dagRuns", {"dag_run_id": TRAIN_RUN, "logical_date": None, "conf": TRAIN_PARAMS}
    )
    wait_for_success(e2e, "train_classifier", TRAIN_RUN, timeout=300)
    models = rows(
        e2e,
        "SELECT version, status, label_counts, target_precision, params->>'holdout_percent'"
        " FROM triage.classifier_models WHERE created_by = :by",
        by=f"airflow:{TRAIN_RUN}",
    )
    assert len(models) == 1, models
    version, status, counts, target, holdout = models[0]
    assert version.startswith("learned-")
    assert status in ("candidate", "champion")
    assert (target, holdout) == (0.9, "50")
    # half of each label's history is held out, by a hash of its id; the rest is trained on, with
    # the reviewers' labels (this test's, and other modules' of this deployment)
    from triage.learning.training import in_holdout

    ours = Counter(
        label
        for label, texts in HISTORY.items()
        for i in range(len(texts))
        if not in_holdout(SOURCE, f"{label}-{i}", 50)
    )
    assert counts["billing"] >= ours["billing"] > 0, counts
    assert counts["shipping"] >= ours["shipping"] > 0, counts
    champion = rows(e2e, "SELECT version FROM triage.classifier_models WHERE status = 'champion'")
    assert champion, f"no champion after {TRAIN_RUN} (its model is {status})"

    # 3. a run with the champion, then reconciliation's report
    learned_run = af.post(
        "/api/v2/dags/classify_documents/dagRuns",
        {
            "dag_run_id": LEARNED_RUN,
            "logical_date": iso(LEARNED_DAY),
            "conf": {"source": "synthetic", "documents": LEARNED_DOCUMENTS, "classifier": "learned", "audit_rate": 0.0},
        },
    )
    wait_for_success(e2e, "classify_documents", LEARNED_RUN)
    ran = rows(
        e2e,
        "SELECT j.classifier_version, count(DISTINCT j.id),"
        " count(DISTINCT j.id) FILTER (WHERE c.outcome = 'accepted')"
        " FROM triage.jobs j JOIN triage.classifications c ON c.job_id = j.id"
        " WHERE j.batch_key = :batch GROUP BY 1",
        batch=batch_of(learned_run),
    )
    assert [r[:2] for r in ran] == [(champion[0][0], LEARNED_DOCUMENTS)], ran
    accepted = ran[0][2]

    af.post("/api/v2/dags/reconcile_jobs/dagRuns", {"dag_run_id": REPORT_RUN, "logical_date": None})
    wait_for_success(e2e, "reconcile_jobs", REPORT_RUN)
    page = reviewer.get(f"/triage/reports/airflow/reconcile_jobs/{urllib.parse.quote(REPORT_RUN, safe='')}")
    assert page.status_code == 200, page.text[:2000]
    assert re.search(r'<h2 id="quality">Quality \(last \d+ days\)</h2>', page.text), page.text[-4000:]
    # the champion's row: this run's documents, and the share of them it accepted
    row = re.search(
        rf'<tr><td><code>{re.escape(html.escape(champion[0][0]))}</code></td><td class="n">(\d+)</td>\s*'
        r'<td class="n">([^<]+)</td>',
        page.text,
    )
    assert row, f"no Quality row for {champion[0][0]}:\n{page.text[-4000:]}"
    assert int(row.group(1)) == LEARNED_DOCUMENTS
    assert html.unescape(row.group(2)) == f"{accepted / LEARNED_DOCUMENTS * 100:.1f} %"
