"""The house's rules (issue #12 item 3, issue #26 item 4). Product and tooling live apart: what
Airflow workers import (``plugins/``, ``dags/``) never imports the developer tools
(``triage_tools``) or the embedded database's package, the image does not copy the tools, and
the product's modules and command work where the tools cannot be imported at all. The rooms of
the product keep their import contracts, and only the ledger writes its tables: the same check
as ``python -m triage_tools.layout`` (:mod:`triage_tools.layout`), whose known exceptions only
shrink."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import triage
from triage_tools import layout
from triage_tools.layout import (
    CONTRACTS,
    KNOWN_EXCEPTIONS,
    LAYERS,
    TOOLS,
    WRITE_BUILDERS,
    Checkout,
    Report,
    check,
    embedded_server_packages,
    imported_modules,
    ledger_tables,
    ledger_writes,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_scan_sees_imports_of_every_form() -> None:
    source = (
        "import triage_tools.local\n"
        "from triage_tools import embedded\n"
        "from ... import triage_tools as t\n"
        "import importlib\n"
        "importlib.import_module('triage_tools.run')\n"
        "__import__('pgserver')\n"
    )
    found = imported_modules(ROOT / "plugins" / "triage" / "jobs" / "probe.py", source)
    assert {"triage_tools.local", "triage_tools", "triage_tools.run", "pgserver"} <= found
    assert embedded_server_packages(), "triage_tools/embedded.py imports no server package?"


def test_the_image_copies_no_tooling() -> None:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    copies = [line.split()[1:] for line in text.splitlines() if re.match(r"^\s*(COPY|ADD)\s", line)]
    assert copies
    for words in copies:
        sources = [w for w in words if not w.startswith("--")][:-1]  # the last word is the target
        for source in sources:
            top = source.strip("/").split("/")[0]
            assert top not in (TOOLS, "tools", "bench", "tests", ".", "*"), f"the image copies {source}"


PRODUCT_WITHOUT_TOOLS = """
import importlib, json, pkgutil, sys
sys.modules["triage_tools"] = None  # any import of the tools raises ImportError from here on
import triage
names = [m.name for m in pkgutil.walk_packages(triage.__path__, "triage.") if not m.name.startswith("triage.migrations.")]
for name in names:
    importlib.import_module(name)
