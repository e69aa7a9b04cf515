"""The report's two human forms: Markdown for the task log, and a self-contained HTML page
with inline SVG charts (no script, no CDN) written under the reports folder.

Rendering the HTML is a named degraded path (see :func:`write_html_report`): a page that cannot
be rendered or saved must not fail the run, whose findings and repairs are already recorded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from triage import markdown as md
from triage.reconciliation.charts import bar_chart, column_chart, duration, line_chart, plain

log = logging.getLogger(__name__)

TEMPLATE_ENV = "TRIAGE_REPORT_TEMPLATES"
TEMPLATE = "reconciliation.html.j2"


def template_dir() -> Path:
    """``$TRIAGE_REPORT_TEMPLATES``, else ``<repo>/include/report`` (``plugins/`` and
    ``include/`` are siblings in the checkout and in the official image layout)."""
    explicit = os.environ.get(TEMPLATE_ENV)
    return Path(explicit) if explicit else Path(__file__).resolve().parents[3] / "include" / "report"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    # Every cell is escaped (triage.markdown): job samples, run ids and error texts come from
    # the ledger and from Airflow, and must not end a cell, a row or the table.
    return md.table(headers, rows)


def markdown(summary: dict[str, Any]) -> str:
    """The Markdown summary (sections in the order of the HTML page)."""
    run, totals = summary["run"], summary["totals"]
    mode = "dry run: nothing was changed" if run["dry_run"] else "repairs applied"
    out = [
        f"# Reconciliation run {md.text(run['id'])} ({mode})",
        "",
        f"{totals['jobs']} jobs · {totals['repaired']} repaired · {totals['conflicts']} in conflict · "
        f"{totals['open_reviews']} open reviews · finished {md.text(run['finished_at'])}",
        "",
    ]
    if totals.get("checked"):  # absent from the summaries of runs before it was recorded
        out += ["Checked: " + ", ".join(md.text(rule) for rule in totals["checked"]), ""]
    if totals["skipped"]:
        out += [
            "Skipped: " + "; ".join(f"{md.text(rule)}: {md.text(why)}" for rule, why in totals["skipped"].items()),
            "",
        ]
    sections: list[tuple[str, list[str]]] = [
        (
            "Jobs by state and step",
            _table(
                ["state", "step", "jobs"], ((r["status"], r["step"], r["count"]) for r in summary["by_state_and_step"])
            ),
        ),
        (
            "Queue age (oldest job per state)",
            _table(
                ["state", "jobs", "oldest"],
                ((r["status"], r["count"], duration(r["oldest_seconds"])) for r in summary["queue_age"]),
            ),
        ),
        (
            "Time in each state",
            _table(
                ["state", "transitions", "median", "p95"],
                (
                    (r["status"], r["transitions"], duration(r["median_seconds"]), duration(r["p95_seconds"]))
                    for r in summary["time_in_state"]
                ),
            ),
        ),
        ("Attempts", _table(["attempt", "jobs"], ((r["attempt"], r["count"]) for r in summary["attempts"]))),
        (
            "Retry reasons",
            _table(["error class", "retries"], ((r["reason"], r["count"]) for r in summary["retry_reasons"])),
        ),
        (
            f"Manual review queue ({summary['review_queue']['total']} open, oldest first)",
            _table(
                ["job", "reason", "attempts", "last error class", "age", "batch"],
                (
                    (
                        r["job_id"],
                        r["reason"],
                        r["attempts"],
                        r["last_error_class"],
                        duration(r["age_seconds"]),
                        r["batch_key"],
                    )
                    for r in summary["review_queue"]["rows"]
                ),
            ),
        ),
        (
            "Repairs made",
            _table(
                ["rule", "repair", "jobs", "what"],
                ((r["rule"], r["action"], r["count"], r["detail"]) for r in summary["repairs"]),
            ),
        ),
        (
            "Conflicts (for a human)",
            _table(
                ["rule", "check", "jobs", "what", "sample"],
                (
                    (c["rule"], c["check"], c["count"], c["detail"], ", ".join(c["job_ids"][:3]))
                    for c in summary["conflicts"]
                ),
            ),
        ),
        (
            "Findings",
            _table(
                ["rule", "check", "count", "what", "repair"],
                (
                    (r["rule"], f["check"], f["count"], f["detail"], f["repair"] or "report only")
                    for r in summary["rules"]
                    for f in r["findings"]
                ),
            ),
        ),
        (
            "Schema-version mismatches",
            _table(
                ["found by", "state now", "jobs"],
                ((r["found_by"], r["status"], r["count"]) for r in summary["schema_mismatches"]),
            ),
        ),
        (
            "Model outputs rejected by validation",
            _table(["rejected reason", "outputs"], ((r["reason"], r["count"]) for r in summary["rejected_outputs"])),
        ),
        ("Outbox", [f"{summary['outbox']['unsent']} unsent; oldest {duration(summary['outbox']['oldest_seconds'])}"]),
    ]
    if summary.get("quality"):  # absent from the summaries of runs before it was recorded
        sections.append((f"Quality (last {summary['quality']['window_days']} days)", quality_markdown(summary)))
    for title, body in sections:
        out += [f"## {md.text(title)}", "", *body, ""]
    return "\n".join(out)


def percent(value: float | None) -> str:
    """A share as a percentage (``97.3 %``); ``-`` when nothing was measured."""
    return "-" if value is None else f"{value * 100:.1f} %"


def interval(row: dict[str, Any]) -> str:
    """The audited precision with its 95 % Wilson interval: ``96.0 % (90.1-98.4 %, n=50)``."""
    if not row["audited"]:
        return "-"
    low, high = row["precision_low"] * 100, row["precision_high"] * 100
    return f"{percent(row['precision'])} ({low:.1f}-{high:.1f} %, n={row['audited']})"


def quality_markdown(summary: dict[str, Any]) -> list[str]:
    """The Quality section: per version, per version and day, reviewers per day."""
    quality = summary["quality"]
    version_rows = [("all versions", quality["totals"]), *((r["version"], r) for r in quality["by_version"])]
    return [
        *_table(
            [
                "version",
                "classified",
                "coverage",
                "audited precision (95 % CI)",
                "open audits",
                "inconclusive agreement",
            ],
            (
                (
                    name,
                    r["classified"],
                    percent(r["coverage"]),
                    interval(r),
                    r["audit_open"],
                    f"{percent(r['inconclusive_agreement'])} of {r['inconclusive_labelled']}",
                )
                for name, r in version_rows
            ),
        ),
        "",
        *_table(
            ["version", "day", "classified", "coverage", "confirmed", "corrected", "audited precision (95 % CI)"],
            (
                (
                    r["version"],
                    r["day"],
                    r["classified"],
                    percent(r["coverage"]),
                    r["confirmed"],
                    r["corrected"],
                    interval(r),
                )
                for r in quality["by_version_day"]
            ),
        ),
        "",
        *_table(
            ["day", "decisions", "reviewers", "per reviewer", "agreement with the model"],
            (
                (r["day"], r["decisions"], r["reviewers"], r["decisions_per_reviewer"], percent(r["agreement"]))
                for r in quality["reviewers_by_day"]
            ),
        ),
    ]


def quality_trend(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of the quality trend, oldest first: earlier runs' stored totals, then this run's."""
    from triage.reconciliation.quality import trend_point

    quality = summary["quality"]
    this_run = trend_point(summary["run"]["id"], summary["run"]["started_at"], quality["totals"])
    return [*quality["trend"], this_run]


