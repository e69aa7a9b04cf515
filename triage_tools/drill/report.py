"""What the drill tells: the faults it injected, the outcomes, and the verdict
(:class:`DrillReport`, printed as a table and written as ``report.json``)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def say(message: str) -> None:
    """One line of the drill's progress, with the UTC time (to read it beside Airflow's logs)."""
    print(f"chaos: {datetime.now(UTC):%H:%M:%S} {message}", file=sys.stderr, flush=True)


@dataclass
class Fault:
    kind: str
    target: str
    detail: str
    at: float


@dataclass
class DrillReport:
    faults: list[Fault] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    review_reasons: dict[str, int] = field(default_factory=dict)
    task_tries: dict[str, int] = field(default_factory=dict)
    invariants: list[Any] = field(default_factory=list)
    provider: dict[str, int] = field(default_factory=dict)
    settle_rounds: int = 0
    airflow_view: Counter[str] = field(default_factory=Counter)  # reconciliation runs: checked / skipped: why
    seconds: float = 0.0
    error: str | None = None

    @property
    def broken(self) -> list[Any]:
        return [i for i in self.invariants if not i.holds]

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.invariants) and not self.broken

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "runs": self.runs,
            "faults": dict(Counter(f.kind for f in self.faults)),
            "fault_log": [f.__dict__ for f in self.faults],
            "states": self.states,
            "review_reasons": self.review_reasons,
            "task_tries": self.task_tries,
            "provider": self.provider,
            "settle_rounds": self.settle_rounds,
            "airflow_view": dict(self.airflow_view),
            "invariants": [
                {"name": i.name, "description": i.description, "violations": i.violations} for i in self.invariants
            ],
        }

    def table(self) -> str:
        from triage_tools.drill.invariants import format_invariants

        lines = ["", "faults injected", "---------------"]
        kinds = Counter(f.kind for f in self.faults)
        lines += [f"  {kind:<34} {n:>7}" for kind, n in sorted(kinds.items())] or ["  (none)"]
        lines += ["", "outcomes", "--------"]
        lines += [f"  {state:<34} {n:>7}" for state, n in sorted(self.states.items())]
        lines += [f"    manual_review: {reason:<19} {n:>7}" for reason, n in sorted(self.review_reasons.items())]
        lines += ["", "airflow task tries (state: count)", "---------------------------------"]
        lines += [f"  {k:<34} {n:>7}" for k, n in sorted(self.task_tries.items())]
        lines += ["", "label provider", "--------------"]
        lines += [f"  {k:<34} {n:>7}" for k, n in sorted(self.provider.items())]
        lines += [
            "",
            f"runs: {json.dumps(self.runs)}",
            f"settle rounds: {self.settle_rounds}",
            f"reconciliation's Airflow view: {json.dumps(dict(self.airflow_view))}",
            f"drill time: {self.seconds:.0f} s",
            "",
        ]
        if self.invariants:
            lines += [format_invariants(self.invariants), ""]
        held = len(self.invariants) - len(self.broken)
        verdict = "PASSED" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {held}/{len(self.invariants)} invariants hold" + (f"; {self.error}" if self.error else "")
        )
        return "\n".join(lines)
