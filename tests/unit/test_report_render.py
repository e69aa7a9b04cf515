"""The report's rendering without a database: durations, charts (escaped, drawn to scale), the
Markdown sections, and the HTML page from a hand-made summary."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.unit.test_markdown import HOSTILE, PARSER, rendered
from triage import markdown as md
from triage.reconciliation.charts import bar_chart, column_chart, duration
from triage.reconciliation.render import charts, html, markdown


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0.0, "0 ms", id="zero"),
        pytest.param(0.1234, "123 ms", id="millis"),
        pytest.param(4.25, "4.2 s", id="seconds-tenths"),
        pytest.param(42, "42 s", id="seconds"),
        pytest.param(210, "3.5 min", id="minutes"),
        pytest.param(7560, "2.1 h", id="hours"),
        pytest.param(3 * 86400, "3.0 d", id="days"),
    ],
)
def test_durations_read_naturally(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_bars_are_drawn_to_scale_and_carry_their_numbers() -> None:
    svg = bar_chart("Jobs", [("queued", [10]), ("running", [5]), ("waiting", [0])])
    widths = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', svg)]
    assert widths[0] == pytest.approx(2 * widths[1])
    assert widths[2] == 0
    assert ">10<" in svg
    assert ">5<" in svg
    assert ">0<" in svg
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"')


def test_chart_labels_are_escaped() -> None:
    svg = bar_chart("<b>", [("<script>alert(1)</script>", [1])])
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg


def test_empty_charts_say_so() -> None:
    assert "nothing to show" in bar_chart("Retry reasons", [])
    assert "nothing to show" in column_chart("Attempts", [])


def summary() -> dict[str, Any]:
    return {
        "run": {
            "id": 7,
            "started_at": "2026-11-30T10:00:00+00:00",
            "finished_at": "2026-11-30T10:00:02+00:00",
            "dry_run": True,
            "params": {},
        },
        "totals": {
            "jobs": 42,
            "findings": 2,
            "repaired": 0,
            "conflicts": 1,
            "open_reviews": 1,
            "skipped": {"airflow_view": "Airflow's REST API is unavailable: ConnectError"},
        },
        "rules": [
            {
                "rule": "consistency",
                "skipped": None,
                "findings": [
                    {
                        "check": "completed_without_label",
                        "count": 1,
                        "detail": "completed job without its label",
                        "job_ids": ["j1"],
                        "repair": None,
                        "data": {},
                    }
                ],
                "repairs": [],
                "conflicts": [],
            }
        ],
        "repairs": [],
        "conflicts": [
            {
                "rule": "consistency",
                "check": "completed_without_label",
                "count": 1,
                "detail": "completed job without its label",
                "job_ids": ["j1"],
            }
        ],
        "by_state": {"queued": 30, "completed": 11, "manual_review": 1},
        "by_state_and_step": [{"status": "queued", "step": "classify", "count": 30}],
        "queue_age": [{"status": "queued", "count": 30, "oldest_seconds": 7200.0}],
        "time_in_state": [{"status": "running", "transitions": 11, "median_seconds": 0.2, "p95_seconds": 1.5}],
        "attempts": [{"attempt": 0, "count": 30}, {"attempt": 1, "count": 12}],
        "retry_reasons": [{"reason": "timeout", "count": 3}],
        "review_queue": {
            "total": 1,
            "rows": [
                {
                    "job_id": "j9",
                    "batch_key": "b",
                    "reason": "inconclusive",
                    "attempts": 1,
                    "last_error_class": "inconclusive",
                    "age_seconds": 90.0,
                }
            ],
        },
        "schema_mismatches": [{"found_by": "classify", "status": "terminal_failed", "count": 2}],
        "rejected_outputs": [{"reason": "label_outside_taxonomy", "count": 4}],
        "outbox": {"unsent": 3, "oldest_seconds": 12.0, "old": 0},
    }


def test_the_markdown_names_the_dry_run_and_every_section() -> None:
    text = markdown(summary())
    assert text.splitlines()[0] == "# Reconciliation run 7 (dry run: nothing was changed)"
    assert "Skipped: airflow_view: Airflow's REST API is unavailable: ConnectError" in text
    assert "| queued | 30 | 2.0 h |" in text
    assert "| j9 | inconclusive | 1 | inconclusive | 90 s | b |" in text
    assert "| classify | terminal_failed | 2 |" in text
    assert "## Repairs made\n\n_none_" in text


def test_the_html_page_from_a_summary() -> None:
    page = html(summary())
    assert page.count("<svg") == len(charts(summary())) == 6  # a summary from before the Quality section
    assert "Dry run: findings only, nothing was changed." in page
    assert ">label_outside_taxonomy<" in page
    assert "<script" not in page


def test_both_reports_say_which_rules_were_checked() -> None:
    s = summary()
    assert "Checked:" not in markdown(s)  # a summary stored before the list was recorded
    assert 'id="checked"' not in html(s)
    s["totals"]["checked"] = ["expired_leases", "airflow_view"]
    assert "Checked: expired_leases, airflow_view" in markdown(s)
    assert '<p id="checked">Checked: <code>expired_leases</code>, <code>airflow_view</code></p>' in html(s)
    s["totals"]["checked"] = ["<b>x</b>"]
    assert "<b>" not in html(s).split('id="checked"', 1)[1].split("</p>", 1)[0]


def hostile_summary(value: str) -> dict[str, Any]:
    """The summary above with ``value`` in every text a row can carry (run ids and error texts
    from Airflow, reasons, batch keys, job samples)."""
    s = summary()
    s["run"]["finished_at"] = value
    s["totals"]["skipped"] = {"airflow_view": value}
    s["rules"][0]["findings"][0].update(detail=value, check=value, repair=value)
    s["conflicts"][0].update(detail=value, check=value, job_ids=[value, value])
    s["repairs"] = [{"rule": value, "action": value, "count": 1, "detail": value}]
    s["by_state_and_step"][0].update(status=value, step=value)
    s["retry_reasons"][0]["reason"] = value
    s["review_queue"]["rows"][0].update(job_id=value, batch_key=value, reason=value, last_error_class=value)
    s["rejected_outputs"][0]["reason"] = value
    return s


@pytest.mark.parametrize("value", [v for v in HOSTILE if v])  # an empty repair reads "report only"
def test_hostile_values_stay_in_their_cells_of_the_markdown_report(value: str) -> None:
    plain_text = markdown(hostile_summary("harmless"))
    text = markdown(hostile_summary(value))
    tokens = PARSER.parse(text)

    # The same blocks as the report of a harmless summary: nothing forged, ended or swallowed.
    def shape(parsed: list[Any]) -> list[str]:
        return [t.type for t in parsed if t.type not in ("inline",)]

    assert shape(tokens) == shape(PARSER.parse(plain_text))
    kinds = {child.type for t in tokens for child in (t.children or [])}
    assert kinds <= {"text", "code_inline", "em_open", "em_close"}, kinds  # _none_ is the only emphasis
    # Each of the 16 cells holding the value alone shows it, exactly.
    cells = [rendered(t.children or []) for t in tokens if t.type == "inline"]
    harmless = [rendered(t.children or []) for t in PARSER.parse(plain_text) if t.type == "inline"]
    assert harmless.count("harmless") == 16
    assert [c for c, h in zip(cells, harmless, strict=True) if h == "harmless"] == [md.visible(value).strip()] * 16
