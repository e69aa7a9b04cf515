"""Labelled examples: human ground truth for the learned classifier, imported or reviewed.

A labelled example is a document as the JSONL inbox takes it (``id``, ``subject``, ``body``,
``received_at``, ``channel``; :mod:`triage.sources.jsonl`) plus its ``"label"``. Its text goes
to the payload store like a job's (claim check: the ledger keeps the reference and the content
hash), its row to ``triage.labelled_examples``, idempotent by (source, external_id): importing
the same file again adds nothing. Each bad example is refused on its own, with its position and
a short reason; the good ones are kept.

Within one import (a file, or one source of an HTTP batch) an id given twice keeps its first
example: a later one that is the same example again (same label and document) is counted as
already present, one with another label or another text (subject, body) is refused as ``duplicate_id``, naming
where the first was, so that a conflict in the history is shown rather than settled silently.
Across imports the stored example stands (the insert changes nothing already there). A file
may begin with a UTF-8 byte order mark, as editors on Windows write it; lines may end in CRLF.

``received_at`` may be left out of an example (the HTTP batch shape has none): the import's
time stands in, which changes nothing a classifier reads.

A reviewer's ``label`` decision makes its example in the decision's own transaction
(:func:`triage.jobs.sql.writes.learning.example_from_review`); a model's own labels never become examples.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO, Final

import sqlalchemy as sa

from triage.contracts.documents import DocumentPayload
from triage.jobs.schema.learning import REVIEW_SOURCE
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.sources.jsonl import MAX_LINE_BYTES, parse_line
from triage.sources.lines import bounded_lines

__all__ = [
    "EXAMPLE_REASONS",
    "ImportReport",
    "InvalidSource",
    "LabelledDocument",
    "Refusal",
    "import_examples",
    "parse_example",
    "read_examples",
]

EXAMPLE_REASONS: Final = frozenset({"missing_label", "invalid_label", "label_outside_taxonomy", "duplicate_id"})
"""Reasons of a refused example besides the inbox's own (:data:`triage.sources.jsonl.LINE_REASONS`)."""

_SOURCE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_BOM: Final = b"\xef\xbb\xbf"
CHUNK: Final = 1000
"""Examples stored per payload pack and insert statement."""


class InvalidSource(ValueError):
    """The examples' source name is not a plain name, or is the reviewers' own (``review``)."""


class TaxonomyNotMigrated(RuntimeError):
    """The taxonomy file names labels the job database does not hold yet: ``triage migrate``
    brings ``triage.taxonomy_labels`` in step with the file (an example's label must be one)."""

    def __init__(self, labels: Sequence[str], added: int) -> None:
        self.labels, self.added = list(labels), added
        before = f"; {added} examples were added before it (importing again adds nothing twice)" if added else ""
        super().__init__(
            f"the job database does not know the labels {', '.join(self.labels)} of the taxonomy file: "
            f"run `triage migrate` (it loads the taxonomy's labels), then import again{before}"
        )


def check_source(source: str) -> str:
    """``source`` if it may name imported examples.

    :raises InvalidSource: blank, longer than 64, not ``[A-Za-z0-9_.:-]``, or ``review``.
    """
    if not _SOURCE.fullmatch(source):
        raise InvalidSource(f"source {source!r} is not a name of letters, digits and _.:- (at most 64)")
    if source == REVIEW_SOURCE:
        raise InvalidSource(f"source {REVIEW_SOURCE!r} is the reviewers' own: name the imported examples otherwise")
    return source


