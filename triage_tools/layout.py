"""The rooms of the product and the contracts between them: ``python -m triage_tools.layout``.

The product (``plugins/``, ``dags/``) is cut into rooms, and the rooms into layers, top to
bottom (:data:`LAYERS`). A room imports only rooms of the layers below its own, never a room
above and never a sibling of its layer; every product module is in exactly one room. Beside the
layers, a few forbidden imports (:data:`CONTRACTS`): Airflow stays in its adapter rooms, the
classifiers and sources do not reach into the ledger, the product needs none of the tools, and
only the ledger (``plugins/triage/jobs/``) writes the ledger's tables.

Where today's code breaks a contract, the break is named with its reason in one table,
:data:`KNOWN_EXCEPTIONS` (import-linter's ``ignore_imports``, one line each): the command says
the contract holds "with N known exceptions" and lists them; a new break fails, and so does an
exception that no longer occurs (the table only shrinks). The check is an AST scan of the
sources: nothing is imported, so it runs with the standard library alone; ``tests/unit/
test_layout.py`` runs the same check. Exit status 0 when every contract holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = "triage_tools"
PRODUCT_TREES = ("plugins", "dags")
"""What Airflow workers import and the image ships: the scope of the room contracts."""


@dataclass(frozen=True)
class Room:
    """A part of the product: ``paths`` relative to the checkout, a directory ending in ``/``."""

    name: str
    paths: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Layer:
    name: str
    rooms: tuple[Room, ...]


LAYERS: tuple[Layer, ...] = (
    Layer(
        "entry points",
        (
            Room("dags", ("dags/",), "thin wiring, one file per DAG: nothing imports them"),
            Room("plugin", ("plugins/triage_plugin.py",), "the Airflow plugin: mounts web/ in the API server"),
            Room(
                "command", ("plugins/triage/cli.py", "plugins/triage/__main__.py"), "python -m triage, a shell's door"
            ),
        ),
    ),
    Layer(
        "Airflow faces",
        (
            Room("operators", ("plugins/triage/operators/",), "the stages as Airflow tasks: thin operators"),
            Room("web", ("plugins/triage/web/",), "the pages and API at /triage, behind Airflow's auth"),
        ),
    ),
    Layer(
        "Airflow adapter",
        (
            Room(
                "adapters",
                ("plugins/triage/adapters/",),
                "connections become hooks and clients once: the ledger DB, the model API, the HTTP actions;"
                " callbacks, triggers, Airflow's REST client",
            ),
        ),
    ),
    Layer(
        "services",
        (
            Room("pipeline", ("plugins/triage/pipeline/",), "the stages as plain functions over the ledger"),
            Room("reconciliation", ("plugins/triage/reconciliation/",), "checks, repairs and the report"),
            Room("review", ("plugins/triage/review/",), "a reviewer's decisions and replays"),
            Room("learning", ("plugins/triage/learning/",), "labelled examples, training, the model registry"),
            Room("maintenance", ("plugins/triage/maintenance/",), "retention: the ledger's and the files'"),
            Room("alerts", ("plugins/triage/alerts.py",), "when a person must be told; reads the ledger's moves"),
            Room("migrations", ("plugins/triage/migrations/",), "the schema's history; applies jobs/' schema"),
        ),
    ),
    Layer(
        "ports",
        (
            Room(
                "ports",
                ("plugins/triage/ports/",),
                "the Protocols the services ask of the outside (label provider, Airflow's task states);"
                " the adapters implement them",
            ),
        ),
    ),
    Layer(
        "domain",
        (
            Room("classifiers", ("plugins/triage/classifiers/",), "classifiers behind one Protocol"),
            Room("sources", ("plugins/triage/sources/",), "retrieval sources behind one Protocol"),
        ),
    ),
    Layer(
        "telemetry",
        (
            Room(
                "telemetry",
                ("plugins/triage/observability.py", "plugins/triage/tracing.py"),
                "metrics and spans the stages and model calls report; names the ledger's claim and outcome types",
            ),
        ),
    ),
    Layer(
        "stores",
        (
            Room(
                "jobs.store",
                ("plugins/triage/jobs/store/",),
                "the ledger's JobStore and its named parts: the only code that opens ledger transactions",
            ),
            Room(
                "payloads",
                ("plugins/triage/payloads.py", "plugins/triage/payload_packs.py", "plugins/triage/payload_refs.py"),
                "the claim check: payload bytes by content hash, beside the ledger that holds their refs",
            ),
        ),
    ),
    Layer(
        "ledger statements",
        (
            Room(
                "jobs.sql",
                ("plugins/triage/jobs/sql/",),
                "every named statement of the ledger: moves, writes, reads (built here, run by the store)",
            ),
        ),
    ),
    Layer(
        "ledger schema",
        (
            Room(
                "jobs.schema",
                ("plugins/triage/jobs/schema/", "plugins/triage/jobs/__init__.py"),
                "the ledger's tables as SQLAlchemy metadata, which the migrations create",
            ),
        ),
    ),
    Layer(
        "ledger vocabulary",
        (
            Room(
                "jobs.vocabulary",
                ("plugins/triage/jobs/vocabulary/",),
                "states, errors, backoff, the store's domain objects (no SQL)",
            ),
        ),
    ),
    Layer(
        "foundations",
        (
            Room("contracts", ("plugins/triage/contracts/",), "pydantic events, documents, run params"),
            Room("settings", ("plugins/triage/settings.py",), "where a deployment's files are, what runs may ask"),
            Room(
                "database",
                ("plugins/triage/database.py", "plugins/triage/roles.py"),
                "where the job database is and who connects to it",
            ),
            Room("markdown", ("plugins/triage/markdown.py",), "escaping of values Triage does not choose"),
            Room("package", ("plugins/triage/__init__.py",), "triage itself (its version): every import runs it"),
        ),
    ),
)

KNOWN_EXCEPTIONS: dict[str, str] = {
    # Debts, not permissions: each line names a break that today's code makes, and why; fixing
    # one means deleting its line (the check fails while a line names a break that is gone).
    # Key: "importer -> imported" as `python -m triage_tools.layout` prints it (a module, a
    # top-level package, "Airflow's REST API" or "writes TABLE").
    "triage.sources.synthetic -> triage.classifiers.taxonomy": "synthetic tickets use the taxonomy's keywords",
    "triage.classifiers -> triage.learning.registry": "type only: the loaded model's type lives in the registry",
    "triage.classifiers.learned -> triage.learning.registry": "type only: the loaded model's type lives in the registry",
    "triage.payloads -> airflow": (
        "ObjectStoragePath for a base naming an Airflow connection (s3://conn_id@bucket) given as a string"
        " (the CLI, retention, learning's commands, the pages' reads): callers do not pass path objects yet"
    ),
}


# -- the scan ----------------------------------------------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    """``plugins/triage/jobs/store/__init__.py`` → ``triage.jobs.store`` (``plugins/`` is on the path);
    ``dags/reconcile_jobs.py`` → ``dags.reconcile_jobs``; a package's ``__init__`` is the package."""
    parts = path.relative_to(root).with_suffix("").parts
    parts = parts[1:] if parts[0] == "plugins" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path, root: Path) -> list[str]:
    """The package a relative import in ``path`` is relative to."""
    name = module_name(path, root)
    return name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]


