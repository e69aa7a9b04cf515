"""A document's author chooses its external id: ids made of backticks, pipes, line breaks, HTML
and Markdown go through the real ledger into the reviewer's question (the HITL body) and stay
inside their code span and their table cell, shown exactly as stored."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from markdown_it.token import Token

from tests.ledger.test_review_store import to_review
from tests.unit.test_markdown import HOSTILE, PARSER, rendered, table_cells
from triage import markdown as md
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.retrieve import to_new_jobs
from triage.review.cases import describe
from triage.sources.jsonl import JsonlSource

# The ledger holds any text but NUL and an empty id; the prefix keeps every id distinct.
IDS = [value for value in HOSTILE if "\x00" not in value]


def question_rows(body: str) -> dict[str, list[Token]]:
    """The question's table as {row name: the inline tokens of its value cell}."""
    table = body.split("\n\n", 1)[0]
    header, *rows = table_cells(table)
    assert len(header) == 2
    out = {}
    for row in rows:
        assert len(row) == 2, row  # nothing split a cell in two
        out[rendered(row[0])] = row[1]
    return out


@pytest.mark.parametrize("hostile", IDS)
def test_a_hostile_external_id_stays_in_its_cell_of_the_question(store: JobStore, hostile: str) -> None:
    to_review(store, prefix=hostile)
    [case] = store.review.open_reviews()
    assert case.external_id == f"{hostile}-0"  # stored verbatim

    rows = question_rows(describe(case)["body"])

    assert list(rows) == [
        "job",
        "document",
        "payload",
        "correlation id",
        "batch, step",
        "in review since",
        "reason",
        "attempts",
        "model said",
        "context",
    ]
    document = rows["document"]
    assert [t.type for t in document] == ["code_inline", "text", "code_inline"]
    assert document[2].content == md.visible(case.external_id)
    assert "Requeue" in describe(case)["body"].split("\n\n", 1)[1]  # the instructions survive after the table


@pytest.mark.parametrize("hostile", ["a`|b", "x\n| forged | row |", "<b>bold</b>``"])
def test_a_hostile_id_in_a_malformed_lines_context_stays_in_its_span(
    store: JobStore, tmp_path: Path, hostile: str
) -> None:
    # An oversized line's review context names the id it claims: author's text, in the question.
    head = json.dumps({"id": hostile, "body": "x" * 200}).encode()
    [doc] = JsonlSource("/unused", max_line_bytes=64).read_lines("2026-11-01/f.jsonl", io.BytesIO(head + b"\n"))
    store.register(to_new_jobs([doc], PayloadStore(tmp_path), "v1"), batch_key="b", step="classify", max_attempts=3)
    [case] = store.review.open_reviews()
    assert case.context["claimed_id"] == hostile

    context = question_rows(describe(case)["body"])["context"]
    assert [t.type for t in context] == ["code_inline"]
    assert json.loads(context[0].content)["claimed_id"] == hostile


def test_the_question_has_no_link_html_or_emphasis_from_an_id(store: JobStore) -> None:
    for n, hostile in enumerate(IDS):
        to_review(store, prefix=f"{n}{hostile}")
    for case in store.review.open_reviews(limit=len(IDS)):
        tokens = PARSER.parse(describe(case)["body"])
        kinds = {child.type for t in tokens for child in (t.children or [])}
        assert kinds <= {"text", "code_inline", "strong_open", "strong_close", "softbreak"}, (case.external_id, kinds)
