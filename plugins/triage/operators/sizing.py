"""How many ``classify`` task instances a run maps: as many as its batch's work needs.

``size_classify`` runs after ``retrieve`` and returns the map indexes ``classify`` expands over
(dynamic task mapping): ``ceil(open jobs / jobs per worker)``, at least one, at most the
maximum. Every instance claims from the whole batch with ``FOR UPDATE SKIP LOCKED``, so the
count changes how fast a batch drains, never what happens to a job: an instance that finds the
batch drained finishes at once, and a retried run of a date sizes itself from what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from triage.jobs.vocabulary.states import Step
from triage.operators.base import TriageOperator, batch_key, variable
from triage.operators.model_batches import ModelBatches

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)

JOBS_PER_WORKER_VARIABLE = "triage_classify_jobs_per_worker"
MAX_WORKERS_VARIABLE = "triage_classify_max_workers"


def classify_workers(open_jobs: int, *, jobs_per_worker: int, max_workers: int) -> list[int]:
    """The map indexes ``0..N-1`` of ``classify``: ``N = ceil(open_jobs / jobs_per_worker)``
    between 1 and ``max_workers``. Never none: a mapped task over an empty list is skipped, and
    ``persist`` and ``publish_events`` after it with it."""
    if jobs_per_worker < 1 or max_workers < 1:
        raise ValueError("jobs_per_worker and max_workers must be at least 1")
    return list(range(min(max(1, -(-open_jobs // jobs_per_worker)), max_workers)))


def _setting(name: str, default: int) -> int:
    """An Airflow Variable that overrides a DAG default: a whole number of at least 1."""
    value = variable(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise AirflowFailException(f"Variable {name} is {value!r}: a whole number of at least 1")
    return number


class SizeClassifyOperator(ModelBatches, TriageOperator):
    """Count the batch's open jobs at the classify step and return the map indexes of
    ``classify`` (:func:`classify_workers`). With ``model_batches`` and a run in batch mode
    (param ``model_mode`` = ``batch``), first send the jobs to the provider's batch interface
    and wait for its answers, deferred (:class:`~triage.operators.model_batches.ModelBatches`):
    ``classify`` is then sized on what is due.

    :param jobs_per_worker: jobs one ``classify`` instance is given, by classifier (a model
        call takes far longer than a keyword match); Variable ``triage_classify_jobs_per_worker``
        overrides it for every classifier.
    :param max_workers: at most this many instances (the ``llm_api`` pool runs at most its
        slots / each instance's slots at once: more would only queue); Variable
        ``triage_classify_max_workers`` overrides it.
    :param model_batches: a run in batch mode waits here for the provider's batches
        (``classify_documents``; ``classify_intake`` is interactive only).
    """

    # Reads the batch. In batch mode it holds a claim only while submitting it, and gives it back
    # if that fails; the jobs it parked on a batch are no failed task's to send to review.
    ledger_step = None

    def __init__(
        self, *, jobs_per_worker: Mapping[str, int], max_workers: int, model_batches: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.jobs_per_worker, self.max_workers = dict(jobs_per_worker), max_workers
        self.model_batches = model_batches

    def execute(self, context: Context) -> list[int]:
        if self.model_batches:
            self.wait_for_model_batches(context)  # batch mode: may defer (resumed in execute_complete)
        return self.after_model_batches(context)

    def after_model_batches(self, context: Context) -> list[int]:
        config = self.run_config(context)
        key = batch_key(context)
        per_worker = _setting(JOBS_PER_WORKER_VARIABLE, self.jobs_per_worker[config.classifier])
        most = _setting(MAX_WORKERS_VARIABLE, self.max_workers)
        try:
            open_jobs = self.store.open_in_step(key, Step.CLASSIFY)
        finally:
            self.dispose()
        workers = classify_workers(open_jobs, jobs_per_worker=per_worker, max_workers=most)
        log.info(
            "batch=%s open=%d jobs_per_worker=%d max_workers=%d -> %d classify instances",
            key,
            open_jobs,
            per_worker,
            most,
            len(workers),
        )
        return workers
