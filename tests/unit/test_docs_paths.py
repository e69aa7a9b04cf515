"""The docs name only what the repository holds (issue #26, item 5).

README.md, CHANGELOG.md, docs/*.md and docs/adr/*.md point readers at files, folders and
modules. When code moves, a doc that still names the old place sends the next engineer to
nothing; this test fails instead. It checks five forms:

- a repository path: ``plugins/triage/jobs/``, ``tests/unit/test_layout.py``, ``dags/…``,
  ``triage_tools/…``, ``bench/…``, ``docs/…``, ``include/…``, ``deploy/…``, ``docker/…``,
  ``.ci/…`` and the top-level files a reader is sent to (``Makefile``, ``DESIGN.md``, …);
- a relative Markdown link, ``[events](events.md)``, resolved from the document's folder, and
  its ``#anchor``, which must be a heading of the linked file;
- a file name alone in single backticks (``store.py``, ``test_layout.py``): some file of the
  repository has that name (where, the surrounding text says; a file renamed or removed fails);
- a dotted module of the product or the tools, ``triage.jobs.store`` or
  ``triage_tools.layout.KNOWN_EXCEPTIONS``: its modules must exist, and a name after the last
  module must occur in that module's source (a function, class or constant it defines).

Paths a command writes (``bench/results/latest.json``) are listed in :data:`WRITTEN_BY_COMMANDS`,
other names that only look like the repository's in :data:`NOT_PATHS`, :data:`NOT_MODULES` and
:data:`NOT_REPOSITORY_FILES`; a placeholder in capitals (``tests/dags/MODULE.py``) is not a path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DOCUMENTS = sorted(
    p
    for p in [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "docs/adr").glob("*.md"),
    ]
    if p.exists()
)

# Ignored by git (.gitignore): made by the command named beside each.
WRITTEN_BY_COMMANDS = {
    "bench/results/latest.json": "make bench",
    "bench/results/intake-latency.json": "make bench-intake",
}

# Spelled like a path, and not one.
NOT_PATHS = {
    "docs/s": "documents per second",
    "docs/cpu-s": "documents per CPU-second",
    "deploy/triage-scheduler": "a Kubernetes deployment, as kubectl names it",
}

# File names in backticks that are not files of the repository, and what they are.
NOT_REPOSITORY_FILES = {
    **{Path(path).name: command for path, command in WRITTEN_BY_COMMANDS.items()},
    "report.json": "the failure drill's report, under $TRIAGE_HOME/chaos",
    "values.schema.json": "the Airflow Helm chart's own schema (a copy is tests/data/helm/)",
}

TOP_FOLDERS = ("plugins", "tests", "dags", "triage_tools", "bench", "docs", "include", "deploy", "docker", ".ci")
TOP_FILES = (
    "Makefile",
    "Dockerfile",
    "DESIGN.md",
    "README.md",
    "CHANGELOG.md",
    "pyproject.toml",
    "constraints.txt",
    "requirements.txt",
    "requirements-dev.txt",
    "docker-compose.yaml",
    "airflow_settings.yaml",
    "airflow.sh",
)

# A path starts at a word boundary that is not part of a longer path or URL (no letter, slash,
# dot, hyphen or colon before it) and runs over path characters.
_BEFORE = r"(?<![\w/.:~$-])"
PATH = re.compile(
    _BEFORE
    + r"((?:"
    + "|".join(re.escape(f) for f in TOP_FOLDERS)
    + r")/[\w./*-]*|(?:"
    + "|".join(re.escape(f) for f in TOP_FILES)
    + r")(?![\w.-]))"
)
BARE_NAME = re.compile(r"`([\w.-]+\.(?:py|md|yaml|yml|toml|txt|json|sh|cfg|ini))`")
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
MODULE = re.compile(_BEFORE + r"((?:triage|triage_tools)(?:\.[A-Za-z_]\w*)+)")
PLACEHOLDER = re.compile(r"[A-Z]{2,}")


def repository_paths(text: str) -> set[str]:
    """The repository paths a document names, trailing punctuation and anchors cut."""
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).split("#", 1)[0].rstrip(".,;:")
        if PLACEHOLDER.search(path.split("/")[-1]) and path.split("/")[-1] not in TOP_FILES:
            continue  # tests/dags/MODULE.py, docs/adr/NNNN-*.md: a pattern, not a file
        if "*" in path:
            if not list(ROOT.glob(path)):
                found.add(path)  # a glob must match something; reported as missing below
            continue
        found.add(path)
    return found


def _file_names() -> frozenset[str]:
    """The name of every file of the checkout (not of its virtualenvs, caches or local state)."""
    names = set()
    for _folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_FOLDERS and not d.startswith(".venv")]
        names.update(files)
    return frozenset(names)


SKIPPED_FOLDERS = {".git", ".triage", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
FILE_NAMES = _file_names()


def path_exists(path: str) -> bool:
    return path in WRITTEN_BY_COMMANDS or path in NOT_PATHS or (ROOT / path).exists()


def _source_text() -> str:
    """Every Python source of the product, the tools and the DAGs, in one string."""
    files = [*(ROOT / "plugins").rglob("*.py"), *(ROOT / "triage_tools").rglob("*.py"), *(ROOT / "dags").rglob("*.py")]
    return "\n".join(f.read_text(encoding="utf-8") for f in sorted(files))


SOURCE = _source_text()


# The ledger's tables (schema ``triage``): ``triage.outbox_claims`` names a table, not a module.
TABLES = frozenset(re.findall(r"(?:Table|create_table)\(\s*\"(\w+)\"", SOURCE, flags=re.MULTILINE))

# Spelled like a module, and not one.
NOT_MODULES = {"triage.dump": "the file pg_dump writes in docs/operations.md"}


def module_exists(dotted: str) -> bool:
    """``triage.a.b.name``: the modules and packages exist, a trailing name occurs in the last one.

    ``triage.`` also prefixes the ledger's tables (schema ``triage``) and the metrics: a dotted
    name the code spells out verbatim (``triage.review.open``, a metric; or a module the code
    imports) exists, and so does ``triage.TABLE`` or ``triage.TABLE.column``."""
    if dotted in NOT_MODULES or _spelled_in_source(dotted):
        return True
    parts = dotted.split(".")
    base = ROOT / "plugins" / "triage" if parts[0] == "triage" else ROOT / "triage_tools"
    if not ((base / parts[1]).is_dir() or (base / f"{parts[1]}.py").exists()):
        # Not a room or module of the code: a table, or a metric with a tag (its prefix spelled).
        return parts[1] in TABLES or any(_spelled_in_source(".".join(parts[:n])) for n in range(2, len(parts)))
    module = base / "__init__.py"
    for index, part in enumerate(parts[1:], start=1):
        if (base / part).is_dir() and (base / part / "__init__.py").exists():
            base, module = base / part, base / part / "__init__.py"
            continue
        if (base / f"{part}.py").exists():
            module = base / f"{part}.py"
            rest = parts[index + 1 :]
            return not rest or re.search(rf"\b{re.escape(rest[0])}\b", module.read_text(encoding="utf-8")) is not None
        # Not a module: a name the last module (or package __init__) defines or imports.
        return re.search(rf"\b{re.escape(part)}\b", module.read_text(encoding="utf-8")) is not None
    return True


def _spelled_in_source(dotted: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(dotted)}(?!\w)", SOURCE) is not None


def missing_in(document: Path) -> list[str]:
    text = document.read_text(encoding="utf-8")
    missing = [f"path {p}" for p in sorted(repository_paths(text)) if not path_exists(p)]
    missing += [
        f"file {name}"
        for name in sorted(set(BARE_NAME.findall(text)))
        if name not in FILE_NAMES and name not in NOT_REPOSITORY_FILES
    ]
    for target, anchor in sorted(set(LINK.findall(text))):
        if "://" in target or target.startswith("mailto:"):
            continue
        linked = document.parent / target if target else document
        if not linked.exists():
            missing.append(f"link {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            missing.append(f"link {target}#{anchor}")
    for dotted in sorted(set(MODULE.findall(text))):
        if not module_exists(dotted.rstrip(".")):
            missing.append(f"module {dotted}")
    return missing


def anchors(document: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped,
    spaces as hyphens (``## Airflow's view: a user`` is ``#airflows-view-a-user``)."""
    found = set()
    for line in document.read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"#{1,6}\s+(.*)", line):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_document_names_only_what_the_repository_holds(document: Path) -> None:
    assert missing_in(document) == []


