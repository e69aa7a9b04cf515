"""Batch mode's Airflow side: submit a run's classify jobs to the provider's batch interface, wait
for the batches in the triggerer (no worker slot held for up to a day), collect them.

:class:`SubmitModelBatchesOperator` runs before ``classify``: it submits (:func:`triage.pipeline.
batch_mode.submit`), defers to :class:`ModelBatchTrigger` until no submitted batch is running,
then collects (:func:`~triage.pipeline.batch_mode.collect`): answers per job, a lost batch's jobs
made due. The ``classify`` task after it takes each job's batch answer instead of a call and asks
the rest interactively. A try that dies after submitting is safe to retry: a submission is named
by its jobs and adopted, never paid twice; jobs nobody collects come back to the queue by
themselves after the completion window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.triggers.base import BaseTrigger, TriggerEvent

from triage.operators.base import TriageOperator, batch_key, lease_owner
from triage.operators.classify_documents import _payloads
from triage.operators.model_connection import build_run_classifier, llm_settings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from triage.classifiers.batch_api import BatchClient

__all__ = ["ModelBatchTrigger", "SubmitModelBatchesOperator"]


class ModelBatchTrigger(BaseTrigger):
    """Fires once none of ``batch_ids`` is running at the provider (done, expired, failed,
    cancelled or unknown), or at ``deadline`` (epoch seconds). An HTTP error while polling is
    taken as "still running": the next poll asks again. The API key is read from the connection
    in the triggerer, never serialized with the trigger."""

    def __init__(self, batch_ids: list[str], llm_conn_id: str, poll_seconds: float, deadline: float) -> None:
        super().__init__()
        self.batch_ids, self.llm_conn_id, self.poll_seconds, self.deadline = (
            batch_ids,
            llm_conn_id,
            poll_seconds,
            deadline,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "batch_ids": self.batch_ids,
                "llm_conn_id": self.llm_conn_id,
                "poll_seconds": self.poll_seconds,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import httpx

        from triage.classifiers.batch_api import RUNNING
        from triage.operators.base import http_url

        conn = await BaseHook.aget_connection(self.llm_conn_id)
        base = http_url(conn, default_path="/v1").rstrip("/")
        headers = {"Authorization": f"Bearer {conn.password}"} if conn.password else {}
        async with httpx.AsyncClient(headers=headers, timeout=60.0) as client:
            while True:
                running = []
                for batch_id in self.batch_ids:
                    try:
                        response = await client.get(f"{base}/batches/{batch_id}")
                    except httpx.HTTPError:
                        running.append(batch_id)
                        continue
                    if response.status_code >= 500 or (
                        response.status_code == 200 and response.json().get("status") in RUNNING
                    ):
                        running.append(batch_id)
                if not running:
                    yield TriggerEvent({"status": "done", "batch_ids": self.batch_ids})
                    return
                if time.time() >= self.deadline:
                    yield TriggerEvent({"status": "deadline", "running": running})
                    return
                await asyncio.sleep(self.poll_seconds)


class SubmitModelBatchesOperator(TriageOperator):
    """Submit the run's ``llm`` classify jobs as provider batches, wait for them deferred, collect.

    :param llm_conn_id: the model connection (the batch interface is at its base URL).
    :param batch_size: jobs per provider batch (OpenAI takes up to 50,000 requests and 200 MB).
    :param poll_seconds: how often the triggerer asks the provider.
    """

    template_fields = ("payload_base",)

    def __init__(
        self,
        *,
        payload_base: str | None = None,
        llm_conn_id: str = "triage_llm",
        batch_size: int = 10_000,
        poll_seconds: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.payload_base, self.llm_conn_id = payload_base, llm_conn_id
        self.batch_size, self.poll_seconds = batch_size, poll_seconds

    def _client(self, context: Context) -> BatchClient:
        from triage.classifiers.batch_api import BatchClient
        from triage.classifiers.llm import OpenAICompatibleClassifier

        classifier = build_run_classifier(self.run_config(context), self.llm_conn_id)
        if not isinstance(classifier, OpenAICompatibleClassifier):
            raise ValueError("batch mode needs the llm classifier without drill faults")
        settings = llm_settings(self.llm_conn_id)
        return BatchClient(classifier, settings["base_url"], settings["api_key"])

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.jobs.batches import BatchLedger
        from triage.pipeline.batch_mode import submit

        if self.run_config(context).classifier != "llm":
            return {"submitted": 0}
        client = self._client(context)
        try:
            keys = submit(
                self.store,
                BatchLedger(self.store.engine),
                client,
                _payloads(self.payload_base),
                batch_key=batch_key(context),
                owner=lease_owner(context),
                limit=self.batch_size,
                lease_seconds=self.run_config(context).lease_seconds,
            )
            self.log.info("submitted %d provider batches", len(keys))
            return self._collect_or_wait(context, client)
        finally:
            client.classifier.close()
            client.close()
            self.dispose()

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        client = self._client(context)
        try:
            return self._collect_or_wait(context, client)
        finally:
            client.classifier.close()
            client.close()
            self.dispose()

    def _collect_or_wait(self, context: Context, client: BatchClient) -> dict[str, Any]:
        from triage.jobs.batches import BatchLedger
        from triage.pipeline.batch_mode import BATCH_WINDOW_SECONDS, collect

        ledger = BatchLedger(self.store.engine)
        result = collect(ledger, client, batch_key=batch_key(context), actor=lease_owner(context))
        running = [s.provider_batch_id for s in ledger.open_batches(batch_key(context)) if s.provider_batch_id]
        if running:
            deadline = time.time() + BATCH_WINDOW_SECONDS
            self.defer(
                trigger=ModelBatchTrigger(running, self.llm_conn_id, self.poll_seconds, deadline),
                method_name="execute_complete",
                timeout=timedelta(seconds=BATCH_WINDOW_SECONDS),
            )
        return {"collected": result.collected, "lost": result.lost, "answers": result.answers, "due": result.due}
