"""Intake's reuse of Airflow's verdict on a bearer token (``triage.web.token_cache``): what it
saves never lets through a token Airflow would refuse, beyond the bound the docs state.

Behind Airflow's real SimpleAuthManager, its real JWTs and its real revocation path
(``auth_manager.revoke_token``, what logging out does: a row in the metadata database's
``revoked_token`` table); the cache's clocks are its seams, so the bound is crossed without
waiting for it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.ledger.intake_server import ROOT_PATH, VERSION
from tests.ledger.test_triage_web import LABELS, airflow_auth, token  # noqa: F401 - the module's auth fixture
from triage.jobs.store import JobStore
from triage.web.token_cache import TOKEN_TTL_SECONDS, TokenCache

URL = f"{ROOT_PATH}/api/documents"
JSON = {"Content-Type": "application/json"}


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client_with(store: JobStore, tmp_path: Path, tokens: TokenCache) -> TestClient:
    from triage.web.app import create_app
    from triage.web.intake_service import IntakeService
    from triage.web.service import TriageService

    triage = TriageService(store, payload_base=str(tmp_path / "payloads"), taxonomy_names=LABELS)
    intake = IntakeService(triage, announce=lambda n: True, classifier_version=VERSION)
    root = FastAPI()
    root.mount(ROOT_PATH, create_app(triage, intake, tokens))
    return TestClient(root)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tokens(clock: Clock) -> TokenCache:
    return TokenCache(clock=clock)


@pytest.fixture
def client(store: JobStore, tmp_path: Path, tokens: TokenCache, airflow_auth: Any) -> Iterator[TestClient]:  # noqa: F811
    with client_with(store, tmp_path, tokens) as running:
        yield running


def post(client: TestClient, bearer: str, external_id: str) -> int:
    document = {
        "source": "helpdesk",
        "external_id": external_id,
        "subject": "Refund please",
        "body": "I was charged twice.",
        "received_at": "2026-12-01T09:00:00+00:00",
    }
    headers = {**JSON, "Authorization": f"Bearer {bearer}"}
    return client.post(URL, content=json.dumps(document), headers=headers).status_code


def jobs(store: JobStore) -> int:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one())


def test_a_revoked_token_is_refused_once_the_bound_has_passed(
    client: TestClient,
    tokens: TokenCache,
    clock: Clock,
    airflow_auth: Any,  # noqa: F811
) -> None:
    from airflow.models.revoked_token import RevokedToken

    editor = token(airflow_auth, "editor", "user")
    assert post(client, editor, "R-1") == 202
    airflow_auth.revoke_token(editor)  # Airflow's own revocation (logout)
    assert RevokedToken.is_revoked(jwt.decode(editor, options={"verify_signature": False})["jti"])
    clock.now += TOKEN_TTL_SECONDS - 0.5
    assert post(client, editor, "R-2") == 202  # within the bound: the verdict is reused
    clock.now += 0.5
    assert post(client, editor, "R-3") == 403  # past it: Airflow's check again, which finds the revocation
    assert not tokens.holds(editor)
    assert post(client, editor, "R-4") == 403  # and never stored again


def test_an_expired_token_is_refused_even_while_its_entry_is_fresh(
    store: JobStore,
    tmp_path: Path,
    airflow_auth: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    # Airflow's own validator, without its leeway: it refuses the token a second after its exp.
    # Tokens of a lifetime of their own, signed by Airflow's generator with the validator's key.
    validator = airflow_auth._get_token_validator()
    monkeypatch.setattr(validator, "leeway", 0)
    claims = airflow_auth.serialize_user(SimpleAuthManagerUser(username="editor", role="user"))

    def signed(valid_for: float) -> str:
        generator = JWTGenerator(secret_key=validator.secret_key, valid_for=valid_for, audience=validator.audience)
        return str(generator.generate(claims))

    long_lived = TokenCache(ttl=3600)  # the entry stays fresh: only exp can refuse the token
    short, expired = signed(2), signed(-1)
    with client_with(store, tmp_path, long_lived) as client:
        assert post(client, expired, "E-0") == 401
        assert not long_lived.holds(expired)
        assert post(client, short, "E-1") == 202
        assert long_lived.holds(short)
        exp = jwt.decode(short, options={"verify_signature": False})["exp"]
        time.sleep(max(0.0, exp - time.time()) + 1.1)
        assert post(client, short, "E-2") == 401
        assert not long_lived.holds(short)
    assert jobs(store) == 1


def test_a_user_without_the_right_is_refused_right_after_one_with_it_was_accepted(
    client: TestClient,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    editor, viewer = token(airflow_auth, "editor", "user"), token(airflow_auth, "viewer", "viewer")
    assert post(client, editor, "A-1") == 202
    assert post(client, viewer, "A-2") == 403
    assert post(client, viewer, "A-3") == 403  # the refusal is the viewer's, cached or not
    assert post(client, editor, "A-4") == 202  # and the editor's right is the editor's
    assert jobs(store) == 2


def _forge_claims(real: str, **claims: Any) -> str:
    """``real`` with its claims changed and its signature kept (what needs no key)."""
    header, payload, signature = real.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**decoded, **claims}).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_a_forged_token_never_reaches_the_cache(
    client: TestClient,
    tokens: TokenCache,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    viewer = token(airflow_auth, "viewer", "viewer")
    editor = token(airflow_auth, "editor", "user")
    assert post(client, editor, "F-1") == 202  # an editor's verdict is cached
    claims = jwt.decode(editor, options={"verify_signature": False})
    header = jwt.get_unverified_header(editor)
    forgeries = {
        "the editor's claims signed with another key": jwt.encode(claims, "x" * 64, algorithm=header["alg"]),
        "the viewer's token raised to the editor's role": _forge_claims(viewer, role="user", sub="editor"),
        "the editor's token for another user": _forge_claims(editor, sub="mallory"),
        "the editor's token, signature cut": editor.rsplit(".", 1)[0] + ".",
        "the editor's token with alg none": jwt.encode(claims, "", algorithm="none"),
        "the editor's token, one character more": editor + "A",
    }
    for what, forged in forgeries.items():
        assert post(client, forged, "F-2") == 403, what
        assert not tokens.holds(forged), what
    assert len(tokens) == 1
    assert jobs(store) == 1


def test_the_cache_holds_at_most_its_size_oldest_out_first(
    store: JobStore,
    tmp_path: Path,
    airflow_auth: Any,  # noqa: F811
) -> None:
    small = TokenCache(size=2)
    first, second, third = (token(airflow_auth, name, "user") for name in ("editor", "second", "editor"))
    with client_with(store, tmp_path, small) as client:
        for i, bearer in enumerate((first, second, third)):
            assert post(client, bearer, f"S-{i}") == 202
    assert len(small) == 2
    assert not small.holds(first)
    assert small.holds(second)
    assert small.holds(third)


def test_a_request_without_a_bearer_token_is_checked_by_airflow_as_before(
    client: TestClient,
    tokens: TokenCache,
    airflow_auth: Any,  # noqa: F811
) -> None:
    cookie = token(airflow_auth, "editor", "user")
    client.cookies.set("_token", cookie)
    response = client.post(URL, content=json.dumps({"external_id": "C-2"}), headers=JSON)
    assert response.status_code == 422  # authenticated by the cookie, then refused as a document
    assert len(tokens) == 0  # a cookie's verdict is not stored
