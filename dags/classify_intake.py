"""classify_intake: classify the documents posted to intake, seconds after they arrive.

Scheduled on the Asset ``triage://intake`` (``triage_intake``), which ``POST
/triage/api/documents`` updates after it has committed the documents' jobs (docs/intake.md):
asset-aware, no polling. Its tasks are ``classify_documents``' own (``classification_tasks``:
size_classify → classify, mapped over what the batch needs → persist, skipped by the scheduler
when classify left it nothing → publish_events, which alerts, and the ``alert`` teardown for a
run that failed before; the same
pools, timeouts, retries, failure callback and review rules) on one batch, ``intake``, so a run
claims whatever is queued, whenever it was posted. There is no retrieve: intake registered the
jobs already.

One run at a time (``max_active_runs=1``): a request that arrives during a run leaves its asset
event queued, and the scheduler starts the next run when this one ends (the run in progress may
already have claimed the document: then the next one finds nothing and ends at once). Nothing
posted is left behind by a run that was already past its claims.

Unpaused when Airflow first sees it, like ``reconcile_jobs``: documents posted to a deployment are
meant to be classified without anyone unpausing a DAG. Its params are ``classify_documents``'
(the retrieval ones unused), with the classifier of ``$TRIAGE_INTAKE_CLASSIFIER`` (``auto``
unless set: the learned champion when there is one, else ``keyword``, resolved by each run as
intake resolves it), the one intake registers its jobs for; a run of another classifier claims
none of them.
Its ``model_mode`` is ``interactive`` only: batch mode is for backfills of ``classify_documents``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, Param

from triage import settings
from triage.contracts.intake import INTAKE_ASSET_NAME, INTAKE_ASSET_URI, INTAKE_BATCH
from triage.contracts.run_config import param_schemas
from triage.operators.tasks import DEFAULT_ARGS, classification_tasks

INTAKE = Asset(name=INTAKE_ASSET_NAME, uri=INTAKE_ASSET_URI)

schemas = param_schemas()
intake_params = {
    **schemas,
    "classifier": {**schemas["classifier"], "default": settings.intake_classifier()},
    # Intake answers within seconds: no provider batch (its size_classify never waits for one).
    "model_mode": {
        **schemas["model_mode"],
        "enum": ["interactive"],
        "description": "classify_intake asks the model interactively (seconds, not the batch interface's hours).",
    },
}

with DAG(
    dag_id="classify_intake",
    description="Classify the documents posted to /triage/api/documents (scheduled on triage://intake)",
    schedule=[INTAKE],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,  # wins over [core] dags_are_paused_at_creation
    max_active_runs=1,
    max_active_tasks=8,
    tags=["triage", "classification", "intake"],
    params={name: Param(**schema) for name, schema in intake_params.items()},
    default_args=dict(DEFAULT_ARGS),
    doc_md=__doc__,
) as dag:
    classification_tasks(batch=INTAKE_BATCH)
