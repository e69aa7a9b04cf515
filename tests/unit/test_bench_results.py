"""``bench/results/latest.json`` keeps every suite's last figures: ``make bench`` then ``make
bench-growth`` leave one file with both, and a suite run again replaces only its own."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import Figure, write_results


def figure(name: str, value: float) -> Figure:
    return Figure(name, "docs/s", value, "bare", 100.0, target_ratio=0.5)


def test_a_later_run_keeps_the_other_suites_and_replaces_its_own(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    write_results(
        {"ledger": [figure("register", 80.0), figure("claim", 40.0)], "realrun": [figure("run", 20.0)]},
        "python -m bench",
        path,
    )
    write_results(
        {"growth": [figure("reconcile at 1M", 90.0)], "ledger": [figure("register", 70.0)]},
        "python -m bench growth ledger",
        path,
    )
    data = json.loads(path.read_text())
    rows = {(f["suite"], f["name"]): (f["value"], f["command"], f["ok"]) for f in data["figures"]}
    assert rows == {
        ("realrun", "run"): (20.0, "python -m bench", False),
        ("growth", "reconcile at 1M"): (90.0, "python -m bench growth ledger", True),
        ("ledger", "register"): (70.0, "python -m bench growth ledger", True),  # "claim" went with its suite's old run
    }
    assert data["command"] == "python -m bench growth ledger"


def test_a_file_of_another_shape_is_started_afresh(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    for old in ("not json", json.dumps({"figures": [{"name": "no suite"}]}), json.dumps([1, 2])):
        path.write_text(old)
        write_results({"relay": [figure("events/s", 60.0)]}, "python -m bench relay", path)
        assert [(f["suite"], f["name"]) for f in json.loads(path.read_text())["figures"]] == [("relay", "events/s")]
