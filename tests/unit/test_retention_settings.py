"""The retention an operator sets: defaults, floors, and the JSON form of the Variable."""

from __future__ import annotations

import pytest

from triage.settings import Retention, retention


def test_defaults_keep_what_reconciliation_and_review_read() -> None:
    default = Retention()
    assert default.outbox == 7
    assert default.job_events == 30
    for name, floor in Retention.FLOORS.items():
        assert getattr(default, name) >= floor, name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, Retention(), id="unset"),
        pytest.param("", Retention(), id="empty"),
        pytest.param('{"outbox": 3}', Retention(outbox=3), id="one-kind"),
        pytest.param('{"payloads": null}', Retention(payloads=None), id="forever"),
        pytest.param({"reports": 2.5}, Retention(reports=2.5), id="mapping"),
    ],
)
def test_parse(text: object, expected: Retention) -> None:
    assert Retention.parse(text) == expected  # type: ignore[arg-type]  # any value on purpose: parse refuses what is not a setting


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"outbox": 1}', id="outbox-under-the-consistency-window"),
        pytest.param('{"job_events": 7}', id="log-under-the-report-window"),
        pytest.param('{"reports": 0}', id="zero"),
        pytest.param('{"payloads": -1}', id="negative"),
        pytest.param('{"payloads": "30"}', id="a-string"),
        pytest.param('{"jobs": 30}', id="unknown-kind"),
        pytest.param("[7]", id="not-an-object"),
        pytest.param('{"partitions_ahead": 0}', id="no-partitions-ahead"),
    ],
)
def test_refuses_what_would_remove_too_much(text: str) -> None:
    with pytest.raises(ValueError, match=r"retention|partitions_ahead"):
        Retention.parse(text)


def test_environment_when_not_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_RETENTION", '{"event_files": 3}')
    assert retention().event_files == 3
    assert retention('{"event_files": 5}').event_files == 5
