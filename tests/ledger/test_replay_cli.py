"""``triage replay`` on a real PostgreSQL: a dry run by default that prints the preview,
``--apply`` only with a note, as the operating-system user, and the same command twice is a no-op."""

from __future__ import annotations

import getpass
import json

import pytest

from tests.ledger.test_replay_by_filter import DAY1, failed, rows, snapshot
from triage import cli
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore


@pytest.fixture(autouse=True)
def _job_database(db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", db_url.libpq())


def test_a_dry_run_prints_the_preview_and_changes_nothing(store: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    ids = failed(store, 2) + failed(store, 1, terminal=True)
    before = snapshot(store)
    argv = [
        "replay",
        "--reason",
        "retries_exhausted",
        "--state",
        "manual_review",
        "--state",
        "terminal_failed",
        "--batch",
        DAY1,
        "--since",
        "2026-01-01",
        "--limit",
        "10",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "**dry run**: 3 jobs match, 3 would be replayed" in out
    assert all(str(i) in out for i in ids)
    assert snapshot(store) == before
    assert cli.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["outcome"], report["matching"]) == ("dry_run", 3)
    # DESIGN.md's spelling: --from/--to and an explicit --dry-run
    design = ["replay", "--reason", "retries_exhausted", "--from", "2026-01-01", "--to", "2100-01-01", "--dry-run"]
    assert cli.main([*design, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matching"] == 2
    assert snapshot(store) == before


def test_apply_needs_a_note_then_replays_as_the_user_once(store: JobStore, capsys: pytest.CaptureFixture[str]) -> None:
    ids = failed(store, 2, terminal=True)
    argv = ["replay", "--reason", "retries_exhausted", "--state", "terminal_failed", "--apply"]
    before = snapshot(store)
    assert cli.main(argv) == 2
    assert "needs a note" in capsys.readouterr().err
    assert snapshot(store) == before
    assert cli.main([*argv, "--note", "provider fixed", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["outcome"], set(done["job_ids"])) == ("applied", {str(i) for i in ids})
    assert rows(store, "SELECT DISTINCT actor FROM triage.job_events WHERE reason LIKE 'replayed:%'") == [
        (getpass.getuser(),)
    ]
    before = snapshot(store)
    assert cli.main([*argv, "--note", "provider fixed"]) == 0
    assert "**already applied**" in capsys.readouterr().out
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="no-narrowing-field"),
        pytest.param(["--reason", "x", "--limit", "10001"], id="over-the-bound"),
        pytest.param(["--reason", "x", "--since", "soon"], id="not-a-date"),
        pytest.param(["--source", "a\x1bb"], id="control-character"),
    ],
)
def test_a_bad_filter_exits_2_with_the_reason(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", *extra]) == 2
    assert "invalid replay filter" in capsys.readouterr().err
