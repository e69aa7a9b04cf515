"""The failure drill, small: what ``make chaos`` does with 20,000 documents, here with 2,000 over
two dates, one kill after an external action, a kill under a claim when one is caught, and one
PostgreSQL restart; the drill's own process, so its environment never leaks into the suite's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_small_drill_keeps_every_invariant(tmp_path: Path) -> None:
    home = tmp_path / "chaos"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_DATABASE_URL"))}
    env["PYTHONPATH"] = str(ROOT / "plugins")
    result = subprocess.run(
        [sys.executable, "-m", "triage.drill.chaos", "--documents", "2000", "--dates", "2", "--claim-kills", "1",
         "--action-kills", "1", "--db-restarts", "1", "--home", str(home)],
        env=env, cwd=ROOT, text=True, capture_output=True, timeout=1200, check=False,
    )  # fmt: skip
    output = result.stdout[-6000:] + result.stderr[-6000:]
    report = json.loads((home / "report.json").read_text())
    assert result.returncode == 0, output
    assert report["ok"], output
    assert report["faults"].get("kill_after_action") == 1, output
    assert report["faults"].get("postgres_restart") == 1, output
    invariants = {i["name"]: i["violations"] for i in report["invariants"]}
    assert len(invariants) >= 10
    assert set(invariants.values()) == {0}
    assert report["provider"]["keys asked more than once"] > 0  # the killed action was asked again …
    assert report["provider"]["effects"] == report["states"]["completed"]  # … and took effect once
    assert sum(report["states"].values()) >= 2000
