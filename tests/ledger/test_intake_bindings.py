"""Intake bound to its callers (issue #25, finding 3): a caller posts only for the sources bound to
it (``TRIAGE_INTAKE_SOURCES``), and never for a pull source's name, whose documents it would
otherwise take over (its label replacing the pulled document's at the provider).

Over real HTTP (uvicorn), on the real database, behind Airflow's real SimpleAuthManager and
JWTs: ``editor`` and ``second`` both hold the ``user`` role (both may trigger ``classify_intake``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from tests.ledger.intake_server import ROOT_PATH, ThreadServer, root_app
from tests.ledger.test_triage_web import airflow_auth, as_user  # noqa: F401 - the module's auth fixture
from triage.jobs.store import JobStore
from triage.settings import ENV_INTAKE_RESERVED_SOURCES, ENV_INTAKE_SOURCES
from triage.web.intake_bindings import RESERVED_SOURCES

URL = f"{ROOT_PATH}/api/documents"
JSON = {"Content-Type": "application/json"}
PULL_BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def doc(source: str, external_id: str) -> dict[str, Any]:
    return {
        "source": source,
        "external_id": external_id,
        "subject": "Refund please",
        "body": "I was charged twice for my order, please refund the duplicate charge.",
        "received_at": "2026-12-01T09:00:00+00:00",
    }


@pytest.fixture
def server(store: JobStore, tmp_path: Path, airflow_auth: Any) -> Iterator[ThreadServer]:  # noqa: F811
    with ThreadServer(root_app(store, str(tmp_path / "payloads"), lambda n: True)) as running:
        yield running


def post(server: ThreadServer, body: Any, who: dict[str, str]) -> httpx.Response:
    return httpx.post(server.url + URL, content=json.dumps(body), headers={**JSON, **who}, timeout=30)


def intake_jobs(store: JobStore) -> list[tuple[str, str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT source, external_id FROM triage.jobs WHERE batch_key = 'intake' ORDER BY 1, 2")
        )
        return [(r.source, r.external_id) for r in rows]


def test_a_pull_jobs_document_cannot_be_taken_over_through_intake(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    """The takeover as reported: a pull job of source ``test`` exists; an intake caller posts
    ``source: "test"`` with its ``external_id``. Refused, and nothing registered."""
    [pulled] = new_jobs(1, prefix="T", source="test")
    store.register([pulled], batch_key=PULL_BATCH, step="classify", max_attempts=3)
    editor = as_user(airflow_auth, "editor", "user")
    refused = post(server, doc("test", pulled.external_id), editor)
    assert refused.status_code == 403, refused.text
    assert "pull source" in refused.json()["detail"]
    assert intake_jobs(store) == []


@pytest.mark.parametrize("source", sorted(RESERVED_SOURCES))
def test_every_pull_sources_name_is_refused_even_when_bound(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    monkeypatch.setenv(ENV_INTAKE_SOURCES, json.dumps({"helpdesk": ["user:editor"]}))
    refused = post(server, doc(source, "X-1"), as_user(airflow_auth, "editor", "user"))
    assert refused.status_code == 403, refused.text
    assert source in refused.json()["detail"]
    assert intake_jobs(store) == []


def test_two_callers_each_post_only_for_their_own_source(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_INTAKE_SOURCES, json.dumps({"helpdesk": ["user:editor"], "crm": ["role:user"]}))
    editor, second = as_user(airflow_auth, "editor", "user"), as_user(airflow_auth, "second", "user")
    assert post(server, doc("helpdesk", "H-1"), editor).status_code == 202
    taken = post(server, doc("helpdesk", "H-1"), second)  # B posts for A's source, A's very document
    assert taken.status_code == 403, taken.text
    assert "second may not post documents for source helpdesk" in taken.json()["detail"]
    assert post(server, doc("crm", "C-1"), second).status_code == 202  # bound by role
    unbound = post(server, doc("billing-system", "B-1"), editor)
    assert unbound.status_code == 403
    assert "no caller is bound to source billing-system" in unbound.json()["detail"]
    # a batch with one document of another's source registers none of it
    mixed = post(server, {"documents": [doc("crm", "C-2"), doc("helpdesk", "H-2")]}, second)
    assert mixed.status_code == 403
    assert intake_jobs(store) == [("crm", "C-1"), ("helpdesk", "H-1")]


def test_unbound_intake_still_refuses_pull_sources_and_a_reserved_extra(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``TRIAGE_INTAKE_SOURCES`` any caller with the trigger right posts for any source
    but the reserved ones (``TRIAGE_INTAKE_RESERVED_SOURCES`` adds to them)."""
    monkeypatch.setenv(ENV_INTAKE_RESERVED_SOURCES, "erp, legacy")
    editor = as_user(airflow_auth, "editor", "user")
    assert post(server, doc("helpdesk", "H-1"), editor).status_code == 202
    for source in ("synthetic", "jsonl", "test", "erp", "legacy"):
        assert post(server, doc(source, "X-1"), editor).status_code == 403, source
    assert intake_jobs(store) == [("helpdesk", "H-1")]


@pytest.mark.parametrize(
    "config",
    [
        pytest.param("not json", id="not-json"),
        pytest.param('["helpdesk"]', id="not-an-object"),
        pytest.param('{"helpdesk": "user:editor"}', id="not-a-list"),
        pytest.param('{"helpdesk": ["editor"]}', id="no-kind"),
        pytest.param('{"test": ["user:editor"]}', id="binds-a-pull-source"),
        pytest.param('{"Helpdesk!": ["user:editor"]}', id="not-a-source-name"),
        pytest.param('{"helpdesk": ["user:editor"], "helpdesk": ["user:second"]}', id="a-source-twice"),
        pytest.param('{"helpdesk": ["user: editor"]}', id="a-name-with-a-space"),
    ],
)
def test_a_malformed_binding_refuses_every_post_with_503(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    config: str,
) -> None:
    monkeypatch.setenv(ENV_INTAKE_SOURCES, config)
    refused = post(server, doc("helpdesk", "H-1"), as_user(airflow_auth, "editor", "user"))
    assert refused.status_code == 503, refused.text
    assert ENV_INTAKE_SOURCES in refused.json()["detail"]
    assert "editor" not in refused.json()["detail"]  # who is bound is the deployer's, not every caller's
    assert intake_jobs(store) == []


def test_a_refused_post_logs_no_document_text_nor_credential(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refusals' paths (a reserved source, another's source, bindings that cannot be read)
    log nothing of the document or the caller's token, at any level."""
    editor = as_user(airflow_auth, "editor", "user")
    marker = "CONFIDENTIAL-7f3a refund for card 4111"
    secret_doc = {**doc("test", "X-1"), "body": marker}
    caplog.set_level("DEBUG")
    assert post(server, secret_doc, editor).status_code == 403
    monkeypatch.setenv(ENV_INTAKE_SOURCES, json.dumps({"helpdesk": ["user:second"]}))
    assert post(server, {**secret_doc, "source": "helpdesk"}, editor).status_code == 403
    monkeypatch.setenv(ENV_INTAKE_SOURCES, "not json")
    assert post(server, {**secret_doc, "source": "helpdesk"}, editor).status_code == 503
    logged = caplog.text
    assert marker not in logged
    assert editor["Authorization"].removeprefix("Bearer ") not in logged
    assert intake_jobs(store) == []
