"""What a provider's error response says, read without ever keeping its free text (which could
echo the request): the short error codes, whether it refuses structured output, ``Retry-After``."""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from typing import Final

import httpx

__all__ = ["error_detail", "refuses_schema", "retry_after"]

_SAFE_CODE: Final = re.compile(r"^[\w.\-]{1,64}$")
_SCHEMA_REFUSAL: Final = re.compile(r"response_format|json_schema|structured output", re.IGNORECASE)


def refuses_schema(response: httpx.Response) -> bool:
    """Whether a 400/422 is the provider refusing ``response_format: json_schema`` (its error's
    ``param``, ``code`` or message names it), not the request's content."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return bool(_SCHEMA_REFUSAL.search(response.text[:2000]))
    if isinstance(error, dict):
        said = " ".join(str(error.get(key) or "") for key in ("param", "code", "message"))
    else:
        said = str(error)
    return bool(_SCHEMA_REFUSAL.search(said[:2000]))


def error_detail(response: httpx.Response) -> str:
    """The provider's error type/code if it is a short token; never free text, which could
    echo the request."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    codes = [str(error.get(key)) for key in ("type", "code") if error.get(key) is not None]
    safe = [code for code in codes if _SAFE_CODE.match(code)]
    return f" ({', '.join(safe)})" if safe else ""


def retry_after(response: httpx.Response) -> float | None:
    """The response's ``Retry-After`` in seconds (delta-seconds or an HTTP date); None when absent
    or unreadable. Not bounded here: the caller decides how long it is willing to wait."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)
