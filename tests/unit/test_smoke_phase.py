"""``make test-all``'s CPython 3.13 smoke phase (Makefile, ``SMOKE``): what it runs, and what it does
where no 3.13 is to be found."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAMP = ".venv/.installed"  # never remade by these tests (make -o): the suite runs in that venv
SLOW = re.compile(r"^(@pytest\.mark\.slow|pytestmark = .*pytest\.mark\.slow)", re.M)
MAKE_ENV = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}


def make(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``make ARGS`` in the checkout, as a user types it: not as a sub-make of the ``make test``
    that may be running this test (its MAKEFLAGS would carry the smoke's own VENV and PYTHON),
    nor with a ``make test SMOKE_...=`` of the user's in the environment."""
    env = {
        k: v for k, v in (os.environ if env is None else env).items() if k not in MAKE_ENV and not k.startswith("SMOKE")
    }
    return subprocess.run(
        ["make", "--no-print-directory", "-o", STAMP, *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def smoke_tests() -> list[str]:
    printed = make("-s", "-f", "Makefile", "-f", "-", "print-smoke", stdin="print-smoke:\n\t@echo $(SMOKE_TESTS)\n")
    assert printed.returncode == 0, printed.stderr
    return printed.stdout.split()


def test_the_smoke_names_fast_tests_that_exist() -> None:
    """A path that does not exist would fail the phase on every machine; a slow module would run
    its Airflow deployment twice in one make test."""
    paths = smoke_tests()
    assert "tests/unit" in paths
    assert "tests/airflow/test_classify_documents_e2e.py" in paths
    for path in paths:
        assert (ROOT / path).exists(), path
        modules = [ROOT / path] if path.endswith(".py") else sorted((ROOT / path).rglob("test_*.py"))
        for module in modules:
            assert not SLOW.search(module.read_text()), module


def without_python_3_13(**extra: str) -> dict[str, str]:
    """An environment where neither pyenv nor PATH has a python3.13."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # make() leaves out SMOKE_PYTHON
    env.update(PYENV_ROOT=str(ROOT / "no-such-pyenv"), PATH="/usr/bin:/bin", **extra)
    return env


def venv_is_3_13() -> bool:
    """Whether .venv itself is CPython 3.13 (``make test PYTHON=python3.13``): then the smoke
    has nothing to add, whatever else the machine has."""
    probe = "import sys; print(*sys.version_info[:2], sep='.')"
    said = subprocess.run([ROOT / ".venv/bin/python", "-c", probe], capture_output=True, text=True, check=True)
    return said.stdout.strip() == "3.13"


def test_without_a_python_3_13_the_phase_says_so_and_passes() -> None:
    done = make("test-smoke", env=without_python_3_13())
    assert done.returncode == 0, done.stdout + done.stderr
    if venv_is_3_13():
        assert done.stdout == "make test-smoke: .venv is CPython 3.13 already: nothing to add\n"
    else:
        assert "no CPython 3.13 here: the smoke phase is left out" in done.stdout


def test_without_a_python_3_13_ci_fails() -> None:
    done = make("test-smoke", env=without_python_3_13(CI="true"))
    if venv_is_3_13():
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == "make test-smoke: .venv is CPython 3.13 already: nothing to add\n"
    else:
        assert done.returncode != 0
        assert "FAILED: no CPython 3.13 here" in done.stdout


def test_make_n_test_runs_nothing() -> None:
    """make runs a recipe line that names ``$(MAKE)`` even under ``-n``; ``test`` is one line, so
    ``make -n test`` (the README's check runs it) started the whole suite again, inside itself."""
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test", "test-all", "test-drills", "test-smoke"):  # first: the make -n below would run a broken one
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert recipe is not None, target
        assert not re.search(r"\$[({]MAKE[)}]", recipe.group(1)), target
    done = make("-n", "test", "test-all", "test-drills", "test-smoke", "SMOKE_PYTHON=/bin/false")
    assert done.returncode == 0, done.stderr
    assert "tests/e2e" in done.stdout
    assert "tests/drills" in done.stdout
    assert "smoke-tests" in done.stdout
