"""Airflow's view through its REST API (faked at the HTTP layer): failed or up-for-retry
``classify_documents`` tasks whose batch has unfinished jobs; the token dance; and the degraded
path when the API cannot be reached."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.adapters.airflow_api import AirflowApi, AirflowApiUnavailable, batch_key_of
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.states import JobStatus
from triage.reconciliation.airflow_view import airflow_view
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"


def run(
    run_id: str = RUN, state: str = "failed", start: str = "2026-11-05T00:00:00Z", end: str = "2026-11-06T00:00:00Z"
) -> dict[str, Any]:
    return {"dag_run_id": run_id, "state": state, "data_interval_start": start, "data_interval_end": end}


def ti(state: str = "failed", run_id: str = RUN, task_id: str = "classify") -> dict[str, Any]:
    return {"dag_run_id": run_id, "task_id": task_id, "map_index": -1, "state": state, "try_number": 4}


class FakeAirflow:
    """The three endpoints the client uses, recording every request."""

    def __init__(self, runs: list[dict[str, Any]], tis: list[dict[str, Any]], *, token_status: int = 201) -> None:
        self.runs, self.tis, self.token_status = runs, tis, token_status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/auth/token":
            if self.token_status >= 400:
                return httpx.Response(self.token_status, json={"detail": "no"})
            return httpx.Response(201, json={"access_token": "tok-123"})
        if request.headers.get("Authorization") != "Bearer tok-123":
            return httpx.Response(401, json={"detail": "Not authenticated"})
        if path.endswith("/dagRuns/~/taskInstances"):
            states = request.url.params.get_list("state")
            rows = [t for t in self.tis if t["state"] in states]
            return httpx.Response(200, json={"task_instances": rows, "total_entries": len(rows)})
        if path.endswith("/dagRuns"):
            return httpx.Response(200, json={"dag_runs": self.runs, "total_entries": len(self.runs)})
        return httpx.Response(404)


def api(fake: Callable[[httpx.Request], httpx.Response], **kw: Any) -> AirflowApi:
    return AirflowApi("http://airflow.test", transport=httpx.MockTransport(fake), **kw)


def unfinished(store: JobStore, n: int = 4) -> None:
    store.register(new_jobs(n, prefix="af"), batch_key=BATCH, step="classify", max_attempts=3)


def q(store: JobStore, sql: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


@pytest.mark.parametrize(
    ("start", "end", "key"),
    [
        pytest.param("2026-11-05T00:00:00Z", "2026-11-06T00:00:00Z", BATCH, id="zulu"),
        pytest.param("2026-11-05T00:00:00+00:00", "2026-11-06T00:00:00+00:00", BATCH, id="offset"),
        pytest.param(None, "2026-11-06T00:00:00Z", None, id="no-interval"),
    ],
)
def test_batch_key_matches_the_operators(start: str | None, end: str | None, key: str | None) -> None:
    assert batch_key_of(start, end) == key


def test_a_failed_task_of_a_finished_run_sends_its_unfinished_batch_to_review(store: JobStore) -> None:
    unfinished(store)
    fake = FakeAirflow([run()], [ti()])
    result = airflow_view(store, ReconcileParams(), api(fake))
    assert result.skipped is None
    assert [(f.check, f.count, f.repair) for f in result.findings] == [("task_failed", 4, "send_batch_to_review")]
    assert [(r.action, r.count) for r in result.repairs] == [("batch_sent_to_review", 4)]
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.manual_review WHERE reason = 'airflow_task_failed'"
            " AND context->>'repaired_by' = 'reconciliation'",
        )
        == 4
    )
    assert all(r.headers.get("Authorization") == "Bearer tok-123" for r in fake.requests if r.url.path != "/auth/token")
    assert [r.method for r in fake.requests if r.url.path == "/auth/token"] == ["GET"]  # all-admins token, once
    again = airflow_view(store, ReconcileParams(), api(fake))
    assert again.findings == ()
    assert again.repairs == ()


def test_a_failed_map_index_is_named_and_its_siblings_live_lease_is_spared(store: JobStore) -> None:
    """``classify`` is mapped: the repair takes what the failed map index held, not a sibling's lease."""
    unfinished(store)
    sibling = store.claim(
        batch_key=BATCH, step="classify", limit=1, lease_seconds=300, owner=f"classify_documents/{RUN}/classify/0/try1"
    )
    failed = {**ti(), "map_index": 1}
    result = airflow_view(store, ReconcileParams(), api(FakeAirflow([run()], [failed])))
    assert [(f.check, f.count, f.data["map_index"]) for f in result.findings] == [("task_failed", 4, 1)]
    assert "/classify[1] is failed" in result.findings[0].detail
    assert [(r.action, r.count) for r in result.repairs] == [("batch_sent_to_review", 3)]
    assert store.get_status(sibling.jobs[0].id) == JobStatus.RUNNING


def test_up_for_retry_is_reported_and_left_to_airflow(store: JobStore) -> None:
    unfinished(store)
    result = airflow_view(store, ReconcileParams(), api(FakeAirflow([run(state="running")], [ti("up_for_retry")])))
    assert [(f.check, f.repair) for f in result.findings] == [("task_up_for_retry", None)]
    assert result.repairs == ()
    assert result.conflicts == ()
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'queued'") == 4


