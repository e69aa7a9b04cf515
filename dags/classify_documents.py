"""classify_documents: retrieve → classify → persist → publish events, one data interval a run.

With the param ``model_mode`` = ``batch`` (``classifier`` = ``llm``; for large backfills, e.g.
``./airflow.sh backfill create ... --dag-run-conf '{"classifier": "llm", "model_mode": "batch"}'``),
``size_classify`` first sends the run's documents to the provider's batch interface (about half
the price, answers within 24 h) and waits deferred in the triggerer, then ``classify`` takes
each answer instead of a call (and asks interactively what the batch did not answer). An
interactive run (the default) has no such wait. See docs/model-calls.md.

Scheduled daily with real data intervals (a run covers [00:00, 24:00) UTC of its day), catchup
off, backfillable from the CLI; paused when Airflow first sees it (unpause it once the params'
defaults, or the source you trigger it with, are what you want every day). Trigger it from the UI with the typed params form. Per-document
failures never fail a task; a task fails when a dependency is down or retryable work remains,
and Airflow retries it with exponential backoff. When Airflow gives up, the failure callback
moves the unfinished jobs this run holds or moved last at the task's step to manual review
(never another run's of the same date).

``persist`` is mapped over what the ``classify`` instances left it: with no label action
(``triage_label_action``) classify completes its jobs itself and leaves nothing, so the
scheduler skips ``persist`` (mapped over nothing) and ``publish_events`` follows classify
directly (trigger rule ``none_failed``). ``publish_events`` counts what this run sent to review
or failed terminally and alerts through the ``triage_alerts`` connection (a log line without it)
past the thresholds, then skips ``alert``. ``alert`` is a teardown doing the same for a run that
did not get that far: it runs once every other task is done, whatever their states, and never
decides the run's state. A
run that has not succeeded by 02:00 UTC after its day gets a deadline alert from the scheduler
(``deadline``: ``triage.operators.alerts.classify_deadline``; not under ``airflow dags test``,
which has no scheduler and, in Airflow 3.3.2, exits 1 after a successful run of a DAG with a
deadline). See
docs/reliability.md, "Alerts".

``classify`` is mapped over as many parallel task instances of the same batch as its work needs:
``size_classify`` counts the batch's open jobs once ``retrieve`` is done and returns
``ceil(jobs / CLASSIFY_JOBS_PER_WORKER)`` map indexes, at least one and at most
``CLASSIFY_MAX_WORKERS`` (Variables ``triage_classify_jobs_per_worker`` and
``triage_classify_max_workers`` override them; ``triage.operators.sizing``). Each claims jobs
with ``FOR UPDATE SKIP LOCKED`` under its own lease owner (the map index is part of it), so
under the CeleryExecutor they classify on different workers at once and split the batch
between them; an instance that finds the batch drained finishes at once. ``retrieve`` is
mapped over ``RETRIEVE_SHARDS`` shards of the source (by external id), so that several
processes read, pack and register documents; its count is a constant (the work is not known
before it is read): the DAG file does no work when it is parsed.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from triage.contracts.run_config import param_schemas
from triage.operators import RetrieveDocumentsOperator
from triage.operators.alerts import classify_deadlines
from triage.operators.tasks import DEFAULT_ARGS, classification_tasks

RETRIEVE_SHARDS = 2
"""Parallel ``retrieve`` task instances per run, each registering the documents of one shard
(by external id): reading, hashing, packing and registering run in several processes."""

with DAG(
    dag_id="classify_documents",
    description="Retrieve documents of a day, classify them, persist labels, publish events",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Paused when Airflow first sees it, whatever [core] dags_are_paused_at_creation says: its
    # scheduled runs take the params' defaults (1,000 synthetic documents a day), so the first
    # scheduled day waits until someone who chose the input unpauses it (README, "What starts paused").
    is_paused_upon_creation=True,
    max_active_runs=4,
    max_active_tasks=8,
    tags=["triage", "classification"],
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    deadline=classify_deadlines(),  # none under `airflow dags test` (apache/airflow#73428)
    default_args=dict(DEFAULT_ARGS),
    doc_md=__doc__,
) as dag:
    retrieve = RetrieveDocumentsOperator.partial(task_id="retrieve", shards=RETRIEVE_SHARDS).expand(
        shard=list(range(RETRIEVE_SHARDS))
    )
    # size_classify (waiting for the provider's batches in batch mode) → classify → persist (only
    # when classify left it jobs) → publish_events (which alerts), and the alert teardown for a
    # run that failed before: shared with classify_intake (no batch mode there).
    classification_tasks(retrieve, model_batches=True)
