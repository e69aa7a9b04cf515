"""The classification tasks both classifying DAGs wire: size_classify → classify (mapped) →
persist (mapped over what classify left it: skipped by the scheduler when nothing) → publish
events (which alerts at its end), and the ``alert`` teardown for a run that did not get that
far, with the same pools, timeouts and retry policy.

``classify_documents`` puts ``retrieve`` before them (a day's documents from a source);
``classify_intake`` runs them alone on the ``intake`` batch (the documents posted over HTTP,
already registered). One factory, so the two cannot drift apart: what a DAG adds is its
schedule, its params and where its jobs come from. Building the tasks does no work (a DAG
parse calls this).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import TriggerRule

from triage.adapters.callbacks import on_task_failure
from triage.operators.alerts import PublishEventsThenAlertOperator, RunAlertsOperator
from triage.operators.classify_documents import ClassifyDocumentsOperator, PersistLabelsOperator
from triage.operators.retry import OUTAGE_RETRY_POLICY, default_args
from triage.operators.sizing import SizeClassifyOperator

CLASSIFY_JOBS_PER_WORKER = {"keyword": 50_000, "llm": 2_000, "learned": 50_000}
"""Open jobs per ``classify`` task instance, by classifier: a 10-document day gets one, a
100,000-document keyword day two (one per core here), a day of 2,000 model calls one."""

CLASSIFY_MAX_WORKERS = 4
"""At most this many ``classify`` instances a run: the ``llm_api`` pool's 32 slots hold four
instances of 8 at once; more would only queue."""

LLM_POOL, CLASSIFY_POOL_SLOTS = "llm_api", 8
"""Each ``classify`` instance holds 8 slots of the ``llm_api`` pool (airflow_settings.yaml) and
keeps at most that many model calls in flight, so the pool's size bounds the model calls of
every worker together."""

CLASSIFY_BATCH_SIZE, MODEL_TIMEOUT_SECONDS = 1000, 30
"""Jobs per claim (the operator's ``batch_size``) and the model call's timeout (the default of the
``triage_llm`` connection's extra ``timeout``): what a try of ``classify`` may take is derived
from them."""

CLASSIFY_TIMEOUT = timedelta(seconds=2 * -(-CLASSIFY_BATCH_SIZE // CLASSIFY_POOL_SLOTS) * MODEL_TIMEOUT_SECONDS)
"""A ``classify`` try's ``execution_timeout`` (2 h 5 min): two claims (the one recorded while the
next is handled) in which every model call takes its whole timeout, ``CLASSIFY_POOL_SLOTS`` at
a time. Past it Airflow raises ``AirflowTaskTimeout`` in the task (its claim is settled: what
finished is recorded, the rest given back) and retries; the retry continues with the
unfinished jobs. A run that needs longer than this per try (a day of far more than 100,000
documents through the model) raises it."""

PERSIST_BATCH_SIZE, LABEL_ACTION_TIMEOUT_SECONDS = 1000, 10
"""Jobs per ``persist`` claim and the label action's timeout (``triage_label_action`` extra
``timeout``, default 10 s)."""

PERSIST_TIMEOUT = timedelta(seconds=PERSIST_BATCH_SIZE * LABEL_ACTION_TIMEOUT_SECONDS)
"""A ``persist`` try's ``execution_timeout`` (2 h 46 min 40 s): one claim whose every label
action, one after the other, takes its whole timeout."""

DEFAULT_ARGS = default_args(retries=3, max_retry_delay=timedelta(minutes=15), on_failure_callback=on_task_failure)
"""Both DAGs' task defaults: retried with exponential backoff, and the failure callback that moves
a task's unfinished jobs to review when Airflow gives up (copy it: ``dict(DEFAULT_ARGS)``)."""


def classification_tasks(
    upstream: Any = None, *, batch: str | None = None, model_batches: bool = False
) -> dict[str, Any]:
    """size_classify → classify (mapped over as many instances as the batch's open jobs need:
    :mod:`triage.operators.sizing`) → persist (mapped over what classify left it) →
    publish_events after ``upstream`` (if any), and ``alert``, a teardown downstream of every
    one of them; returns the tasks by id.

    No idle hand-offs on the happy path (issue #29): a task that has nothing to do costs no
    process start and no scheduler round.

    - ``persist`` is expanded over the ``classify`` instances' return values, and an instance
      returns one only when jobs of the batch wait at the persist step
      (:meth:`~triage.operators.classify_documents.ClassifyDocumentsOperator.hand_over`): with
      no label action (keyword, learned or llm completing their jobs in classify) the scheduler
      marks ``persist`` skipped (mapped over nothing); with one, or jobs an earlier run left
      there, one ``persist`` instance runs per classify instance that saw them.
    - ``publish_events`` runs when no upstream failed (``none_failed``: a skipped ``persist`` is
      no reason to keep the run's events), then alerts for the run itself and skips the ``alert``
      teardown (:class:`~triage.operators.alerts.PublishEventsThenAlertOperator`); whenever
      ``publish_events`` did not get that far (a task failed, or the alert could not be read),
      the teardown alerts, as before.

    :param batch: the batch every task works on (None: the run's data interval).
    :param model_batches: a run with param ``model_mode`` = ``batch`` sends its jobs to the
        provider's batch interface in ``size_classify`` and waits there, deferred, before sizing
        (:mod:`triage.operators.model_batches`); an interactive run only sizes, as without.
    """
    size = SizeClassifyOperator(
        task_id="size_classify",
        jobs_per_worker=CLASSIFY_JOBS_PER_WORKER,
        max_workers=CLASSIFY_MAX_WORKERS,
        model_batches=model_batches,
        batch=batch,
    )
    classify = ClassifyDocumentsOperator.partial(
        task_id="classify",
        pool=LLM_POOL,
        pool_slots=CLASSIFY_POOL_SLOTS,
        batch_size=CLASSIFY_BATCH_SIZE,
        execution_timeout=CLASSIFY_TIMEOUT,
        retry_policy=OUTAGE_RETRY_POLICY,
        batch=batch,
    ).expand(worker=size.output)
    persist = PersistLabelsOperator.partial(task_id="persist", execution_timeout=PERSIST_TIMEOUT, batch=batch).expand(
        handed_over=classify.output
    )
    publish = PublishEventsThenAlertOperator(
        task_id="publish_events", batch=batch, trigger_rule=TriggerRule.NONE_FAILED
    )

    # Downstream of every task, not only the last: it must wait for every map index of classify.
    alert = RunAlertsOperator(task_id="alert", batch=batch).as_teardown()

    steps = [size, classify, persist, publish]
    if upstream is not None:
        upstream >> size
        steps.insert(0, upstream)
    size >> classify >> persist >> publish
    steps >> alert
    return {"size_classify": size, "classify": classify, "persist": persist, "publish_events": publish, "alert": alert}
