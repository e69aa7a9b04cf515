"""Who is asking, and what they may do: Airflow's own authentication and authorisation.

The caller is Airflow's user, resolved by Airflow's own dependency
(:func:`airflow.api_fastapi.core_api.security.get_user`): a bearer token (``Authorization``,
what scripts send, from ``POST /auth/token``) or the UI's session cookie (``_token``, which the
Airflow UI sets at login and the browser sends to ``/triage`` on the same origin). No token: 401;
a bad one: 403. What they may do is the auth manager's answer for two DAGs, as for the rest of
Airflow:

- looking at the review queue and jobs: read (``GET``) on ``review_jobs``;
- looking at reports: read on ``reconcile_jobs``;
- deciding: edit (``PUT``) on ``review_jobs``, as for changing that DAG in the UI.

A refusal is final only once Airflow knows the DAG it is about: an auth manager may grant rights
per DAG (FAB's ``DAG:review_jobs`` permissions, which exist once the DAG processor has synced
the DAG), so right after a deployment starts, before the DAG is parsed, it would refuse a caller
it grants a minute later. While the DAG is unknown (no live row in Airflow's ``dag`` table) a
refusal is answered 503 with ``Retry-After`` ("not known yet"), never 403, and no answer is kept
(:func:`refusal`); the same caller is refused with 403 only when the refusal is the auth
manager's last word.

Every form post (the pages' decisions) must carry the page's form token: an HMAC, under the key
that signs Airflow's JWTs (the same on every API server of a deployment), of the user's id and
of the session (the ``_token`` cookie the page was rendered for), which another site cannot read
or make. It is good for that session only: a new login, or the session's end, makes it stale,
and a form post without a session has no token to show. Any request that carries the session
cookie and changes something (a decision by form or JSON, an intake post) is also refused when
its ``Origin`` names another host, is ``null`` (a sandboxed frame, a ``data:`` page) or is no
URL (:func:`same_origin`); reads are not (another origin cannot read their answers). Whether a
request is the session's does not depend on its ``Authorization`` header: Airflow takes the
caller from the cookie whenever the header holds no bearer token. The cookie is
``SameSite=Lax`` already; the token also covers the other ports of the same host, which count
as the same site. A bearer-token call without the cookie (a script) needs neither: a browser
never sends a bearer token on its own.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import get_user
from airflow.configuration import conf
from fastapi import Depends, HTTPException, Request, status

REVIEW_DAG = "review_jobs"
REPORT_DAG = "reconcile_jobs"
READ, EDIT = "GET", "PUT"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated Airflow user, and whether they may decide."""

    name: str
    may_decide: bool
    session: str | None  # the session cookie's token: its requests need the origin check, its forms the form token
    user: BaseUser

    @property
    def csrf_token(self) -> str:
        """The form token of this user's session ("" without one: no form post can succeed)."""
        return form_token(self.user, self.session) if self.session else ""


def authorized(user: BaseUser, method: str, dag_id: str, entity: Any = None) -> bool:
    """The auth manager's answer for ``method`` on DAG ``dag_id`` (``entity``: a
    ``DagAccessEntity`` such as ``RUN``, for the DAG's runs; its team looked up only when
    Airflow runs with teams: the lookup reads Airflow's metadata database)."""
    team = None
    if conf.getboolean("core", "multi_team", fallback=False):
        from airflow.models.dag import DagModel

        team = DagModel.get_team_name(dag_id)
    details = DagDetails(id=dag_id, team_name=team)
    return bool(
        get_auth_manager().is_authorized_dag(method=method, access_entity=entity, details=details, user=user)  # type: ignore[arg-type]
    )


DAG_UNKNOWN_RETRY_SECONDS = 10
"""The ``Retry-After`` of a refusal while the DAG is not parsed yet (the DAG processor's first pass)."""


def dag_known(dag_id: str) -> bool:
    """Whether Airflow has parsed ``dag_id``: a row in its ``dag`` table that is not stale."""
    import sqlalchemy as sa
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.scalar(sa.select(DagModel.is_stale).where(DagModel.dag_id == dag_id)) is False


