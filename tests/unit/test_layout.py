"""Product and tooling live apart (issue #12, item 3): what Airflow workers import (``plugins/``,
``dags/``) never imports the developer tools (``triage_tools``) or the embedded database's
package, the image does not copy the tools, and the product's modules and command work where
the tools cannot be imported at all. The ledger owns its tables: nothing outside
``plugins/triage/jobs/`` writes them. The product's modules stay short."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import triage

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "triage_tools"
PRODUCT_TREES = (ROOT / "plugins", ROOT / "dags")


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` (or ``source`` as if it were ``path``) imports: import statements,
    ``from`` imports (relative ones resolved against the package), and
    ``importlib.import_module`` / ``__import__`` of a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))
    package = ".".join(path.relative_to(ROOT / "plugins").parent.parts) if ROOT / "plugins" in path.parents else ""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def embedded_server_packages() -> set[str]:
    """The third-party packages ``triage_tools/embedded.py`` starts PostgreSQL with (whichever it
    is: the test follows the module, not a name)."""
    ours = {"triage", TOOLS, "psycopg", "__future__"}
    tops = {name.split(".")[0] for name in imported_modules(ROOT / TOOLS / "embedded.py")}
    return tops - ours - set(sys.stdlib_module_names)


def product_files() -> list[Path]:
    return sorted(p for tree in PRODUCT_TREES for p in tree.rglob("*.py"))


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


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_imports_no_tooling(path: Path) -> None:
    banned = {TOOLS, *embedded_server_packages()}
    offending = {m for m in imported_modules(path) if m.split(".")[0] in banned}
    assert not offending, f"{path.relative_to(ROOT)} imports {sorted(offending)}: the product must not need the tools"


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

LEDGER = ROOT / "plugins" / "triage" / "jobs"
LEDGER_TABLES = frozenset(
    {
        "jobs",
        "job_events",
        "manual_review",
        "outbox",
        "outbox_claims",
        "classifications",
        "document_labels",
        "replay_requests",
    }
)
WRITES_EXEMPT = {
    ROOT / "plugins" / "triage" / "migrations": "the schema itself: its DDL, and the trigger that writes job_events",
    ROOT / "bench" / "simulation": (
        "the benchmarks' simulated past (bulk loads as the owner, triggers aside), and the ledger"
        " stripped of a guarantee for bench.guarantees' A/B (a scratch database only)"
    ),
}
SQL_WRITE = re.compile(
    r"\b(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|MERGE\s+INTO)\s+(?:ONLY\s+)?"
    r"(?:\"?triage\"?\s*\.\s*)?\"?(\w+)\"?",
    re.IGNORECASE,
)


def _name(node: ast.expr) -> str:
    """The last name of ``a.b.c`` or ``c``; empty for anything else."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def ledger_writes(path: Path, source: str | None = None) -> list[str]:
    """Where ``path`` writes a ledger table: ``update(jobs)``, ``insert(…)``, ``delete(…)`` of
    SQLAlchemy (``sa.``, ``pg.`` or bare), a table's own ``.update()``/``.insert()``/``.delete()``,
    or SQL text (any string but a docstring) that updates, inserts into, deletes from, truncates
    or merges into one."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in ("update", "insert", "delete"):
            target = node.args[0] if node.args else node.func.value if isinstance(node.func, ast.Attribute) else None
            if target is not None and _name(target) in LEDGER_TABLES:
                found.append((node.lineno, f"{_name(node.func)}({_name(target)})"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [
                (node.lineno, repr(m.group(0)))
                for m in SQL_WRITE.finditer(node.value)
                if m.group(1).lower() in LEDGER_TABLES
            ]
    return [f"line {line}: {what}" for line, what in sorted(found)]


WRITE_MODULES = ("transitions", "recovery", "review_transitions", "outputs", "repairs", "session")
WRITE_BUILDERS = frozenset(f"triage.jobs.{m}" for m in WRITE_MODULES) | {
    "triage.jobs.expressions.outbox_insert",
    "triage.jobs.expressions.review_rows",
}
"""The ledger's writes (and its transaction settings): only :class:`~triage.jobs.store.JobStore` runs them."""


def code_outside_the_ledger() -> list[Path]:
    trees = (ROOT / "plugins", ROOT / "dags", ROOT / TOOLS, ROOT / "bench")
    return sorted(
        p
        for tree in trees
        for p in tree.rglob("*.py")
        if LEDGER not in p.parents and not any(exempt in p.parents for exempt in WRITES_EXEMPT)
    )


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
    assert [f.split(":")[0] for f in found] == [f"line {n}" for n in (4, 5, 6, 7, 8, 9)], found
    imports = "from triage.jobs.expressions import NOW, outbox_insert\nfrom triage.jobs import repairs\n"
    found_imports = imported_modules(ROOT / "plugins" / "triage" / "probe.py", imports) & WRITE_BUILDERS
    assert found_imports == {"triage.jobs.expressions.outbox_insert", "triage.jobs.repairs"}


@pytest.mark.parametrize("path", code_outside_the_ledger(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_ledger_writes_its_tables(path: Path) -> None:
    """Every write to the ledger's tables is a named statement of ``plugins/triage/jobs/``
    (reconciliation's repairs included), run by the store; everything else asks it by name."""
    assert ledger_writes(path) == [], f"{path.relative_to(ROOT)} writes the ledger's tables itself"
    builders = sorted(imported_modules(path) & WRITE_BUILDERS)
    assert builders == [], f"{path.relative_to(ROOT)} builds the ledger's writes from {builders}: ask the store"


# -- modules of one concept ------------------------------------------------------------------------

MAX_LINES = 400
LONG_MODULES: dict[str, str] = {}
"""Product modules allowed past :data:`MAX_LINES`, each with the reason: debts, not exemptions."""
LONG_TOOLS: dict[str, str] = {}
"""The same for the developer tools (``triage_tools/``)."""
SHORT_TREES = {"plugins/triage": LONG_MODULES, TOOLS: LONG_TOOLS}


@pytest.mark.parametrize(
    ("path", "debts"),
    [
        pytest.param(path, debts, id=str(path.relative_to(ROOT)))
        for tree, debts in SHORT_TREES.items()
        for path in sorted((ROOT / tree).rglob("*.py"))
    ],
)
def test_modules_stay_short(path: Path, debts: dict[str, str]) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    name = str(path.relative_to(ROOT))
    assert lines <= MAX_LINES or name in debts, (
        f"{name} has {lines} lines (limit {MAX_LINES}): split it by what it holds, or name it with why "
        "(LONG_MODULES, LONG_TOOLS)"
    )


@pytest.mark.parametrize(("tree", "debts"), SHORT_TREES.items(), ids=list(SHORT_TREES))
def test_every_named_debt_is_still_owed(tree: str, debts: dict[str, str]) -> None:
    """A module split below the limit (or gone) leaves the list with it, so the list stays the debts."""
    paid = [n for n in debts if not (ROOT / n).is_file() or len((ROOT / n).read_text().splitlines()) <= MAX_LINES]
    assert paid == [], f"no longer past {MAX_LINES} lines: {paid}"
    assert all(name.startswith(f"{tree}/") for name in debts), debts
