"""What a client posts to intake (``POST /triage/api/documents``): one document, or a batch.

Each document is checked on its own, strictly (``extra="forbid"``, no coercion), against the same
payload contract the sources write (:class:`~triage.contracts.documents.DocumentPayload`), plus
what only a client sends: the ``source`` it speaks for, an optional ``correlation_id`` and flat
``metadata``. A problem is reported per document, with the field and what is wrong, never with
the document's text. Identifiers are refused, not cleaned: an id with a control character, a
path-like ``..`` segment or more than 512 characters is a client's bug or an attack, and a
cleaned id would no longer deduplicate with the client's next retry.

A request's body is read in one pass when it is valid throughout (:func:`validate_body`:
pydantic parses and validates the bytes at once, in Rust, rather than ``json.loads`` and then a
validation per document); anything wrong in it sends the request to the per-document path
(:func:`parse_documents`), which says what, document by document. Both accept the same bodies
with the same values (tests/unit/test_intake_contract.py).
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC
from typing import Annotated, Any, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import to_json

from triage.contracts.documents import MAX_EXTERNAL_ID_LENGTH, DocumentPayload, canonical_json_bytes

__all__ = [
    "INTAKE_ASSET_NAME",
    "INTAKE_ASSET_URI",
    "INTAKE_BATCH",
    "INTAKE_DAG_ID",
    "MAX_BODY_CHARS",
    "MAX_METADATA_KEYS",
    "MAX_SUBJECT_CHARS",
    "IntakeBatch",
    "IntakeDocument",
    "Problem",
    "parse_documents",
    "validate_body",
]

INTAKE_DAG_ID: Final = "classify_intake"
"""The DAG that classifies intake's documents; a client needs the right to trigger it."""
INTAKE_BATCH: Final = "intake"
"""The batch key of every job intake registers: ``classify_intake`` runs claim from it, so a run
takes whatever is queued, whenever it was posted (a daily batch is a data interval instead)."""
INTAKE_ASSET_NAME: Final = "triage_intake"
INTAKE_ASSET_URI: Final = "triage://intake"
"""The Airflow Asset every accepted request updates; ``classify_intake`` is scheduled on it."""

MAX_SUBJECT_CHARS: Final = 10_000
MAX_BODY_CHARS: Final = 1_000_000
MAX_METADATA_KEYS: Final = 50
MAX_METADATA_VALUE_CHARS: Final = 1_000
SOURCE_PATTERN: Final = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
CORRELATION_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
METADATA_KEY: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# An id of printable ASCII without a space at either end (almost every id) holds no hostile
# character: only its path segments are left to check.
_PLAIN_ID: Final = re.compile(r"[!-~](?:[ -~]*[!-~])?")

# A leading slash or backslash, or a "." or ".." segment between them (what splitting at every
# slash and backslash would find), in one search: a request's hot path, once per document.
_PATH_LIKE: Final = re.compile(r"\A[/\\]|(?:\A|[/\\])\.\.?(?=[/\\]|\Z)")

# Unicode categories no identifier may hold: controls (C0, C1, DEL), format characters (bidi
# overrides that make an id read differently than it compares), surrogates, private use,
# unassigned, and the line and paragraph separators.
_HOSTILE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def hostile_id_problem(value: str) -> str | None:
    """Why ``value`` is no acceptable external id, or None."""
    if _PLAIN_ID.fullmatch(value) is None:
        if value != value.strip():
            return "external_id has leading or trailing whitespace"
        if any(unicodedata.category(c) in _HOSTILE_CATEGORIES for c in value):
            return "external_id holds a control, format or unassigned character"
    if _PATH_LIKE.search(value):
        return "external_id looks like a path (a leading slash, or a '.' or '..' segment)"
    return None


Scalar = str | int | float | bool | None