def refusal(dag_id: str, message: str) -> HTTPException:
    """The answer to a caller the auth manager refused for ``dag_id``: 403 with ``message`` once
    Airflow knows the DAG, else 503 with ``Retry-After`` (its rights may not exist yet)."""
    if dag_known(dag_id):
        return HTTPException(status.HTTP_403_FORBIDDEN, message)
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"Airflow has not parsed the {dag_id} DAG yet, so who may use it is not known: try again shortly",
        headers={"Retry-After": str(DAG_UNKNOWN_RETRY_SECONDS)},
    )


def _form_key() -> bytes:
    """What signs Airflow's JWTs (the private key file, else ``[api_auth] jwt_secret``): every API
    server process of a deployment must share it for any login to work, so a form one process
    rendered is accepted by another. (``[api] secret_key`` is random per process when unset.)"""
    private_key = conf.get("api_auth", "jwt_private_key_path", fallback="")
    if private_key:
        return Path(private_key).read_bytes()
    return conf.get("api_auth", "jwt_secret", fallback="").encode()


def form_token(user: BaseUser, session: str) -> str:
    """The form token of ``user``'s ``session`` (the ``_token`` cookie's JWT, hashed: it differs
    for every login and ends with it)."""
    bound = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()
    return hmac.new(_form_key(), f"triage-form:{user.get_id()}:{bound}".encode(), hashlib.sha256).hexdigest()


def _caller(request: Request, user: BaseUser, dag_id: str) -> Caller:
    if not authorized(user, READ, dag_id):
        raise refusal(dag_id, f"you may not read the {dag_id} DAG")
    session = session_of(request)
    return Caller(str(user.get_name()), authorized(user, EDIT, REVIEW_DAG), session, user)


async def review_reader(request: Request, user: Annotated[BaseUser, Depends(get_user)]) -> Caller:
    return _caller(request, user, REVIEW_DAG)


async def report_reader(request: Request, user: Annotated[BaseUser, Depends(get_user)]) -> Caller:
    return _caller(request, user, REPORT_DAG)


ReviewReader = Annotated[Caller, Depends(review_reader)]
ReportReader = Annotated[Caller, Depends(report_reader)]


def session_of(request: Request) -> str | None:
    """The session cookie's token, if the request carries one (whatever its ``Authorization``)."""
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN) or None


def _netloc(origin: str) -> str | None:
    """The host and port an ``Origin`` names; None when it is no URL (``urlsplit`` raises for a
    bracketed host that is no IPv6 address: refused, never a 500)."""
    try:
        return urlsplit(origin).netloc
    except ValueError:
        return None


def same_origin(request: Request) -> None:
    """Refuse a request whose ``Origin`` is another host's, or ``null`` (an opaque origin: a
    sandboxed frame, a ``data:`` page, a redirect across sites). None at all is a client that is
    no browser page (the form token still holds). Asked of every request that carries the
    session cookie and changes something: decisions here, intake's posts (``triage.web.intake``)."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    if origin.strip().lower() == "null" or _netloc(origin) != request.headers.get("host"):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "a request with this server's session must come from its own pages (Origin)"
        )


def check_decider(request: Request, caller: Caller, token: str | None = None) -> None:
    """Refuse a decision the caller may not make, or one another site may have sent for them.

    :param token: the form's ``csrf_token``: given (``""`` when the form had none) for every form
        post, whoever sends it; checked against the session's. The JSON API passes none: its body
        must be ``application/json`` (FastAPI refuses any other with a 422), which a page of
        another origin cannot send without a CORS preflight this app never grants.
    """
    if not caller.may_decide:
        raise refusal(REVIEW_DAG, f"you may look but not decide: deciding needs edit access to {REVIEW_DAG}")
    if caller.session is not None:
        same_origin(request)
    if token is None:
        return
    if caller.session is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "a form post needs the session of the page it came from; scripts decide through /triage/api/reviews",
        )
    # As bytes: compare_digest raises TypeError for a str that is not ASCII (a forged token's 500).
    if not (token and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), caller.csrf_token.encode())):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "the form is stale or not this server's: open the page again")


def login_url(next_url: str) -> str | None:
    """Airflow's login page, to come back to ``next_url``; None when the auth manager has none."""
    try:
        return str(get_auth_manager().get_url_login(next_url=next_url))
    except Exception:  # noqa: BLE001 - a link on an error page; its absence is not an error
        return None


def describe(caller: Caller) -> dict[str, Any]:
    return {"name": caller.name, "may_decide": caller.may_decide}
