"""Which intake caller may post for which source (issue #25): a document's ``source`` names whose
documents it is, and its ``(source, external_id)`` is the document's identity at the label
provider (``document_labels``). Posting for a source is speaking for it, so it is bound:

- **pull sources' names are reserved**: ``synthetic``, ``jsonl`` (the sources ``classify_documents``
  reads, :data:`triage.sources.SOURCES`), ``test`` (what the test suite and drills register
  pull jobs under), and any name in ``$TRIAGE_INTAKE_RESERVED_SOURCES`` (a comma-separated list,
  for sources another DAG or script registers). An intake document with one of these names
  would share a pulled document's identity: its label would replace the pulled one at the
  provider. Refused to every caller, and no binding may name one;
- **bound sources** (``$TRIAGE_INTAKE_SOURCES``, a JSON object, read by the API server): each
  source lists who may post for it, as ``"user:NAME"`` (an Airflow user's name) or
  ``"role:NAME"`` (a role of the user: SimpleAuthManager's one role, FAB's roles), e.g.
  ``{"helpdesk": ["user:helpdesk-bot"], "crm": ["role:crm_intake"]}``. A source not listed is
  refused to everyone. Unset: any caller with the right to post (the trigger right on
  ``classify_intake``) may post for any source that is not reserved;
- a binding that cannot be read (not JSON, a source listed twice, an unknown kind, a name with a
  space at either end, a reserved or invalid source name) refuses every post (503), never falls
  open.

Names are reserved rather than intake's sources namespaced (``intake.helpdesk``): a namespace
would change the identity, and so the idempotency key and the provider's key, of every document
intake has accepted so far. The environment, not an Airflow Variable, holds the bindings: a
Variable is editable through Airflow's UI and API by users who are not deployers, and whoever
may widen a binding could take a source over.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from triage.contracts.intake import SOURCE_PATTERN
from triage.settings import ENV_INTAKE_RESERVED_SOURCES, ENV_INTAKE_SOURCES
from triage.sources import SOURCES

TEST_SOURCE = "test"
"""The source the test suite's and the drills' pull jobs carry (``tests/ledger/helpers.py``)."""

RESERVED_SOURCES: frozenset[str] = frozenset({*SOURCES, TEST_SOURCE})
"""Pull sources' names: refused to intake callers whatever the bindings say."""

KINDS = ("user", "role")


class BindingError(ValueError):
    """``$TRIAGE_INTAKE_SOURCES`` or ``$TRIAGE_INTAKE_RESERVED_SOURCES`` cannot be used."""


@dataclass(frozen=True, slots=True)
class Bindings:
    """:param bound: who may post for each source (``("user", name)``, ``("role", name)``); None: unbound.
    :param reserved: the names no intake caller may post for."""

    bound: Mapping[str, frozenset[tuple[str, str]]] | None
    reserved: frozenset[str]

    def refusal(self, source: str, user: str, roles: Iterable[str]) -> str | None:
        """Why ``user`` (with ``roles``) may not post for ``source``; None when they may."""
        if source in self.reserved:
            return f"source {source} is a pull source's name: intake may not post documents for it"
        if self.bound is None:
            return None
        allowed = self.bound.get(source)
        if allowed is None:
            return f"no caller is bound to source {source} ({ENV_INTAKE_SOURCES})"
        if ("user", user) in allowed or any(("role", role) in allowed for role in roles):
            return None
        return f"{user} may not post documents for source {source} ({ENV_INTAKE_SOURCES})"


def _reserved(raw: str) -> frozenset[str]:
    extra = {name.strip() for name in raw.split(",") if name.strip()}
    bad = sorted(name for name in extra if not re.fullmatch(SOURCE_PATTERN, name))
    if bad:
        raise BindingError(f"{ENV_INTAKE_RESERVED_SOURCES} holds names that are no source: {', '.join(bad)}")
    return RESERVED_SOURCES | extra


def _principal(source: str, entry: Any) -> tuple[str, str]:
    """``("user", NAME)`` or ``("role", NAME)`` of one entry. A name with a space at either end is
    refused, not trimmed: it would equal no user's or role's name, a binding that binds nobody.
    The error names the source, never the entry (it reaches every intake caller in a 503)."""
    kind, sep, name = entry.partition(":") if isinstance(entry, str) else ("", "", "")
    if not sep or kind not in KINDS or not name or name != name.strip():
        raise BindingError(
            f'{ENV_INTAKE_SOURCES}: {source} lists an entry that is not "user:NAME" or "role:NAME"'
            " (no space around NAME)"
        )
    return kind, name


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: a source listed twice would keep its last list only,
    silently dropping the callers of the first."""
    found = dict(pairs)
    if len(found) != len(pairs):
        twice = sorted(key for key, count in Counter(key for key, _value in pairs).items() if count > 1)
        raise BindingError(f"{ENV_INTAKE_SOURCES} lists a source more than once: {', '.join(twice)}")
    return found


@lru_cache(maxsize=8)
def parse(sources: str | None, reserved: str = "") -> Bindings:
    """The bindings of these settings' texts (cached by text: read once per value)."""
    names = _reserved(reserved)
    if sources is None or not sources.strip():
        return Bindings(None, names)
    try:
        data = json.loads(sources, object_pairs_hook=_object)
    except BindingError:
        raise
    except (ValueError, RecursionError):
        raise BindingError(f"{ENV_INTAKE_SOURCES} is not JSON") from None
    if not isinstance(data, dict):
        raise BindingError(f'{ENV_INTAKE_SOURCES} is a JSON object: {{"source": ["user:NAME", "role:NAME"]}}')
    bound: dict[str, frozenset[tuple[str, str]]] = {}
    for source, entries in data.items():
        if not re.fullmatch(SOURCE_PATTERN, source):
            raise BindingError(f"{ENV_INTAKE_SOURCES}: {source!r} is no source name (1-64 of a-z0-9_.-)")
        if source in names:
            raise BindingError(f"{ENV_INTAKE_SOURCES}: {source} is a pull source's name and cannot be bound")
        if not isinstance(entries, list):
            raise BindingError(f"{ENV_INTAKE_SOURCES}: {source} needs a list of callers")
        bound[source] = frozenset(_principal(source, entry) for entry in entries)
    return Bindings(bound, names)


def configured() -> Bindings:
    """The deployment's bindings, from the API server's environment.

    :raises BindingError: they cannot be read (every post is then refused)."""
    return parse(os.environ.get(ENV_INTAKE_SOURCES), os.environ.get(ENV_INTAKE_RESERVED_SOURCES, ""))


def roles_of(user: Any) -> frozenset[str]:
    """The user's role names, as the auth manager's user object holds them: SimpleAuthManager's
    ``role``, FAB's ``roles`` (objects with a ``name``); none for an auth manager with neither.
    FAB's group roles are not read: ``groups`` loads lazily, and the user may be one the token
    cache holds outside any session (a refusal then, never an error or a grant)."""
    found: set[str] = set()
    role = getattr(user, "role", None)
    if isinstance(role, str) and role:
        found.add(role)
    for item in getattr(user, "roles", None) or ():
        name = getattr(item, "name", item)
        if isinstance(name, str) and name:
            found.add(name)
    return frozenset(found)
