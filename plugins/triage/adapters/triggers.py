"""Triage's triggers: waits the triggerer holds instead of a worker slot.

:class:`ModelBatchTrigger` waits for batch mode's provider batches (:mod:`triage.operators.model_batches`
defers to it). A trigger is serialized by its class path (``triage.adapters.triggers.…``) and
rebuilt in the triggerer from its keyword arguments; nothing secret is among them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseHook
from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = ["ModelBatchTrigger"]


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

        from triage.adapters.connections import http_url
        from triage.classifiers.batch_api import RUNNING

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
