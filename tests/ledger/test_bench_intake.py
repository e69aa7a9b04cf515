"""The intake bench's Airflow auth (bench/intake.py ``_auth``): a real SimpleAuthManager on a
PostgreSQL metadata database, in a process of its own (it configures Airflow's ORM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from triage.database import DatabaseUrl

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from pathlib import Path
from bench.intake import _auth
with _auth(Path(sys.argv[1]), sys.argv[2]) as env:
    assert env["BENCH_TOKEN"]
print("token made")
"""


def test_the_bench_prints_no_password(fresh_database: DatabaseUrl, tmp_path: Path) -> None:
    """SimpleAuthManager prints every password it generates; the bench gives it the user's own
    first, so ``make bench``'s output holds no credential (it printed one before)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), fresh_database.airflow_metadata_url()],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "plugins"), str(ROOT)))},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "token made" in done.stdout
    output = done.stdout + done.stderr
    assert "Password for user" not in output
    passwords = json.loads((tmp_path / "simple_auth_manager_passwords.json").read_text())
    assert passwords["bench"]
    assert passwords["bench"] not in output
