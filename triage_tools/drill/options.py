"""The drill's knobs: :class:`DrillOptions`, and the command line that sets them (one table, so
every flag's default is the options' own)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DrillOptions:
    documents: int = 20_000
    dates: int = 4
    first_date: date = date(2026, 10, 1)
    seed: int = 7
    transient_error_rate: float = 0.20
    permanent_error_rate: float = 0.01
    inconclusive_rate: float = 0.03
    duplicate_rate: float = 0.05
    late_answer_rate: float = 0.002
    claim_kills: int = 2
    action_kills: int = 2
    db_restarts: int = 1
    lease_seconds: int = 30
    timeout_s: float = 1800.0
    settle_rounds: int = 6
    outage_documents: int = 200
    """Documents of the outage phase's date (the day before ``first_date``); 0: no outage phase."""
    outage_resumes_while_down: int = 1
    """``reconcile_jobs`` runs the drill starts while the model is down, each resuming the outage's
    failed run (which must fail again): what a scheduled run does when a quarter hour falls there."""
    last_try_documents: int = 100
    """Documents of the kill-on-the-last-try date (two days before ``first_date``); 0: no such case."""

    @property
    def days(self) -> list[date]:
        return [self.first_date + timedelta(days=i) for i in range(self.dates)]

    def conf(self) -> dict[str, Any]:
        return {
            "documents": self.documents // self.dates,
            "lease_seconds": self.lease_seconds,
            "drill": {
                "transient_error_rate": self.transient_error_rate,
                "permanent_error_rate": self.permanent_error_rate,
                "inconclusive_rate": self.inconclusive_rate,
                "duplicate_rate": self.duplicate_rate,
                "seed": self.seed,
            },
        }


DESCRIPTION = """\
The failure drill (make chaos): classify_documents for several dates on a
deployment of its own under $TRIAGE_HOME/chaos (wiped first), with faults on every
side: classifier errors and duplicates, a label provider answering after the
timeout, task processes killed under a claim, on their last try, and right after
an external action, a PostgreSQL restart, a model outage (resumed by
reconcile_jobs while down and once back). Reconciliation then settles it; the
invariants are judged.

Exit code 1 if an invariant is broken or the drill could not finish; the report
is written to report.json in the drill's home.
"""

KNOBS: tuple[tuple[str, str, type, str, str], ...] = (
    ("--documents", "documents", int, "N", "synthetic documents in all (default %(default)s)"),
    ("--dates", "dates", int, "N", "days they are spread over, one run each (default %(default)s)"),
    ("--seed", "seed", int, "N", "seed of the injected faults (default %(default)s)"),
    ("--claim-kills", "claim_kills", int, "N", "classify tasks killed while they hold a claim (default %(default)s)"),
    ("--action-kills", "action_kills", int, "N", "persist tasks killed after an external action (default %(default)s)"),
    ("--db-restarts", "db_restarts", int, "N", "PostgreSQL restarts mid-run (default %(default)s)"),
    (
        "--outage-documents",
        "outage_documents",
        int,
        "N",
        "documents of the model-outage date, the day before the first (0: no outage; default %(default)s)",
    ),
    (
        "--outage-resumes-while-down",
        "outage_resumes_while_down",
        int,
        "N",
        "reconcile_jobs runs forced while the model is down, each resuming the outage's run (default %(default)s)",
    ),
    (
        "--last-try-documents",
        "last_try_documents",
        int,
        "N",
        "documents of the date whose classify is killed on its last try, two days before the first"
        " (0: no such case; default %(default)s)",
    ),
    ("--timeout", "timeout_s", float, "SECONDS", "give up after this many seconds (default %(default).0f)"),
)
"""(flag, :class:`DrillOptions` field, type, metavar, help): one line per knob."""


def parse(argv: Sequence[str] | None, prog: str) -> tuple[DrillOptions, Path | None]:
    """The options and the ``--home`` (None: the default) of a command line."""
    defaults = DrillOptions()
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag, name, kind, metavar, text in KNOBS:
        parser.add_argument(flag, dest=name, type=kind, metavar=metavar, default=getattr(defaults, name), help=text)
    parser.add_argument(
        "--home",
        type=Path,
        metavar="DIR",
        default=None,
        help="the drill's home, wiped first (default: $TRIAGE_HOME/chaos)",
    )
    args = parser.parse_args(argv)
    return DrillOptions(**{name: getattr(args, name) for _flag, name, *_ in KNOBS}), args.home