class IntakeDocument(BaseModel):
    """One document as a client posts it."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    source: Annotated[str, Field(pattern=SOURCE_PATTERN, description="who sends it: lowercase, 1-64 of a-z0-9_.-")]
    external_id: Annotated[str, Field(min_length=1, max_length=MAX_EXTERNAL_ID_LENGTH)]
    subject: Annotated[str, Field(max_length=MAX_SUBJECT_CHARS)]
    body: Annotated[str, Field(max_length=MAX_BODY_CHARS)]
    # JSON has no datetime: an ISO 8601 string with its offset is parsed (strict would refuse
    # every string); numbers (epoch seconds) are refused by the validator below.
    received_at: Annotated[AwareDatetime, Field(strict=False)]
    channel: Annotated[str | None, Field(max_length=200)] = None
    correlation_id: Annotated[str | None, Field(pattern=CORRELATION_PATTERN)] = None
    metadata: dict[str, Scalar] | None = None

    @field_validator("received_at", mode="before")
    @classmethod
    def _iso_string(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError("received_at must be an ISO 8601 string with a UTC offset")
        return value

    @field_validator("external_id")
    @classmethod
    def _not_hostile(cls, value: str) -> str:
        problem = hostile_id_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("metadata")
    @classmethod
    def _flat_and_small(cls, value: dict[str, Scalar] | None) -> dict[str, Scalar] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"metadata holds more than {MAX_METADATA_KEYS} keys")
        for key, item in value.items():
            if not METADATA_KEY.match(key):
                raise ValueError("metadata keys are 1-64 of A-Za-z0-9_.-")
            if isinstance(item, str) and len(item) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"metadata values are at most {MAX_METADATA_VALUE_CHARS} characters")
        return value or None

    def payload(self) -> DocumentPayload:
        """The payload stored behind the job's ``payload_ref``: the sources' contract.

        :raises ValidationError: what the payload contract refuses beyond this model (a NUL in
            the text, a ``received_at`` outside the years 1-9999 in UTC).
        """
        return DocumentPayload(
            external_id=self.external_id,
            subject=self.subject,
            body=self.body,
            received_at=self.received_at,
            channel=self.channel,
            metadata=self.metadata,
        )

    def payload_bytes(self) -> bytes:
        """``self.payload().to_bytes()``, the bytes stored and hashed, in a fifth of the time:
        the payload's canonical JSON (:func:`~triage.contracts.documents.canonical_json_bytes`:
        keys sorted, compact, UTF-8) written field by field with the encoders ``json.dumps``
        uses, the time as pydantic writes it. Equal for every document, and refusing what
        :meth:`payload` refuses (tests/unit/test_intake_contract.py); a request's hot path.

        :raises ValueError: what the payload contract refuses beyond this model (text that is
            not UTF-8, a ``received_at`` outside the years 1-9999 in UTC).
        """
        try:
            received_at = to_json(self.received_at.astimezone(UTC)).decode()
        except OverflowError:
            raise ValueError("received_at lies outside the years 1-9999 once converted to UTC") from None
        metadata = f',"metadata":{canonical_json_bytes(self.metadata).decode()}' if self.metadata else ""
        channel = "null" if self.channel is None else _json_string(self.channel)
        return (
            f'{{"body":{_json_string(self.body)},"channel":{channel},'
            f'"external_id":{_json_string(self.external_id)}{metadata},"received_at":{received_at},'
            f'"schema_version":1,"subject":{_json_string(self.subject)}}}'
        ).encode()


_json_string: Final = json.encoder.encode_basestring
"""A ``str`` as ``json.dumps(…, ensure_ascii=False)`` writes it (its C encoder)."""


class IntakeBatch(BaseModel):
    """A batch as posted: ``{"documents": [...]}`` and nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    documents: list[IntakeDocument]


_BODY: Final[TypeAdapter[IntakeBatch | IntakeDocument]] = TypeAdapter(
    Annotated[IntakeBatch | IntakeDocument, Field(union_mode="left_to_right")]
)


def validate_body(body: bytes) -> tuple[list[IntakeDocument], bool] | None:
    """Every document of a request ``body`` that is valid throughout, read in one pass, and
    whether it came as a batch; None when anything in it is wrong (not JSON, not UTF-8, an
    envelope other than a document or ``{"documents": [...]}``, any invalid document): then
    :func:`parse_documents` over the parsed JSON tells what, per document."""
    try:
        parsed = _BODY.validate_json(body)
    except (ValidationError, ValueError, ArithmeticError, RecursionError):
        return None
    if isinstance(parsed, IntakeBatch):
        return list(parsed.documents), True
    return [parsed], False


class Problem(BaseModel):
    """What is wrong with one document of a request (no document text in it)."""

    index: int
    external_id: str | None
    errors: list[dict[str, str]]


def _errors(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in e["loc"]) or "document", "problem": e["msg"].removeprefix("Value error, ")}
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


def _shown_id(item: Any) -> str | None:
    """The id to name an invalid document by: only a plain one (a hostile id is never sent back,
    nor logged)."""
    raw = item.get("external_id") if isinstance(item, dict) else None
    if not isinstance(raw, str) or not raw or len(raw) > MAX_EXTERNAL_ID_LENGTH or hostile_id_problem(raw):
        return None
    return raw


def parse_documents(items: list[Any]) -> tuple[list[tuple[int, IntakeDocument, bytes]], list[Problem]]:
    """Each item checked on its own: the valid ones (with their index and payload's bytes) and
    a :class:`Problem` for each invalid one."""
    valid: list[tuple[int, IntakeDocument, bytes]] = []
    problems: list[Problem] = []
    for index, item in enumerate(items):
        try:
            document = IntakeDocument.model_validate(item)
            valid.append((index, document, document.payload().to_bytes()))
        except ValidationError as exc:
            problems.append(Problem(index=index, external_id=_shown_id(item), errors=_errors(exc)))
        except (ValueError, ArithmeticError, RecursionError):  # a validator's arithmetic, parser limits, encoding
            problems.append(
                Problem(index=index, external_id=_shown_id(item), errors=[{"field": "document", "problem": "invalid"}])
            )
    return valid, problems
