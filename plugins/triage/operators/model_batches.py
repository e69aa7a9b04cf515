"""Batch mode's Airflow side: submit a run's classify jobs to the provider's batch interface, wait
for the batches in the triggerer (no worker slot held for up to a day), collect them.

``classify_documents``' ``size_classify`` task does it (:class:`ModelBatches`, mixed into
:class:`~triage.operators.sizing.SizeClassifyOperator`) in a run whose param ``model_mode`` is
``batch``, before it sizes ``classify`` on what is then due; an interactive run (the default)
goes straight to the sizing, so batch mode costs it no task and no stage. It submits
(:func:`triage.pipeline.batch_mode.submit`), defers to :class:`~triage.adapters.triggers.ModelBatchTrigger` until no
submitted batch is running, then collects (:func:`~triage.pipeline.batch_mode.collect`):
answers per job, a lost batch's jobs made due. The ``classify`` task after it takes each job's
batch answer instead of a call and asks the rest interactively. A try that dies after
submitting is safe to retry: a submission is named by its jobs and adopted, never paid twice;
jobs nobody collects come back to the queue by themselves after the completion window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from triage.adapters.model_api import build_run_classifier, llm_settings
from triage.adapters.task_context import batch_key, lease_owner, owner_prefix
from triage.adapters.triggers import ModelBatchTrigger
from triage.operators.classify_documents import _payloads

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger

    from triage.classifiers.batch_api import BatchClient
    from triage.contracts.run_config import ClassifyRunConfig
    from triage.jobs.store import JobStore

# ModelBatchTrigger is re-exported: a task deferred before the trigger moved to triage.adapters
# stored this module's class path in Airflow's trigger table, and resumes only if it still resolves.
__all__ = ["ModelBatchTrigger", "ModelBatches"]


class ModelBatches:
    """Batch mode's part of an operator (``size_classify``'s: :class:`~triage.operators.sizing.
    SizeClassifyOperator`): submit the run's ``llm`` classify jobs as provider batches, wait for
    them deferred, collect their answers, then :meth:`after_model_batches`. In an interactive run
    (the default) :meth:`wait_for_model_batches` returns at once and touches nothing.

    A provider that has no batch interface, or a key that may not use it (401, 403, 404), fails
    the task without retry and gives the claimed jobs back; any other error of the interface is
    retried by Airflow (a resubmission adopts what the provider took: never paid twice). The
    connection's extra ``batch_size`` and ``batch_poll_seconds`` override the two class
    defaults below (docs/model-calls.md).
    """

    llm_conn_id: str = "triage_llm"
    payload_base: str | None = None
    model_batch_size: int = 10_000
    """Jobs per provider batch (OpenAI takes up to 50,000 requests and 200 MB)."""
    poll_seconds: float = 60.0
    """How often the triggerer asks the provider."""

    if TYPE_CHECKING:  # what the operator this is mixed into (a TriageOperator) provides

        @property
        def store(self) -> JobStore: ...
        @property
        def log(self) -> Any: ...
        def run_config(self, context: Context) -> ClassifyRunConfig: ...
        def defer(
            self,
            *,
            trigger: BaseTrigger,
            method_name: str,
            kwargs: dict[str, Any] | None = None,
            timeout: timedelta | int | float | None = None,
        ) -> NoReturn: ...
        def dispose(self) -> None: ...

    def after_model_batches(self, context: Context) -> Any:
        """The operator's own work once no batch of the run is running."""
        raise NotImplementedError

    def _setting(self, key: str, default: float) -> float:
        """A positive number of the connection's extra, else ``default``; anything else fails the task."""
        value = (BaseHook.get_connection(self.llm_conn_id).extra_dejson or {}).get(key)
        if value in (None, ""):
            return default
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0
        if number <= 0:
            raise AirflowFailException(
                f"the {self.llm_conn_id} connection's extra {key} is {value!r}: a positive number"
            )
        return number

    def _client(self, context: Context) -> BatchClient:
        from triage.classifiers.batch_api import BatchClient
        from triage.classifiers.llm import OpenAICompatibleClassifier

        classifier = build_run_classifier(self.run_config(context), self.llm_conn_id)
        if not isinstance(classifier, OpenAICompatibleClassifier):  # the run config refuses it first
            classifier.close()
            raise AirflowFailException("model_mode batch needs the llm classifier without drill faults")
        settings = llm_settings(self.llm_conn_id)
        return BatchClient(classifier, settings["base_url"], settings["api_key"])

    def wait_for_model_batches(self, context: Context) -> None:
        """In batch mode: submit, and defer while a batch runs (resumed in :meth:`execute_complete`)."""
        from triage.pipeline.batch_mode import submit

        config = self.run_config(context)
        if config.model_mode != "batch":
            return
        key, owner = batch_key(context), lease_owner(context)
        client = self._client(context)
        try:
            # A try that died while it held a claim: its jobs come back before this one claims.
            self.store.release_expired_leases(
                earlier_tries_of=owner_prefix(context), owner=owner, batch_key=key, actor=owner
            )
            with _batch_interface_errors():
                keys = submit(
                    self.store,
                    self.store.batches,
                    client,
                    _payloads(self.payload_base),
                    batch_key=key,
                    owner=owner,
                    limit=int(self._setting("batch_size", self.model_batch_size)),
                    lease_seconds=config.lease_seconds,
                )
            self.log.info("batch=%s submitted %d provider batches", key, len(keys))
            self._collect_or_wait(context, client)
        finally:
            client.classifier.close()
            client.close()
            self.dispose()

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        client = self._client(context)
        try:
            self._collect_or_wait(context, client)
        finally:
            client.classifier.close()
            client.close()
            self.dispose()
        return self.after_model_batches(context)

    def _collect_or_wait(self, context: Context, client: BatchClient) -> None:
        from triage.pipeline.batch_mode import BATCH_WINDOW_SECONDS, collect

        ledger, key = self.store.batches, batch_key(context)
        with _batch_interface_errors():
            result = collect(ledger, client, batch_key=key, actor=lease_owner(context))
        running = [s.provider_batch_id for s in ledger.open_batches(key) if s.provider_batch_id]
        if running:
            self.log.info("batch=%s waiting in the triggerer for %d provider batches", key, len(running))
            deadline = time.time() + BATCH_WINDOW_SECONDS
            self.defer(
                trigger=ModelBatchTrigger(
                    running, self.llm_conn_id, self._setting("batch_poll_seconds", self.poll_seconds), deadline
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=BATCH_WINDOW_SECONDS),
            )
        self.log.info(
            "batch=%s provider batches collected=%d lost=%d answers=%d jobs due=%d",
            key,
            result.collected,
            result.lost,
            result.answers,
            result.due,
        )


@contextmanager
def _batch_interface_errors() -> Iterator[None]:
    """The batch interface's errors as Airflow's: refused (no interface, a key that may not use
    it) fails without retry; anything else is retried."""
    from triage.classifiers.base import ClassifierError

    try:
        yield
    except ClassifierError as exc:
        if exc.transient:
            raise AirflowException(
                f"{exc}; Airflow's retry submits or collects again (adopting what it took)"
            ) from None
        raise AirflowFailException(
            f"{exc}: the triage_llm connection's provider has no batch interface there, or its key may not use "
            "it; run with model_mode interactive, or fix the connection and clear this task"
        ) from None