from triage.cli import main
print(json.dumps({"modules": len(names), "run": main(["run"]), "status": main(["status"])}))
"""


def test_the_product_and_its_command_work_without_the_tools() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRIAGE_DATABASE_URL"}
    env["PYTHONPATH"] = str(ROOT / "plugins")
    argv = [sys.executable, "-c", PRODUCT_WITHOUT_TOOLS]
    done = subprocess.run(argv, env=env, cwd=ROOT / "plugins", capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["modules"] > 50
    assert result == {"modules": result["modules"], "run": 2, "status": 2}
    assert "'run' is a developer command of a checkout" in done.stderr
    assert "TRIAGE_DATABASE_URL is not set" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("make_args", "expected"),
    [
        pytest.param(["migrate"], ".venv/bin/triage migrate", id="migrate"),
        pytest.param(["run", "DATE=2026-11-01"], ".venv/bin/triage run --date '2026-11-01' --conf '{}'", id="run"),
        pytest.param(["run", "VERBOSE=1"], ".venv/bin/triage run --date '' --conf '{}' --verbose", id="run-verbose"),
        pytest.param(["run", "VERBOSE=0"], ".venv/bin/triage run --date '' --conf '{}'", id="run-verbose-0"),
        pytest.param(["up"], ".venv/bin/triage up", id="up"),
        pytest.param(["stop"], ".venv/bin/triage stop", id="stop"),
        pytest.param(["reset-secrets"], ".venv/bin/triage reset-secrets", id="reset-secrets"),
        pytest.param(["chaos", "CHAOS=--dates 2"], ".venv/bin/triage chaos --dates 2", id="chaos"),
        pytest.param(["distributed"], ".venv/bin/triage distributed --date '' --conf '{}'", id="distributed"),
    ],
)
def test_make_targets_call_the_triage_command(make_args: list[str], expected: str) -> None:
    done = subprocess.run(["make", "-n", *make_args], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout.splitlines(), done.stdout


def test_make_setup_installs_the_checkout_with_its_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\t\$\(PY\) -m pip install --quiet --no-deps -e \.$", makefile, re.M)
    assert re.search(r"^\$\(STAMP\):.*\bpyproject\.toml\b", makefile, re.M)  # reinstalled when it changes


def test_the_version_without_an_install_is_the_package_s() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == triage.__version__  # what `triage --version` says when not installed


def test_the_triage_command_names_a_missing_embedded_server_package(tmp_path: Path) -> None:
    """Where the dev requirements are not installed, `triage status` without TRIAGE_DATABASE_URL
    says what is missing and the two ways out, instead of a traceback."""
    [package, *_] = sorted(embedded_server_packages())
    script = (
        f"import sys; sys.modules[{package!r}] = None\n"  # as if it were not installed
        "from triage_tools.cli import main\n"
        "sys.exit(main(['status']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRIAGE_DATABASE_URL"}
    env.update(PYTHONPATH=str(ROOT / "plugins"), TRIAGE_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert f"the Python package {package} is missing here" in done.stderr
    assert "make setup" in done.stderr
    assert "TRIAGE_DATABASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home").exists()  # nothing was started


# -- the ledger owns its tables ----------------------------------------------------------------


def test_the_write_scan_sees_every_form() -> None:
    source = (
        "import sqlalchemy as sa\n"
        "from sqlalchemy.dialects import postgresql as pg\n"
        "from sqlalchemy import delete\n"
        "a = sa.update(jobs).values(status='queued')\n"
        "b = pg.insert(schema.manual_review).on_conflict_do_nothing()\n"
        "c = delete(outbox_claims)\n"
        "d = classifications.insert()\n"
        "e = sa.text('update  triage.job_events set x = 1')\n"
        "f = 'INSERT INTO \"triage\".document_labels (x) VALUES (1)'\n"
        "g = sa.update(reconciliation_runs)\n"  # not a ledger table
        "h = 'UPDATE plain.jobs SET x = 1'\n"  # not the triage schema (the bench's bare table)
        "def f():\n"
        "    'UPDATE triage.jobs in a docstring is prose'\n"
    )
    found = ledger_writes(ROOT / "plugins" / "triage" / "probe.py", source)
    assert [line for line, _, _ in found] == [4, 5, 6, 7, 8, 9], found
    assert [table for _, table, _ in found] == [
        "jobs",
        "manual_review",
        "outbox_claims",
        "classifications",
        "job_events",
        "document_labels",
    ]
    assert ledger_tables() >= {"jobs", "job_events", "manual_review", "outbox", "replay_requests", "model_budgets"}
    assert "reconciliation_runs" not in ledger_tables()  # reconciliation's own (NOT_THE_LEDGER)
    imports = "from triage.jobs.sql.expressions import NOW, outbox_insert\nfrom triage.jobs.sql.moves import repairs\n"
    found_imports = imported_modules(ROOT / "plugins" / "triage" / "probe.py", imports) & WRITE_BUILDERS
    assert found_imports == {"triage.jobs.sql.expressions.outbox_insert", "triage.jobs.sql.moves.repairs"}


# -- the rooms and their contracts -------------------------------------------------------------


@pytest.fixture(scope="module")
def report() -> Report:
    return check()


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_the_contract_holds(report: Report, contract: layout.Contract) -> None:
    """A new break fails here: fix it, or name it in ``KNOWN_EXCEPTIONS`` with why."""
    [verdict] = [v for v in report.verdicts if v.contract == contract]
    assert verdict.new == [], f"{contract.name} ({contract.rule}) is broken: " + "; ".join(
        f"{v.key} ({v.detail})" for v in verdict.new
    )


def test_every_known_exception_still_occurs(report: Report) -> None:
    """An exception whose import (or write) is gone leaves the table with it: the list only shrinks."""
    assert report.stale == [], f"no longer occur, remove them from KNOWN_EXCEPTIONS: {report.stale}"
    assert report.known == len(KNOWN_EXCEPTIONS)


def test_the_rooms_do_not_overlap() -> None:
    paths = [path for layer in LAYERS for room in layer.rooms for path in room.paths]
    assert len(paths) == len(set(paths)), paths
    names = [room.name for layer in LAYERS for room in layer.rooms]
    assert len(names) == len(set(names)), names
    assert all((ROOT / path).exists() for path in paths), [p for p in paths if not (ROOT / p).exists()]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_new_break_fails_and_a_fixed_one_goes_stale(tmp_path: Path) -> None:
    """The checker on a small tree of its own: every contract's break is seen, an excused one is
    known, an exception that nothing breaks is stale, and a module outside every room is named."""
    root = _tree(
        tmp_path,
        {
            "triage_tools/embedded.py": "import pgserver\n",
            "plugins/triage/__init__.py": "",
            "plugins/triage/operators/__init__.py": "",
            "plugins/triage/operators/base.py": "import airflow.sdk\n",
            "plugins/triage/web/service.py": "from triage.operators.base import variable\n",
            "plugins/triage/jobs/__init__.py": "",
            "plugins/triage/jobs/sql/moves/repairs.py": "Q = 'UPDATE triage.jobs SET x = 1'\n",
            "plugins/triage/jobs/schema/__init__.py": (
                "import sqlalchemy as sa\njobs = sa.Table('jobs', m)\noutbox = sa.Table('outbox', m)\n"
                "runs = sa.Table('reconciliation_runs', m)\n"
            ),
            "plugins/triage/reconciliation/runner.py": "Q = 'INSERT INTO triage.reconciliation_runs (x) VALUES (1)'\n",
            "plugins/triage/jobs/vocabulary/states.py": "from triage.pipeline import steps\n",
            "plugins/triage/pipeline/steps.py": "import triage_tools.local\n",
            "plugins/triage/classifiers/llm.py": "from ..jobs.vocabulary import states\n",
            "plugins/triage/reconciliation/view.py": (
                '"""Asks GET /api/v2/dags (prose)."""\nPATH = f"/api/v2/dags/{1}/dagRuns"\n'
            ),
            "plugins/triage/newroom.py": "",
            "plugins/triage/review/reads.py": "def f(engine):\n    with engine.connect() as conn:\n        return conn\n",
            "plugins/triage/jobs/store/__init__.py": (
                "Q = 'DELETE FROM triage.outbox'\ndef g(engine):\n    with engine.begin() as conn:\n        return conn\n"
            ),
            "dags/a_dag.py": "from triage.operators import base\n",
            "bench/load.py": "from triage.jobs.sql.moves import repairs\nQ = 'DELETE FROM triage.outbox'\n",
        },
    )
    excused = {"triage.web.service -> triage.operators.base": "known", "triage.gone -> triage.jobs": "fixed"}
    report = check(Checkout(root), excused)
    new = {v.contract.name: sorted(x.key for x in v.new) for v in report.verdicts}
    assert new == {
        "layers": ["triage.jobs.vocabulary.states -> triage.pipeline.steps", "triage.newroom -> no room"],
        "Airflow stays in the adapters": ["triage.reconciliation.view -> Airflow's REST API"],
        "the domain does not need the ledger": ["triage.classifiers.llm -> triage.jobs.vocabulary.states"],
        "the product needs no tooling": ["triage.pipeline.steps -> triage_tools"],
        "only the ledger writes its tables": [
            "bench.load -> triage.jobs.sql.moves.repairs",
            "bench.load -> writes outbox",
            "triage.jobs.store -> writes outbox",
        ],
        "only the store opens ledger transactions": ["triage.review.reads -> opens a transaction"],
    }
    assert [v.key for v in report.verdicts[0].known] == ["triage.web.service -> triage.operators.base"]
    assert report.stale == ["triage.gone -> triage.jobs"]
    assert not report.holds
    assert "STALE exception" in layout.render(report)
    assert "NEW:   triage.newroom -> no room" in layout.render(report)


def test_the_command_prints_the_rooms_and_that_the_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    argv = [sys.executable, "-m", "triage_tools.layout"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for room in (room for layer in LAYERS for room in layer.rooms):
        assert re.search(rf"^\s+{re.escape(room.name)}\s", done.stdout, re.M), room.name
    for contract in CONTRACTS:
        assert f"  {contract.name}: holds" in done.stdout
    for key in KNOWN_EXCEPTIONS:
        assert f"known: {key}  (" in done.stdout
    n = len(KNOWN_EXCEPTIONS)
    assert done.stdout.splitlines()[-1] == f"All {len(CONTRACTS)} contracts hold, with {n} known exceptions (listed)."
