"""Authorization answers the same for the same caller (issue #25): right after a deployment
started, a reviewer's decision was refused with 403 "you may look but not decide" and accepted
later. An auth manager that grants rights per DAG (FAB's ``DAG:review_jobs`` permissions exist
once the DAG processor synced the DAG) refuses everyone but admins on a DAG Airflow has not
parsed yet; the app now answers that moment with 503 and ``Retry-After`` (the truth: not known
yet), never with a 403 that a later request contradicts, and keeps no refusal in its token cache.

The auth manager is Airflow's SimpleAuthManager with that one FAB trait (:class:`PerDagAuthManager`,
a seam subclass); tokens, their checks and Airflow's ``dag`` table are Airflow's own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.ledger.intake_server import ROOT_PATH, VERSION
from tests.ledger.test_triage_web import LABELS, PARSED_DAGS, _forget_token_keys, parsed_dags, token
from triage.jobs.store import JobStore
from triage.web.access import dag_known
from triage.web.token_cache import TokenCache


class PerDagAuthManager(SimpleAuthManager):
    """SimpleAuthManager with FAB's per-DAG edit rights: reading every DAG is granted globally,
    but a non-admin's right to change or trigger a DAG exists only once Airflow has parsed it."""

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        per_dag = method != "GET" and details is not None and details.id
        if per_dag and not self._is_admin(user) and not dag_known(details.id):
            return False
        return bool(super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details))


@pytest.fixture(scope="module")
def per_dag_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The auth manager and Airflow's metadata engine (an SQLite database of this module's own)."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("airflow-home")
        mp.setenv("AIRFLOW_HOME", str(home))
        mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", f"{__name__}.PerDagAuthManager")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "viewer:viewer,editor:user")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-jwt-secret-" + uuid.uuid4().hex)
        mp.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db")
        from airflow import settings
        from airflow.api_fastapi import app as airflow_app
        from airflow.models.revoked_token import RevokedToken

        settings.dispose_orm()
        settings.configure_vars()
        settings.configure_orm()
        RevokedToken.__table__.create(settings.engine)
        airflow_app.purge_cached_app()
        _forget_token_keys()
        manager = airflow_app.init_auth_manager()
        assert isinstance(manager, PerDagAuthManager)
        yield manager, settings.engine
        airflow_app.purge_cached_app()
        _forget_token_keys()
        settings.dispose_orm()
    settings.configure_vars()
    settings.configure_orm()


@pytest.fixture
def fresh(per_dag_auth: tuple[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """A deployment that has just started: Airflow has parsed none of the DAGs."""
    manager, engine = per_dag_auth
    parsed_dags(engine, [])
    yield manager, engine
    parsed_dags(engine, [])


class Frozen:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client(store: JobStore, tmp_path: Path, fresh: Any) -> Iterator[TestClient]:
    from triage.web.app import create_app
    from triage.web.intake_service import IntakeService
    from triage.web.service import TriageService

    triage = TriageService(store, payload_base=str(tmp_path / "payloads"), taxonomy_names=LABELS)
    intake = IntakeService(triage, announce=lambda n: True, classifier_version=VERSION)
    root = FastAPI()
    # The token cache's clock stands still: any refusal it kept would still be served.
    root.mount(ROOT_PATH, create_app(triage, intake, TokenCache(clock=Frozen())))
    with TestClient(root) as running:
        yield running


def test_a_decision_before_the_dag_is_parsed_is_not_yet_known_then_accepted(
    client: TestClient, fresh: tuple[Any, Any]
) -> None:
    manager, engine = fresh
    editor = {"Authorization": f"Bearer {token(manager, 'editor', 'user')}"}
    viewer = {"Authorization": f"Bearer {token(manager, 'viewer', 'viewer')}"}
    decide = f"{ROOT_PATH}/api/reviews/{uuid.uuid4()}"
    early = [client.post(decide, json={"action": "requeue"}, headers=editor) for _ in range(2)]
    for answer in early:  # was: 403 "you may look but not decide", contradicted a minute later
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "10"
        assert "not parsed the review_jobs DAG yet" in answer.json()["detail"]
    parsed_dags(engine, PARSED_DAGS)  # the DAG processor's first pass
    for _ in range(3):  # the same answer every time: authorized (then: no such job)
        assert client.post(decide, json={"action": "requeue"}, headers=editor).status_code == 404
        refused = client.post(decide, json={"action": "requeue"}, headers=viewer)
        assert refused.status_code == 403
        assert "look but not decide" in refused.json()["detail"]


def test_intake_keeps_no_refusal_of_a_token(client: TestClient, fresh: tuple[Any, Any]) -> None:
    manager, engine = fresh
    editor = {"Authorization": f"Bearer {token(manager, 'editor', 'user')}", "Content-Type": "application/json"}
    document = {
        "source": "helpdesk",
        "external_id": "S-1",
        "subject": "Refund please",
        "body": "I was charged twice.",
        "received_at": "2026-12-01T09:00:00+00:00",
    }
    early = client.post(f"{ROOT_PATH}/api/documents", content=json.dumps(document), headers=editor)
    assert early.status_code == 503, early.text
    assert early.headers["Retry-After"] == "10"
    parsed_dags(engine, PARSED_DAGS)
    # the same token, its cache entry fresh: the refusal was not kept
    accepted = client.post(f"{ROOT_PATH}/api/documents", content=json.dumps(document), headers=editor)
    assert accepted.status_code == 202, accepted.text


def test_a_dag_that_never_parses_answers_503_only_to_whom_it_refuses(
    client: TestClient, fresh: tuple[Any, Any]
) -> None:
    """The 503 cannot be turned against a caller the auth manager grants: while ``review_jobs`` is
    unknown (never parsed), an admin, whose rights do not depend on it, decides every time; only
    the refused get the 503. The DAG ids asked about are the app's own, never a request's."""
    manager, _engine = fresh
    admin = {"Authorization": f"Bearer {token(manager, 'boss', 'admin')}"}
    viewer = {"Authorization": f"Bearer {token(manager, 'viewer', 'viewer')}"}
    decide = f"{ROOT_PATH}/api/reviews/{uuid.uuid4()}"
    for _ in range(3):
        assert client.post(decide, json={"action": "requeue"}, headers=admin).status_code == 404  # authorized
        refused = client.post(decide, json={"action": "requeue"}, headers=viewer)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "10"