def test_a_failed_task_while_another_run_of_the_batch_is_active_is_a_conflict(store: JobStore) -> None:
    unfinished(store)
    runs = [run(), run("backfill__2026-11-06T00:00:00+00:00", state="running")]
    result = airflow_view(store, ReconcileParams(), api(FakeAirflow(runs, [ti()])))
    assert result.repairs == ()
    assert [c.check for c in result.conflicts] == ["task_failed_run_active"]


def test_a_failed_task_whose_batch_is_settled_is_not_a_finding(store: JobStore) -> None:
    result = airflow_view(store, ReconcileParams(), api(FakeAirflow([run()], [ti()])))
    assert result.findings == ()


def test_a_dry_run_only_reports(store: JobStore) -> None:
    unfinished(store)
    result = airflow_view(store, ReconcileParams(dry_run=True), api(FakeAirflow([run()], [ti()])))
    assert [f.repair for f in result.findings] == ["send_batch_to_review"]
    assert result.repairs == ()


def test_credentials_go_to_post_auth_token(store: JobStore) -> None:
    fake = FakeAirflow([run()], [ti()])
    airflow_view(store, ReconcileParams(), api(fake, username="reconciler", password="s3cret"))
    token_calls = [r for r in fake.requests if r.url.path == "/auth/token"]
    assert [r.method for r in token_calls] == ["POST"]
    assert json.loads(token_calls[0].content) == {"username": "reconciler", "password": "s3cret"}


def test_a_refused_token_degrades_to_skipped(store: JobStore) -> None:
    unfinished(store)
    result = airflow_view(store, ReconcileParams(), api(FakeAirflow([run()], [ti()], token_status=403)))
    assert result.skipped is not None
    assert "HTTP 403" in result.skipped
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'queued'") == 4


def test_an_unreachable_api_degrades_to_skipped_and_the_run_succeeds(store: JobStore) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = AirflowApi(f"http://127.0.0.1:{port}", timeout_s=2)
    outcome = reconcile(store, ReconcileParams(), api=client)
    skipped = outcome.summary["totals"]["skipped"]["airflow_view"]
    assert skipped.startswith("Airflow's REST API is unavailable")
    assert "ConnectError" in skipped


class LateAirflow:
    """:class:`FakeAirflow` on real HTTP, at a port reserved now (bound, not listening: every
    connection is refused, as before an API server has started) that starts listening after
    ``delay`` seconds (None: never)."""

    def __init__(self, fake: FakeAirflow, delay: float | None) -> None:
        self.fake, self.delay = fake, delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = ThreadingHTTPServer(self.sock.getsockname(), self._handler(), bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = self.sock
        self.listening_at: float | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self.fake

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = httpx.Request(
                    self.command, f"http://fake{self.path}", headers=dict(self.headers), content=body
                )
                response = fake(request)
                self.send_response(response.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def _serve(self) -> None:
        assert self.delay is not None
        time.sleep(self.delay)
        self.server.server_activate()  # listen(): from now on connections are accepted
        self.listening_at = time.monotonic()
        self.server.serve_forever(poll_interval=0.05)

    def __enter__(self) -> LateAirflow:
        if self.delay is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


def test_the_cross_check_waits_for_an_api_server_that_starts_listening_late(store: JobStore) -> None:
    """The first reconcile_jobs after ``make up`` can run before the API server listens."""
    unfinished(store)
    with LateAirflow(FakeAirflow([run()], [ti()]), delay=2.0) as late:
        began = time.monotonic()
        result = airflow_view(store, ReconcileParams(), AirflowApi(late.url, timeout_s=5, wait_s=60))
        waited = time.monotonic() - began
    assert result.skipped is None
    assert [(r.action, r.count) for r in result.repairs] == [("batch_sent_to_review", 4)]
    assert late.listening_at is not None
    assert 2.0 <= waited < 12.0  # retried with backoff (0.5, 1, 2, 4 s), not for the whole minute


def test_the_wait_is_bounded_then_the_view_is_skipped(store: JobStore) -> None:
    unfinished(store)
    with LateAirflow(FakeAirflow([run()], [ti()]), delay=None) as never:
        began = time.monotonic()
        result = airflow_view(store, ReconcileParams(), AirflowApi(never.url, timeout_s=5, wait_s=1.5))
        waited = time.monotonic() - began
    assert result.skipped is not None
    assert "ConnectError" in result.skipped
    assert 1.5 <= waited < 4.0
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'queued'") == 4


def test_no_wait_once_the_api_server_was_reached(store: JobStore) -> None:
    """A server that refuses after it answered is not starting: the client gives up at once."""
    fake = FakeAirflow([run()], [ti()])
    late = LateAirflow(fake, delay=0.0)
    with late:
        client = AirflowApi(late.url, timeout_s=5, wait_s=60)
        assert client.get("/api/v2/dags/classify_documents/dagRuns")["total_entries"] == 1
    began = time.monotonic()
    with pytest.raises(AirflowApiUnavailable, match="ConnectError"):
        client.get("/api/v2/dags/classify_documents/dagRuns")
    assert time.monotonic() - began < 1.0
