"""mypy holds for everything ``[tool.mypy]`` in pyproject.toml names: the product, the tools, the
DAGs, the tests and the benches, every def annotated and every body checked. Here so that
``make test`` (and so CI) runs it: a type error fails the suite like a failing assertion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean_over_the_configured_files() -> None:
    # The incremental cache (.mypy_cache, ignored by git) makes a warm run a few seconds; a clean
    # clone pays ~20 CPU seconds once (docs/running.md).
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", "--no-error-summary"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
