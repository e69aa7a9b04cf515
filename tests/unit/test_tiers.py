"""The test tiers of tests/conftest.py: every test module lives in one, and each tier is a package
(``make test`` and ``make test-all`` name the tiers' folders, so a module elsewhere would run in
neither)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TIERS

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_sits_in_a_tier() -> None:
    outside = [
        str(module.relative_to(TESTS))
        for module in sorted(TESTS.rglob("test_*.py"))
        if module.relative_to(TESTS).parts[0] not in TIERS
    ]
    assert outside == [], f"test modules outside the tiers {TIERS} (tests/conftest.py says where each goes)"


def test_every_tier_is_a_package_with_tests() -> None:
    for tier in TIERS:
        assert (TESTS / tier / "__init__.py").is_file(), tier
        assert any((TESTS / tier).rglob("test_*.py")), tier


def test_the_make_targets_name_every_tier() -> None:
    makefile = (TESTS.parent / "Makefile").read_text()
    for tier in TIERS:
        assert f"tests/{tier}" in makefile, tier
