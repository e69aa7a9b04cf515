"""Airflow's verdict on a bearer token, reused for a few seconds by one API server process.

Airflow's :func:`~airflow.api_fastapi.core_api.security.get_user` verifies a request's JWT
(signature, ``exp``, ``nbf``, audience), then looks its ``jti`` up in the ``revoked_token`` table
of Airflow's metadata database, in a session of its own, on the event loop: about 1.3 ms of the
API server's CPU and 2.4 ms during which the process serves no other request, on every request
(docs/performance.md). A client of intake posts batch after batch with one token, so
:class:`TokenCache` keeps what Airflow answered for a token for :data:`TOKEN_TTL_SECONDS`:

- the user Airflow's own check resolved from the token, and the auth manager's grants for that
  user (:meth:`Known.may`), each worked out once per entry; a refusal is never kept (asked
  again on the next request): a right that appears (a DAG parsed, a permission synced) is
  honoured at once, never refused from memory;
- the key is the SHA-256 of the whole token (header, claims and signature): a token that differs
  in any byte (forged, re-signed, tampered with) is another key, and a key is stored only after
  Airflow's check accepted its token; a refused token is never stored;
- an entry serves for at most :data:`TOKEN_TTL_SECONDS` from the moment its check began, and
  never once the token's ``exp`` has passed: then Airflow checks again (and answers 401);
- so a token revoked through Airflow (``auth_manager.revoke_token``, what logging out does) and a
  user's changed rights take effect on this process within :data:`TOKEN_TTL_SECONDS`;
- at most :data:`MAX_TOKENS` entries, the oldest dropped first: distinct valid tokens cost
  Airflow's checks, not memory.

Only a bearer token (what scripts send) is cached; a request without one (the UI's session
cookie) goes through Airflow's ``get_user`` as before, its answers worked out per request.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import jwt
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, resolve_user_from_token
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from triage.web.access import authorized

TOKEN_TTL_SECONDS = 5.0
"""How long Airflow's verdict on a bearer token is reused: the bound on how long a revoked
token, or a user whose rights were withdrawn, is still served by one API server process."""

MAX_TOKENS = 1024
"""Entries kept at most (tokens seen within :data:`TOKEN_TTL_SECONDS`), the oldest dropped first."""


@dataclass(slots=True)
class Known:
    """A caller Airflow authenticated, and the auth manager's answers for them so far."""

    user: BaseUser
    checked_at: float = 0.0  # the clock when Airflow's check of the token began
    expires_at: float = 0.0  # the token's exp (seconds since the epoch)
    decisions: dict[tuple[str, str, Any], bool] = field(default_factory=dict)

    def may(self, method: str, dag_id: str, entity: Any = None) -> bool:
        """:func:`~triage.web.access.authorized`: a grant asked once per entry, a refusal every time."""
        key = (method, dag_id, entity)
        if self.decisions.get(key):
            return True
        granted = authorized(self.user, method, dag_id, entity)
        if granted:
            self.decisions[key] = True
        return granted


def _expiry(token: str) -> float | None:
    """The ``exp`` claim of a token Airflow has just verified (so read without verifying again)."""
    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    except jwt.InvalidTokenError:
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class TokenCache:
    """:param clock: monotonic seconds (entries' age); :param wall: seconds since the epoch (``exp``)."""

    def __init__(
        self,
        *,
        ttl: float = TOKEN_TTL_SECONDS,
        size: int = MAX_TOKENS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ttl, self.size, self._clock, self._wall = ttl, size, clock, wall
        self._entries: OrderedDict[bytes, Known] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, token: str) -> bool:
        return _key(token) in self._entries

    async def known(self, token: str) -> Known:
        """The caller ``token`` names: from an entry still fresh, else Airflow's check (which
        raises Airflow's 401/403), stored when it accepts."""
        key, began = _key(token), self._clock()
        entry = self._entries.get(key)
        if entry is not None and began - entry.checked_at < self.ttl and self._wall() < entry.expires_at:
            return entry
        self._entries.pop(key, None)
        user = await resolve_user_from_token(token)
        expires_at = _expiry(token)
        entry = Known(user, began, expires_at or 0.0)
        if expires_at is not None and self._wall() < expires_at:
            self._entries[key] = entry
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return entry


def _key(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


async def known_caller(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Known:
    """Who is asking, as Airflow's ``get_user`` answers (a bearer token wins over the cookie),
    a bearer token's verdict reused through the app's :class:`TokenCache`."""
    if bearer is not None and bearer.credentials:
        return await request.app.state.tokens.known(bearer.credentials)
    return Known(await get_user(request, None, bearer))


KnownCaller = Annotated[Known, Depends(known_caller)]