def _parse(path: Path, source: str | None) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8") if source is None else source, filename=str(path))


def imported_modules(path: Path, source: str | None = None, root: Path = ROOT) -> set[str]:
    """Every module ``path`` (or ``source`` as if it were ``path``) imports, at any depth (in a
    function too): import statements, ``from`` imports (``from m import x`` gives ``m`` and
    ``m.x``; relative ones resolved against the package), and ``importlib.import_module`` /
    ``__import__`` of a literal name."""
    found: set[str] = set()
    for node in ast.walk(_parse(path, source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(path, root)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module:
                found.add(module)
            found.update(f"{module}.{alias.name}".lstrip(".") for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def strings(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """Every string constant of ``path`` but its docstrings (prose), with its line; the literal
    parts of f-strings included."""
    tree = _parse(path, source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


@dataclass(frozen=True)
class Source:
    """One module of the checkout, as the contracts see it."""

    path: Path
    name: str
    imports: frozenset[str]


class Checkout:
    """The modules of a checkout (``root``), parsed once; imports resolved to its own modules."""

    def __init__(self, root: Path = ROOT, trees: Sequence[str] = (*PRODUCT_TREES, TOOLS, "bench")) -> None:
        self.root = root
        paths = sorted(p for tree in trees for p in (root / tree).rglob("*.py"))
        self.sources = [Source(p, module_name(p, root), frozenset(imported_modules(p, root=root))) for p in paths]
        self.by_name = {s.name: s for s in self.sources}

    def under(self, *trees: str) -> list[Source]:
        return [s for s in self.sources if s.path.relative_to(self.root).parts[0] in trees]

    def resolve(self, imported: str) -> Source | None:
        """The module of this checkout an imported name is (``triage.jobs.store.JobStore`` is
        ``triage.jobs.store``), or None for a name from outside."""
        parts = imported.split(".")
        for end in range(len(parts), 0, -1):
            if (found := self.by_name.get(".".join(parts[:end]))) is not None:
                return found
        return None

    def local_imports(self, source: Source) -> set[str]:
        """The names of this checkout's modules that ``source`` imports (not itself). A package
        whose module is imported too is left out: ``from triage.jobs import states`` is an import
        of ``triage.jobs.vocabulary.states``, one break and not two."""
        found = {r.name for name in source.imports if (r := self.resolve(name)) is not None and r is not source}
        return {name for name in found if not any(other.startswith(f"{name}.") for other in found)}

    def room_of(self, source: Source) -> tuple[int, Room] | None:
        """The layer index and room a product module is in (the most specific path wins)."""
        relative = source.path.relative_to(self.root).as_posix()
        matches = [
            (len(path), index, room)
            for index, layer in enumerate(LAYERS)
            for room in layer.rooms
            for path in room.paths
            if relative == path or (path.endswith("/") and relative.startswith(path))
        ]
        return max(matches, key=lambda m: m[0])[1:] if matches else None


# -- the contracts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """A break of a contract: ``key`` is what :data:`KNOWN_EXCEPTIONS` names it by."""

    importer: str
    imported: str
    detail: str = ""

    @property
    def key(self) -> str:
        return f"{self.importer} -> {self.imported}"


@dataclass(frozen=True)
class Contract:
    name: str
    rule: str
    check: Callable[[Checkout], Iterable[Violation]]


def layer_breaks(checkout: Checkout) -> Iterator[Violation]:
    """Imports upward or sideways between the rooms of :data:`LAYERS`, and modules in no room."""
    for source in checkout.under(*PRODUCT_TREES):
        placed = checkout.room_of(source)
        if placed is None:
            yield Violation(source.name, "no room", "place it in a room of LAYERS (triage_tools/layout.py)")
            continue
        layer, room = placed
        for name in sorted(checkout.local_imports(source)):
            target = checkout.room_of(checkout.by_name[name])
            if target is None or target[1] == room:
                continue
            if target[0] < layer:
                yield Violation(source.name, name, f"{room.name} imports {target[1].name}, a layer above it")
            elif target[0] == layer:
                yield Violation(source.name, name, f"{room.name} imports {target[1].name}, its sibling")


AIRFLOW_ROOMS = frozenset({"dags", "plugin", "operators", "web", "adapters"})
AIRFLOW_REST = re.compile(r"/api/v[12]/|/auth/token\b")
"""Airflow's REST API as its clients name it (outside docstrings): a module that names it calls Airflow."""


def airflow_outside_the_adapters(checkout: Checkout) -> Iterator[Violation]:
    for source in checkout.under(*PRODUCT_TREES):
        placed = checkout.room_of(source)
        if placed is None or placed[1].name in AIRFLOW_ROOMS:
            continue
        if any(name.split(".")[0] == "airflow" for name in source.imports):
            yield Violation(source.name, "airflow", "imports Airflow")
        lines = [line for line, text in strings(source.path) if AIRFLOW_REST.search(text)]
        if lines:
            yield Violation(source.name, "Airflow's REST API", f"calls it (line {lines[0]})")


def the_domain_reaching_the_ledger(checkout: Checkout) -> Iterator[Violation]:
    for source in checkout.under("plugins"):
        placed = checkout.room_of(source)
        if placed is not None and placed[1].name in ("classifiers", "sources"):
            for name in sorted(checkout.local_imports(source)):
                if name == "triage.jobs" or name.startswith("triage.jobs."):
                    yield Violation(source.name, name, "the domain imports the ledger")


@cache
def embedded_server_packages(root: Path = ROOT) -> frozenset[str]:
    """The third-party packages ``triage_tools/embedded.py`` starts PostgreSQL with (whichever it
    is: the check follows the module, not a name)."""
    ours = {"triage", TOOLS, "psycopg", "__future__"}
    tops = {name.split(".")[0] for name in imported_modules(root / TOOLS / "embedded.py", root=root)}
    return frozenset(tops - ours - set(sys.stdlib_module_names))


def tooling_in_the_product(checkout: Checkout) -> Iterator[Violation]:
    banned = {TOOLS, *embedded_server_packages(checkout.root)}
    for source in checkout.under(*PRODUCT_TREES):
        for top in sorted({name.split(".")[0] for name in source.imports} & banned):
            yield Violation(source.name, top, "the product must not need the tools")


LEDGER = "plugins/triage/jobs/"
NOT_THE_LEDGER = {
    "reconciliation_runs": "reconciliation's own run history: its runner records a run, its report reads them",
}
"""Tables ``jobs/schema/__init__.py`` declares that are not the ledger's: their owner writes them."""
WRITES_EXEMPT = {
    "plugins/triage/migrations/": "the schema itself: its DDL, and the trigger that writes job_events",
    "bench/simulation/": (
        "the benchmarks' simulated past (bulk loads as the owner, triggers aside), and the ledger"
        " stripped of a guarantee for bench.guarantees' A/B (a scratch database only)"
    ),
}
"""Outside the ownership contract's scope (not debts: they stay)."""
SQL_WRITE = re.compile(
    r"\b(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|MERGE\s+INTO)\s+(?:ONLY\s+)?"
    r"(?:\"?triage\"?\s*\.\s*)?\"?(\w+)\"?",
    re.IGNORECASE,
)
STATEMENTS = "plugins/triage/jobs/sql/"
"""Where the ledger's SQL is built: the only place in the ledger a write of its tables is spelled."""
STORE = "plugins/triage/jobs/store/"
"""Where the ledger's SQL runs: :class:`~triage.jobs.store.JobStore` and its named parts."""
WRITE_FOLDERS = ("plugins/triage/jobs/sql/moves", "plugins/triage/jobs/sql/writes")
WRITE_BUILDERS = frozenset(
    module_name(path) for folder in WRITE_FOLDERS for path in (ROOT / folder).glob("*.py") if path.name != "__init__.py"
) | {"triage.jobs.sql.session", "triage.jobs.sql.expressions.outbox_insert", "triage.jobs.sql.expressions.review_rows"}
"""The ledger's writes (every module of ``sql/moves/`` and ``sql/writes/``) and its transaction
settings: only :class:`~triage.jobs.store.JobStore` runs them."""


def _last_name(node: ast.expr) -> str:
    """The last name of ``a.b.c`` or ``c``; empty for anything else."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


@cache
def ledger_tables(root: Path = ROOT) -> frozenset[str]:
    """The ledger's tables: every ``sa.Table("name", …)`` a module of ``jobs/`` declares, but
    :data:`NOT_THE_LEDGER` (so a table added to the schema is the ledger's without a word here)."""
    declared = {
        node.args[0].value
        for path in (root / LEDGER).rglob("*.py")
        for node in ast.walk(_parse(path, None))
        if isinstance(node, ast.Call)
        and _last_name(node.func) == "Table"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }
    return frozenset(declared - set(NOT_THE_LEDGER))


def ledger_writes(
    path: Path, source: str | None = None, tables: frozenset[str] | None = None
) -> list[tuple[int, str, str]]:
    """Where ``path`` writes a ledger table (``tables``, :func:`ledger_tables` by default), as
    (line, table, what): ``update(jobs)``, ``insert(…)``, ``delete(…)`` of SQLAlchemy (``sa.``,
    ``pg.`` or bare), a table's own ``.update()``/``.insert()``/``.delete()``, or SQL text (any
    string but a docstring) that updates, inserts into, deletes from, truncates or merges into one."""
    tables = ledger_tables() if tables is None else tables
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(_parse(path, source)):
        if isinstance(node, ast.Call) and _last_name(node.func) in ("update", "insert", "delete"):
            target = node.args[0] if node.args else node.func.value if isinstance(node.func, ast.Attribute) else None
            if target is not None:
                found.append((node.lineno, _last_name(target), f"{_last_name(node.func)}({_last_name(target)})"))
    for line, text in strings(path, source):
        found += [(line, m.group(1).lower(), repr(m.group(0))) for m in SQL_WRITE.finditer(text)]
    return sorted(f for f in found if f[1] in tables)


def writes_outside_the_ledger(checkout: Checkout) -> Iterator[Violation]:
    tables = ledger_tables(checkout.root)
    if not tables:
        yield Violation(LEDGER, "no tables", "the scan found no sa.Table in the ledger: follow the schema")
    for source in checkout.sources:
        relative = source.path.relative_to(checkout.root).as_posix()
        if relative.startswith(STATEMENTS) or any(relative.startswith(exempt) for exempt in WRITES_EXEMPT):
            continue
        if relative.startswith(LEDGER):  # the store runs statements, the vocabulary and schema have none
            for line, table, what in ledger_writes(source.path, tables=tables)[:1]:
                yield Violation(source.name, f"writes {table}", f"line {line}: {what}: build it in {STATEMENTS}")
            continue
        seen: set[str] = set()
        for line, table, what in ledger_writes(source.path, tables=tables):
            if table not in seen:
                seen.add(table)
                yield Violation(source.name, f"writes {table}", f"line {line}: {what}")
        for builder in sorted(source.imports & WRITE_BUILDERS):
            yield Violation(source.name, builder, "builds the ledger's writes: ask the store")


OPENERS = frozenset({"begin", "connect"})
"""A SQLAlchemy engine's ways to open a transaction or a connection (called with no argument)."""
TRANSACTIONS_EXEMPT = {
    "plugins/triage/migrations/": "the schema's history: Alembic's connection, as the migrating owner",
}
"""Outside the transactions contract's scope (not debts: they stay)."""


def transactions_outside_the_store(checkout: Checkout) -> Iterator[Violation]:
    """A product module outside :data:`STORE` that calls ``x.begin()`` or ``x.connect()``: it
    opens a transaction of its own on the job database, instead of asking the store by name."""
    for source in checkout.under(*PRODUCT_TREES):
        relative = source.path.relative_to(checkout.root).as_posix()
        if relative.startswith(STORE) or any(relative.startswith(exempt) for exempt in TRANSACTIONS_EXEMPT):
            continue
        calls = [
            node
            for node in ast.walk(_parse(source.path, None))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in OPENERS
            and not node.args
            and not node.keywords
        ]
        if calls:
            first = min(calls, key=lambda node: node.lineno)
            what = f"line {first.lineno}: .{_last_name(first.func)}()"
            yield Violation(source.name, "opens a transaction", f"{what}: ask the store (JobStore or a part)")


CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "layers",
        "a room imports only the layers below it, no sibling; every product module is in a room",
        layer_breaks,
    ),
    Contract(
        "Airflow stays in the adapters",
        f"only {', '.join(sorted(AIRFLOW_ROOMS))} import airflow or call Airflow's REST API",
        airflow_outside_the_adapters,
    ),
    Contract(
        "the domain does not need the ledger",
        "classifiers and sources import nothing of jobs/: the pipeline records what they answer",
        the_domain_reaching_the_ledger,
    ),
    Contract(
        "the product needs no tooling",
        f"plugins/ and dags/ import neither {TOOLS} nor the embedded server's packages",
        tooling_in_the_product,
    ),
    Contract(
        "only the ledger writes its tables",
        f"outside {STATEMENTS} (and {', '.join(WRITES_EXEMPT)}) no SQL writes a ledger table, and outside "
        f"{LEDGER} no module imports the ledger's write builders: the store runs them",
        writes_outside_the_ledger,
    ),
    Contract(
        "only the store opens ledger transactions",
        f"outside {STORE} (and {', '.join(TRANSACTIONS_EXEMPT)}) no product module calls an engine's begin() or "
        "connect(): it asks JobStore or one of its named parts",
        transactions_outside_the_store,
    ),
)


# -- the verdict -------------------------------------------------------------------------------


@dataclass
class Verdict:
    contract: Contract
    known: list[Violation] = field(default_factory=list)
    new: list[Violation] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.new


@dataclass
class Report:
    verdicts: list[Verdict]
    stale: list[str]
    """Exceptions that no contract's check met: the code was fixed; remove their lines."""

    @property
    def holds(self) -> bool:
        return all(v.holds for v in self.verdicts) and not self.stale

    @property
    def known(self) -> int:
        return sum(len(v.known) for v in self.verdicts)


def check(checkout: Checkout | None = None, exceptions: dict[str, str] | None = None) -> Report:
    """Every contract of :data:`CONTRACTS` on ``checkout`` (the repository's by default)."""
    checkout = checkout or Checkout()
    exceptions = KNOWN_EXCEPTIONS if exceptions is None else exceptions
    verdicts, met = [], set()
    for contract in CONTRACTS:
        verdict = Verdict(contract)
        for violation in contract.check(checkout):
            (verdict.known if violation.key in exceptions else verdict.new).append(violation)
            met.add(violation.key)
        verdicts.append(verdict)
    return Report(verdicts, [key for key in exceptions if key not in met])


def render(report: Report) -> str:
    lines = ["The rooms, top to bottom (a room imports only the layers below it, never a sibling):", ""]
    width = max(len(room.name) for layer in LAYERS for room in layer.rooms)
    for number, layer in enumerate(LAYERS, 1):
        lines.append(f"  {number}. {layer.name}")
        for room in layer.rooms:
            lines.append(f"     {room.name:<{width}}  {room.why}")
            lines.append(f"     {'':<{width}}  {' '.join(room.paths)}")
    lines += ["", "The contracts:", ""]
    for verdict in report.verdicts:
        state = "BROKEN" if not verdict.holds else "holds"
        if verdict.known:
            state += f", with {len(verdict.known)} known exception{'s' if len(verdict.known) > 1 else ''}"
        lines.append(f"  {verdict.contract.name}: {state}")
        lines.append(f"      {verdict.contract.rule}")
        for v in verdict.known:
            lines.append(f"      known: {v.key}  ({KNOWN_EXCEPTIONS.get(v.key, v.detail)})")
        for v in verdict.new:
            lines.append(f"      NEW:   {v.key}  ({v.detail})")
    for key in report.stale:
        lines.append(f"  STALE exception (no longer occurs; remove it from KNOWN_EXCEPTIONS): {key}")
    lines.append("")
    broken = [v.contract.name for v in report.verdicts if not v.holds]
    if report.holds:
        lines.append(f"All {len(report.verdicts)} contracts hold, with {report.known} known exceptions (listed).")
    else:
        what = [f"broken: {', '.join(broken)}"] if broken else []
        what += [f"{len(report.stale)} stale exception(s)"] if report.stale else []
        lines.append(f"FAILED ({'; '.join(what)}). New breaks: fix them, or name them in KNOWN_EXCEPTIONS with why.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage_tools.layout", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    report = check()
    print(render(report))
    return 0 if report.holds else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