def test_the_check_finds_what_is_not_there(tmp_path: Path) -> None:
    """The scanner itself: each form is found, and a missing one is reported (a check that
    matched nothing would pass every document)."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "See `plugins/triage/jobs/` and tests/unit/test_layout.py, [the ADRs](adr/) and\n"
        "`triage.jobs.store.JobStore`, `triage_tools.layout.KNOWN_EXCEPTIONS`; but not\n"
        "plugins/triage/nowhere.py, `triage.jobs.nowhere`, `triage.jobs.store.NoSuchName`,\n"
        "[gone](gone.md) or https://example.org/plugins/triage/x.py (a URL), tests/dags/MODULE.py.\n"
        "## A heading: here\n[here](#a-heading-here), [there](#no-such-heading)\n"
        "`store.py` is a file, `nowhere_at_all.py` is not.\n",
        encoding="utf-8",
    )
    (tmp_path / "adr").mkdir()
    assert missing_in(doc) == [
        "path plugins/triage/nowhere.py",
        "file nowhere_at_all.py",
        "link #no-such-heading",
        "link gone.md",
        "module triage.jobs.nowhere",
        "module triage.jobs.store.NoSuchName",
    ]


def test_every_document_is_scanned() -> None:
    names = {str(p.relative_to(ROOT)) for p in DOCUMENTS}
    assert {"README.md", "docs/architecture.md", "docs/performance.md"} <= names
    assert any(name.startswith("docs/adr/") for name in names)