def charts(summary: dict[str, Any]) -> dict[str, str]:
    """The SVG charts of the page, by name."""
    by_state = [(s, [n]) for s, n in summary["by_state"].items()]
    return {
        "states": bar_chart("Jobs by state", by_state),
        "queue_age": bar_chart(
            "Oldest job per state", [(r["status"], [r["oldest_seconds"]]) for r in summary["queue_age"]], fmt=duration
        ),
        "time_in_state": bar_chart(
            "Time in state",
            [(r["status"], [r["median_seconds"], r["p95_seconds"]]) for r in summary["time_in_state"]],
            series=["median", "p95"],
            fmt=duration,
        ),
        "attempts": column_chart(
            "Attempts per job",
            [(str(r["attempt"]), r["count"]) for r in summary["attempts"]],
            x_label="attempts",
            fmt=plain,
        ),
        "retry_reasons": bar_chart("Retry reasons", [(r["reason"], [r["count"]]) for r in summary["retry_reasons"]]),
        "rejected": bar_chart(
            "Rejected model outputs", [(r["reason"], [r["count"]]) for r in summary["rejected_outputs"]]
        ),
        **(quality_charts(summary) if summary.get("quality") else {}),
    }


def quality_charts(summary: dict[str, Any]) -> dict[str, str]:
    """The Quality section's charts: coverage and audited precision per version, and their trend
    over runs (a share not measured in a run is drawn as 0 and named ``-`` in its tooltip)."""
    quality = summary["quality"]
    runs = quality_trend(summary)
    series = [
        (name, [100 * (r[key] or 0) for r in runs])
        for name, key in (
            ("coverage %", "coverage"),
            ("audited precision %", "precision"),
            ("inconclusive agreement %", "inconclusive_agreement"),
        )
    ]
    return {
        "quality_versions": bar_chart(
            "Coverage and audited precision per version (%)",
            [(r["version"], [100 * (r["coverage"] or 0), 100 * (r["precision"] or 0)]) for r in quality["by_version"]],
            series=["coverage", "audited precision"],
        ),
        "quality_trend": line_chart("Quality over runs (%)", [f"run {r['run_id']}" for r in runs], series, width=720),
    }


def html(summary: dict[str, Any], links: dict[str, Any] | None = None) -> str:
    """The HTML page (raises if the template is missing or broken: see :func:`write_html_report`).

    :param links: for the page served by the Triage plugin: ``nav``, a list of ``(href, text)``
        shown above the report, and ``job``, the prefix of a job's page (its id appended).
    """
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["duration"] = duration
    env.filters["percent"] = percent
    env.filters["interval"] = interval
    svg = {name: Markup(chart) for name, chart in charts(summary).items()}  # built from escaped parts
    return env.get_template(TEMPLATE).render(s=summary, charts=svg, links=links)


def report_file(reports_dir: str | os.PathLike[str], run_id: int, started_at: datetime) -> Path:
    return Path(reports_dir) / f"reconciliation-{started_at:%Y%m%dT%H%M%SZ}-run{run_id}.html"


def write_html_report(summary: dict[str, Any], path: Path) -> Path | None:
    """Render and save the page (atomically, with ``reconciliation-latest.html`` beside it); None if it failed.

    The one broad ``except`` of reconciliation, named and tested: the findings and repairs are
    in the database and the JSON summary whatever happens here, and a reporting problem (a
    missing template, a full disk) must not fail the run and hide them.
    """
    try:
        page = html(summary)
        path.parent.mkdir(parents=True, exist_ok=True)
        for target in (path, path.with_name("reconciliation-latest.html")):
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(target)
        return path
    except Exception:
        log.exception("the HTML report could not be rendered; the Markdown and JSON summaries stand")
        return None
