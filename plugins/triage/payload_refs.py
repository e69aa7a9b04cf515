"""What a ``payload_ref`` may be, and the errors of reading a payload.

A reference is data in a database row, and the store opens what it names: so a store accepts
only the references it writes itself, ``<prefix>/ab/<sha256>`` with an optional
``#offset=O&length=L``, the prefix being its own base (docs/security.md). Parsing is pure: no
file is opened until a reference has passed :func:`parse_ref`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RANGE = 2**31 - 1
"""The longest byte range a reference may name (a larger payload is an object of its own)."""
MAX_OFFSET = 2**53
"""The largest offset a reference may name: far past any pack, and still an exact integer."""


class PayloadError(Exception):
    """A payload cannot be read."""

    error_class = "payload_error"


class PayloadRefInvalid(PayloadError):
    """The reference is not one this store makes (another base, another path, a URL, a range
    that is not ``offset=…&length=…``): refused without reading anything; permanent."""

    error_class = "payload_ref_invalid"


class PayloadMissing(PayloadError):
    """The store is there and healthy, and the payload's object is not: gone; permanent."""

    error_class = "missing_payload"


class PayloadCorrupt(PayloadError):
    """The payload's content does not match its hash."""

    error_class = "payload_corrupt"


class PayloadUnavailable(PayloadError):
    """The store could not be read just now (permissions, I/O, network, a pack's folder
    absent): worth another try."""

    error_class = "payload_unavailable"


class PayloadBaseMissing(PayloadUnavailable):
    """The store's base is absent or empty (its volume is not mounted, its bucket is gone):
    no payload of the store can be read, whatever the job; transient."""


@dataclass(frozen=True, slots=True)
class Location:
    """Where a reference points: the object ``name`` (its sha256) under the store's base, and
    the payload's bytes in it (``None``: all of it)."""

    name: str
    offset: int | None = None
    length: int | None = None


# The one form a store writes after its prefix: "/ab/<sha256>", then "#offset=O&length=L" for a
# payload in a pack of several. ASCII digits without leading zeros (``\d`` would take any
# Unicode digit, and int() would read it), so each payload has one spelling.
_TAIL = re.compile(r"/([0-9a-f]{2})/([0-9a-f]{64})(?:#offset=(0|[1-9][0-9]{0,18})&length=(0|[1-9][0-9]{0,18}))?")


def shown_ref(ref: object) -> str:
    """A reference for an error message: bounded, and quoted so that it cannot pass for prose."""
    text = repr(ref)
    return text if len(text) <= 320 else f"{text[:200]}...{text[-100:]}"


def parse_ref(ref: object, prefix: str) -> Location:
    """The location of ``ref``, a reference of the store whose objects are ``<prefix>/ab/<sha256>``.

    Accepted, exactly: ``<prefix>/<sha256[:2]>/<sha256>``, optionally followed by
    ``#offset=O&length=L`` (decimal, ``L`` at most :data:`MAX_RANGE`). Everything else (another
    prefix, ``..``, a query, upper-case hex, a folder that is not the name's first two
    characters, a fragment of another shape) is refused.

    :raises PayloadRefInvalid: ``ref`` is not of that form.
    """
    if not isinstance(ref, str) or not ref.startswith(prefix + "/"):
        raise PayloadRefInvalid(f"payload_ref {shown_ref(ref)} is not under the payload base {prefix}")
    match = _TAIL.fullmatch(ref, len(prefix))
    if match is None or match[1] != match[2][:2]:
        raise PayloadRefInvalid(f"payload_ref {shown_ref(ref)} is not <base>/ab/<sha256>[#offset=O&length=L]")
    if match[3] is None:
        return Location(match[2])
    offset, length = int(match[3]), int(match[4])
    if offset > MAX_OFFSET or length > MAX_RANGE:
        raise PayloadRefInvalid(f"payload_ref {shown_ref(ref)} names a range past the limits of a pack")
    return Location(match[2], offset, length)
