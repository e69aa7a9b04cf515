"""Fixtures shared by the integration modules that classify through the fake model server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, fixed_label
from triage.payloads import PayloadStore


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """The fake model server on loopback, answering ``billing`` at 0.92 until told otherwise."""
    with FakeOpenAIServer(responder=fixed_label("billing", 0.92)) as fake:
        yield fake


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")
