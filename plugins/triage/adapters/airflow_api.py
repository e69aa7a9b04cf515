"""The client of Airflow's public REST API (``/api/v2``): reconciliation's view of Airflow's task
states (:class:`triage.ports.airflow_states.AirflowStates`), and the calls ``make distributed``
and the drills make.

Task code never reads Airflow's metadata database; it asks the API server like any client.
Authentication (Airflow 3.3): the public API wants a JWT bearer token. The client gets one from
the auth manager's token endpoint: ``POST {base}/auth/token`` with a username and password
(simple auth manager, and FAB/Keycloak alike), or, without credentials, ``GET
{base}/auth/token``, which the simple auth manager answers only when
``[core] simple_auth_manager_all_admins`` is on. Then every call sends ``Authorization:
Bearer <token>``. The deployments give it a user of its own, ``triage_reconcile``, who may
read and not act (``triage_tools.deploy.reconcile_user``), in the ``airflow_api`` connection.

One failure is waited out instead of raised: an API server that refuses connections before the
client has ever reached it (``wait_s``). Right after ``make up`` the scheduler can run
``reconcile_jobs`` before the API server listens; a few seconds later it does, and the first
report should show Airflow's view checked, not skipped. Every other failure raises
:class:`~triage.ports.airflow_states.AirflowApiUnavailable`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from triage.jobs.vocabulary.models import batch_key_for
from triage.ports.airflow_states import AirflowApiUnavailable, DagRunView, TaskInstanceView

__all__ = ["AirflowApi", "AirflowApiUnavailable", "batch_key_of"]

log = logging.getLogger(__name__)

PAGE = 100
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0  # waiting for an API server to listen: 0.5, 1, 2, 4, 8, 8, … s


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused (httpx wraps httpcore's error, which wraps the OS's)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def batch_key_of(start: str | None, end: str | None) -> str | None:
    """The batch key ``classify_documents`` gives a run (:func:`triage.adapters.task_context.batch_key`): the data
    interval as ``start/end`` in ISO 8601 with ``+00:00``, from the API's ``…Z`` timestamps."""
    if not start or not end:
        return None
    return batch_key_for(*(datetime.fromisoformat(v.replace("Z", "+00:00")) for v in (start, end)))


class AirflowApi:
    """A small client of Airflow's public REST API (``/api/v2``).

    :param base_url: the API server, e.g. ``http://localhost:8080`` (``[api] base_url``).
    :param username: with ``password``, the credentials ``POST /auth/token`` takes; when both
        are None the client asks ``GET /auth/token`` (simple auth manager, all admins).
    :param wait_s: how long the client waits, counted from its first request, for an API server
        that refuses connections (nothing listens yet: it is starting), retrying with backoff.
        Only until the first connection succeeds, and only on a refused connection: a timeout,
        a name that does not resolve or an error answer is not a server that is starting.
        0 (the default): no wait.
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 10.0,
        wait_s: float = 0.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.username, self.password = username, password
        self.wait_s = wait_s
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)
        self._token: str | None = None
        self._reached = False  # a connection has succeeded: no more waiting
        self._wait_until: float | None = None  # monotonic deadline of the wait, from the first request

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._wait_until is None:
            self._wait_until = time.monotonic() + self.wait_s
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.ConnectError as exc:
                left = self._wait_until - time.monotonic()
                if self._reached or left <= 0 or not _refused(exc):
                    raise AirflowApiUnavailable(f"{method} {self.base_url}{path}: {type(exc).__name__}") from None
                log.info("Airflow's API server at %s refuses connections (starting?); retrying", self.base_url)
                time.sleep(min(backoff, left))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            except httpx.HTTPError as exc:
                raise AirflowApiUnavailable(f"{method} {self.base_url}{path}: {type(exc).__name__}") from None
            self._reached = True
            return response

    def token(self) -> str | None:
        """A bearer token, or None when the token endpoint is absent (an API without auth)."""
        if self._token is None:
            if self.username is not None:
                response = self._call(
                    "POST", "/auth/token", json={"username": self.username, "password": self.password or ""}
                )
            else:
                response = self._call("GET", "/auth/token")
            if response.status_code in (404, 405):
                return None
            if response.status_code >= 400:
                who = f"as {self.username}" if self.username is not None else "without credentials"
                raise AirflowApiUnavailable(
                    f"the token endpoint answered HTTP {response.status_code} {who}: the airflow_api connection "
                    "needs the login and password of a user who may read classify_documents' runs and task "
                    "instances (every deployment of Triage provisions triage_reconcile: docs/security.md)"
                )
            self._token = str(response.json()["access_token"])
        return self._token

    def get(self, path: str, params: Any = None) -> Any:
        token = self.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = self._call("GET", path, params=params, headers=headers)
        if response.status_code >= 400:
            raise AirflowApiUnavailable(f"GET {path} answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise AirflowApiUnavailable(f"GET {path} did not answer JSON") from None

    def send(self, method: str, path: str, body: Any = None) -> Any:
        """A call that acts (``POST``, ``PATCH``: ``make distributed`` triggers runs); its JSON."""
        token = self.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = self._call(method, path, json=body, headers=headers)
        if response.status_code >= 400:
            raise AirflowApiUnavailable(f"{method} {path} answered HTTP {response.status_code}: {response.text[:1000]}")
        return response.json() if response.content else None

    def _pages(self, path: str, key: str, params: list[tuple[str, str]]) -> Iterator[dict[str, Any]]:
        offset = 0
        while True:
            page = self.get(path, params=[*params, ("limit", str(PAGE)), ("offset", str(offset))])
            rows = page.get(key) or []
            yield from rows
            offset += len(rows)
            if not rows or offset >= int(page.get("total_entries", 0)):
                return

    def dag_runs(self, dag_id: str, since: datetime) -> dict[str, DagRunView]:
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns"
        rows = self._pages(path, "dag_runs", [("updated_at_gte", since.isoformat())])
        return {
            r["dag_run_id"]: DagRunView(
                r["dag_run_id"],
                str(r.get("state")),
                batch_key_of(r.get("data_interval_start"), r.get("data_interval_end")),
            )
            for r in rows
        }

    def task_instances(self, dag_id: str, states: tuple[str, ...], since: datetime) -> list[TaskInstanceView]:
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/~/taskInstances"
        params = [("updated_at_gte", since.isoformat()), *(("state", s) for s in states)]
        return [
            TaskInstanceView(
                r["dag_run_id"],
                r["task_id"],
                int(r.get("map_index", -1)),
                str(r["state"]),
                int(r.get("try_number") or 0),
            )
            for r in self._pages(path, "task_instances", params)
        ]
