"""Shared pieces of the benchmarks: a scratch database, timing, the results file."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from triage import migrations
from triage.database import DatabaseUrl, configured_url
from triage_tools import embedded

RESULTS = Path(__file__).parent / "results" / "latest.json"


@dataclass
class Figure:
    name: str
    unit: str
    value: float
    baseline_name: str
    baseline: float
    target_ratio: float | None = None
    higher_is_better: bool = True
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")

    @property
    def ok(self) -> bool | None:
        if self.target_ratio is None:
            return None
        return self.ratio >= self.target_ratio if self.higher_is_better else self.ratio <= self.target_ratio

    def line(self) -> str:
        target = (
            "" if self.target_ratio is None else f"  target {'≥' if self.higher_is_better else '≤'} {self.target_ratio}"
        )
        verdict = {True: "  ok", False: "  MISSED", None: ""}[self.ok]
        return (
            f"{self.name:<44} {self.value:>12,.1f} {self.unit:<8} vs {self.baseline_name:<36} "
            f"{self.baseline:>12,.1f}  ratio {self.ratio:5.2f}{target}{verdict}"
        )


def server() -> DatabaseUrl:
    configured = configured_url()
    return configured.with_database("postgres") if configured else embedded.start()


@contextmanager
def scratch_database(migrate: bool = True) -> Iterator[DatabaseUrl]:
    """A throwaway database on the benchmark server, migrated, dropped afterwards."""
    base = server()
    name = f"triage_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base.libpq(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = base.with_database(name)
    try:
        if migrate:
            # Quietly: once a suite has imported Airflow, its logging prints every revision at
            # info, twenty lines per scratch database between the figures.
            alembic = logging.getLogger("alembic")
            level, alembic.level = alembic.level, logging.WARNING
            try:
                migrations.upgrade(url)
            finally:
                alembic.setLevel(level)
        yield url
    finally:
        with psycopg.connect(base.libpq(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_cpu_seconds() -> float | None:
    """CPU seconds the embedded PostgreSQL has used so far: the postmaster, its live processes
    and the backends that have exited (``None`` with ``TRIAGE_DATABASE_URL``: not measurable here)."""
    if configured_url() is not None:
        return None
    import psutil

    pid = embedded.server_pid()
    if pid is None:
        return None
    postmaster = psutil.Process(pid)
    total = 0.0
    for proc in (postmaster, *postmaster.children()):
        try:
            times = proc.cpu_times()
        except Exception:  # noqa: BLE001 - a backend that exited meanwhile is counted by the postmaster
            continue
        total += (
            times.user + times.system + (times.children_user + times.children_system if proc is postmaster else 0.0)
        )
    return total


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def write_results(suites: dict[str, list[Figure]], command: str, path: Path = RESULTS) -> Path:
    """Write the figures of the suites just run into ``path``, each stamped with its suite, its
    command and when it was measured, keeping the figures that an earlier run wrote for other
    suites (``make bench`` then ``make bench-growth``: one file holds both). A suite run again
    replaces all of its figures; a file that is not this format is started afresh."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        kept = [f for f in json.loads(path.read_text())["figures"] if f["suite"] not in suites]
    except (OSError, ValueError, KeyError, TypeError):
        kept = []
    fresh = [
        dict(asdict(f), ratio=round(f.ratio, 3), ok=f.ok, suite=suite, command=command, at=now)
        for suite, figures in suites.items()
        for f in figures
    ]
    payload = {
        "command": command,
        "at": now,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "figures": kept + fresh,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