@dataclass(frozen=True, slots=True)
class LabelledDocument:
    """One good example: its document payload, its label, and where it was (a line number, or
    an index in a batch)."""

    payload: DocumentPayload
    label: str
    position: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused example: where it was (a line number, or an index in a batch) and why."""

    position: int
    reason: str
    detail: str
    external_id: str | None = None

    def message(self, unit: str = "line") -> str:
        return f"{unit} {self.position}: {self.reason}: {self.detail}"


@dataclass(slots=True)
class ImportReport:
    """What an import did: examples added, already there (by source and external id), refused."""

    source: str
    added: int = 0
    already: int = 0
    refused: list[Refusal] = field(default_factory=list)
    added_ids: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "added": self.added,
            "already_present": self.already,
            "refused": [
                {"position": r.position, "reason": r.reason, "detail": r.detail, "external_id": r.external_id}
                for r in self.refused
            ],
        }


_DETAILS: Final = {
    "invalid_json": "not a JSON object",
    "not_an_object": "not a JSON object",
    "missing_field": "a field the inbox requires is missing (id, subject, body)",
    "unexpected_field": "a field the inbox does not know",
    "empty_id": "the id is blank",
    "id_too_long": "the id is longer than 512 characters",
    "naive_received_at": "received_at has no time zone",
    "invalid_field": "a field has the wrong type",
    "line_too_long": "the line is longer than the limit",
    "invalid_utf8": "not UTF-8",
    "nul_in_id": "the id holds NUL",
    "received_at_out_of_range": "received_at lies outside the years 1-9999 in UTC",
}


def parse_example(
    record: Any, taxonomy_names: Iterable[str], *, position: int, now: datetime | None = None
) -> LabelledDocument | Refusal:
    """An example from a decoded JSON value: the inbox's line checks, then the label's. Never raises."""
    if not isinstance(record, dict):
        return Refusal(position, "not_an_object", "an example is a JSON object")
    fields = dict(record)
    claimed = fields.get("id")
    claimed_id = claimed if isinstance(claimed, str) else None
    if "label" not in fields:
        return Refusal(position, "missing_label", 'no "label"', claimed_id)
    label = fields.pop("label")
    if not isinstance(label, str):
        return Refusal(position, "invalid_label", '"label" is not a string', claimed_id)
    names = frozenset(taxonomy_names)
    if label not in names:
        shown = label if len(label) <= 64 and label.isprintable() else f"{label[:64]!r}…"
        return Refusal(
            position,
            "label_outside_taxonomy",
            f"{shown!r} is not in the taxonomy ({', '.join(sorted(names))})",
            claimed_id,
        )
    fields.setdefault("received_at", (now or datetime.now(UTC)).isoformat())
    try:
        line = json.dumps(fields, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        return Refusal(position, "invalid_field", "a field is not storable as UTF-8 JSON", claimed_id)
    parsed = parse_line(line, MAX_LINE_BYTES)
    if isinstance(parsed, str):
        return Refusal(position, parsed, _DETAILS.get(parsed, parsed), claimed_id)
    return LabelledDocument(parsed, label, position)


def read_examples(
    stream: BinaryIO, taxonomy_names: Iterable[str], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[LabelledDocument | Refusal]:
    """The examples of a JSON-lines stream, one per non-blank line (numbered from 1), read with
    a bound: a line over ``max_line_bytes`` is refused without being held whole."""
    names = frozenset(taxonomy_names)
    now = datetime.now(UTC)
    for line in bounded_lines(stream, max_line_bytes):
        if line.blank:
            continue
        if line.oversized:
            yield Refusal(line.number, "line_too_long", f"longer than {max_line_bytes} bytes")
            continue
        content = line.content
        if line.number == 1 and content.startswith(_BOM):
            content = content[len(_BOM) :]
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            yield Refusal(line.number, "invalid_utf8", "not UTF-8")
            continue
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            yield Refusal(line.number, "invalid_json", "not JSON")
            continue
        yield parse_example(record, names, position=line.number, now=now)


def import_examples(
    engine: sa.Engine,
    payloads: PayloadStore,
    examples: Iterable[LabelledDocument | Refusal],
    *,
    source: str,
    labelled_by: str,
) -> ImportReport:
    """Store the good examples (texts in the payload store, rows in the ledger; a chunk per
    transaction) and report each refusal. An example whose (source, external id) is there
    already (an earlier import, or earlier in the same one) is counted as such and changes
    nothing.

    :raises InvalidSource: see :func:`check_source` (before anything is written).
    :raises TaxonomyNotMigrated: a chunk's label is not in ``triage.taxonomy_labels`` (that
        chunk and the rest are not written; the chunks before it are).
    """
    check_source(source)
    report = ImportReport(source)
    chunk: list[LabelledDocument] = []
    # Each id's first example in this import: its position and a digest of its label and document.
    first: dict[str, tuple[int, bytes]] = {}
    for example in examples:
        if isinstance(example, Refusal):
            report.refused.append(example)
            continue
        external_id = example.payload.external_id
        # The label and the text a classifier reads: a repeat that differs in received_at alone
        # (left out, so the import's time) is the same example.
        digest = hashlib.sha256(f"{example.label}\n{example.payload.text}".encode()).digest()[:16]
        seen = first.setdefault(external_id, (example.position, digest))
        if seen[1] != digest:
            report.refused.append(
                Refusal(
                    example.position,
                    "duplicate_id",
                    f"the id was given before (at {seen[0]}) with another label or text; the first one stands",
                    external_id,
                )
            )
            continue
        chunk.append(example)
        if len(chunk) >= CHUNK:
            _store(engine, payloads, chunk, source, labelled_by, report)
            chunk = []
    if chunk:
        _store(engine, payloads, chunk, source, labelled_by, report)
    return report


def _store(
    engine: sa.Engine,
    payloads: PayloadStore,
    chunk: Sequence[LabelledDocument],
    source: str,
    labelled_by: str,
    report: ImportReport,
) -> None:
    # Within a chunk, an external id given twice keeps its first example (as across chunks).
    unique = list({example.payload.external_id: example for example in reversed(chunk)}.values())[::-1]
    learning = JobStore(engine).learning
    unknown = learning.unknown_labels({example.label for example in unique})
    if unknown:  # the file's taxonomy is newer than the ledger's: say so, do not fail on the foreign key
        raise TaxonomyNotMigrated(unknown, report.added)
    stored = payloads.put_many([example.payload.to_bytes() for example in unique])
    rows = [
        {
            "source": source,
            "external_id": example.payload.external_id,
            "label": example.label,
            "content_sha256": sha,
            "payload_ref": ref,
            "labelled_by": labelled_by,
        }
        for example, (sha, ref) in zip(unique, stored, strict=True)
    ]
    added = learning.add_examples(rows)
    report.added += len(added)
    report.already += len(chunk) - len(added)
    report.added_ids.update(added)
