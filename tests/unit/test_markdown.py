"""Markdown escaping, checked by parsing: a hostile value rendered into a table cell, a code span
or a line of text stays inside it, shown exactly as stored, with no link, HTML or emphasis.

The parser is markdown-it-py (CommonMark with GFM tables and strikethrough; raw HTML on, so
that injected HTML would show up as ``html_inline`` tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from triage import markdown as md

PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])

HOSTILE = [
    "`",
    "``",
    "a`b``c```d",
    "`leading",
    "trailing`",
    " ` ",
    "  spaced  ",
    "   ",
    "",
    "pipe | inside",
    "back\\slash\\|pipe",
    "\\",
    "ends with \\",
    "new\nline",
    "crlf\r\n| x | y |",
    "\n|---|---|\n| forged | row |",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "&amp; &lt; &#96;",
    "[click](http://evil.example)",
    "![img](http://evil.example/x.png)",
    "<http://evil.example>",
    "**bold** _em_ ~~strike~~ *x*",
    "# heading",
    "> quote",
    "- item",
    "1. item",
    "ctl\x01\x1b[31m\x7f\x85",
    "unicode\u2028line\u2029para",
    "rtl \u202eevil\u202c",
    "zero\u200bwidth\ufeff",
    "tab\there",
    "$$; DROP TABLE triage.jobs; --",
    "emoji \U0001f4a5",
]

ids = st.sampled_from(HOSTILE) | st.text(
    alphabet=st.sampled_from(list("`|\\<>&[]()*_~!#-\n\r\t \x00\u2028\u202eaZ9:/")) | st.characters(), max_size=40
)


def inline_children(token: Token) -> list[Token]:
    assert token.type == "inline"
    return list(token.children or [])


def rendered(children: Sequence[Token]) -> str:
    """What a reader sees of an inline run made only of text and code spans."""
    kinds = {child.type for child in children}
    assert kinds <= {"text", "code_inline"}, kinds
    return "".join(child.content for child in children)


def table_rows(tokens: Sequence[Token]) -> list[list[list[Token]]]:
    """Rows of cells (each a list of inline tokens) of the one table among ``tokens``."""
    assert sum(t.type == "table_open" for t in tokens) == 1, [t.type for t in tokens]
    start = next(i for i, t in enumerate(tokens) if t.type == "table_open")
    end = next(i for i, t in enumerate(tokens) if t.type == "table_close")
    rows: list[list[list[Token]]] = []
    for token in tokens[start:end]:
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline":
            rows[-1].append(inline_children(token))
    return rows


def table_cells(source: str) -> list[list[list[Token]]]:
    """Rows of cells of the one table ``source`` must be, and nothing else."""
    tokens = PARSER.parse(source)
    assert (tokens[0].type, tokens[-1].type) == ("table_open", "table_close"), [t.type for t in tokens]
    return table_rows(tokens)


def test_visible_escapes_what_does_not_show() -> None:
    assert md.visible("a\nb\r\tc\x00\x1b\x7f\x85\u2028\u202e\ufeffd") == (
        "a\\nb\\r\\tc\\x00\\x1b\\x7f\\x85\\u2028\\u202e\\ufeffd"
    )
    assert md.visible("café ☕ \U0001f4a5") == "café ☕ \U0001f4a5"


@pytest.mark.parametrize("value", HOSTILE)
def test_a_code_span_holds_any_value(value: str) -> None:
    [paragraph] = [t for t in PARSER.parse(f"id {md.code(value)} end") if t.type == "inline"]
    children = inline_children(paragraph)

    assert [c.type for c in children] == ["text", "code_inline", "text"]
    assert children[1].content == (md.visible(value) or " ")


@settings(max_examples=500)
@given(value=ids)
def test_any_value_stays_in_its_code_span(value: str) -> None:
    [paragraph] = [t for t in PARSER.parse(f"id {md.code(value)} end") if t.type == "inline"]
    children = inline_children(paragraph)

    assert [c.type for c in children] == ["text", "code_inline", "text"]
    assert children[1].content == (md.visible(value) or " ")


@settings(max_examples=500)
@given(value=ids)
def test_any_value_stays_plain_text(value: str) -> None:
    tokens = PARSER.parse(f"said: {md.text(value)}")
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"]

    assert rendered(inline_children(tokens[1])) == f"said: {md.visible(value)}".rstrip()


def hostile_table(values: Sequence[Any]) -> str:
    rows = [(value, value, "after") for value in values]
    return "\n".join(md.table(["as code", "as text", "after"], rows, code_columns=frozenset({0})))


@settings(max_examples=300)
@given(values=st.lists(ids, min_size=1, max_size=4))
def test_any_value_stays_in_its_table_cell(values: list[str]) -> None:
    header, *rows = table_cells(hostile_table(values))

    assert [rendered(c) for c in header] == ["as code", "as text", "after"]
    assert len(rows) == len(values)  # no row forged, none swallowed
    for (as_code, as_text, after), value in zip(rows, values, strict=True):
        assert [c.type for c in as_code] == ["code_inline"]
        assert as_code[0].content == (md.visible(value) or " ")
        assert rendered(as_text) == md.visible(value).strip()
        assert rendered(after) == "after"


def test_a_table_without_rows_says_none() -> None:
    assert md.table(["a"], []) == ["_none_"]
    assert md.cell(None) == ""


@settings(max_examples=200)
@given(job_ids=st.lists(ids, min_size=1, max_size=4), reviewer=ids, label=st.none() | ids)
@example(job_ids=["x"], reviewer="#", label=None)  # a heading's closing "#" swallowed the name
def test_the_review_report_keeps_any_job_id_reviewer_and_label_in_place(
    job_ids: list[str], reviewer: str, label: str | None
) -> None:
    from triage.review.decisions import JobReport, ReviewReport

    jobs = tuple(JobReport(raw, "refused", None, f"NotAJobId: {raw}") for raw in job_ids)
    tokens = PARSER.parse(ReviewReport("label", label, reviewer, jobs).to_markdown())

    assert [t.type for t in tokens[:7]] == [
        "heading_open",
        "inline",
        "heading_close",
        "paragraph_open",
        "inline",
        "paragraph_close",
        "table_open",
    ]
    heading = rendered(inline_children(tokens[1]))
    assert heading.startswith("review_jobs: label")
    assert heading.endswith(f"by {md.visible(reviewer)}".rstrip())
    if label:
        assert inline_children(tokens[1])[1].content == (md.visible(label) or " ")
    _header, *rows = table_rows(tokens)
    assert len(rows) == len(job_ids)
    for row, raw in zip(rows, job_ids, strict=True):
        assert len(row) == 5  # job, outcome, status, detail, label action
        assert [c.type for c in row[0]] == ["code_inline"]
        assert row[0][0].content == (md.visible(raw) or " ")
        assert rendered(row[3]) == f"NotAJobId: {md.visible(raw)}".strip()
