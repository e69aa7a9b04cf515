"""What a trigger form may ask for: an inbox only inside the deployment's roots (checked on the
resolved path, on real folders and symlinks), and a drill only where the deployment allows it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triage import settings
from triage.contracts.drill import DrillSettings
from triage.contracts.run_config import (
    ClassifyRunConfig,
    DrillNotAllowed,
    InboxNotAllowed,
    RunNotAllowed,
    check_drill,
)
from triage.settings import project_root
from triage.sources.inbox_roots import confine_inbox

URL_ROOTS = ("s3://bucket/inbox", "memory://inbox")


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """``base/`` (the project), ``base/inbox/2026-11-01`` (the root), ``secret/`` beside it, a
    sibling ``base/inbox-evil``, and symlinks in the root: one inside, one out."""
    base = tmp_path / "base"
    (base / "inbox" / "2026-11-01").mkdir(parents=True)
    (base / "inbox-evil").mkdir()
    (tmp_path / "secret").mkdir()
    (base / "inbox" / "inside").symlink_to(base / "inbox" / "2026-11-01")
    (base / "inbox" / "escape").symlink_to(tmp_path / "secret")
    (base / "inbox" / "loop").symlink_to(base / "inbox" / "loop")
    return base


def roots(base: Path) -> tuple[str, ...]:
    return ("inbox", *URL_ROOTS)


@pytest.mark.parametrize(
    ("inbox", "expected"),
    [
        pytest.param("inbox", "inbox", id="the-root-relative"),
        pytest.param("{base}/inbox", "inbox", id="the-root-absolute"),
        pytest.param("inbox/2026-11-01", "inbox/2026-11-01", id="under-the-root"),
        pytest.param("inbox/2026-11-01/../2026-11-01", "inbox/2026-11-01", id="dotdot-staying-inside"),
        pytest.param("inbox/inside", "inbox/2026-11-01", id="symlink-inside"),
        pytest.param("inbox/not-yet-there", "inbox/not-yet-there", id="missing-folder-inside"),
        pytest.param("file://{base}/inbox", "inbox", id="file-url"),
    ],
)
def test_an_inbox_inside_a_root_is_read_where_it_resolves(layout: Path, inbox: str, expected: str) -> None:
    confined = confine_inbox(inbox.format(base=layout), roots(layout), base=layout)

    assert confined == Path(os.path.realpath(layout / expected))


@pytest.mark.parametrize(
    "inbox",
    [
        pytest.param("../secret", id="dotdot-out"),
        pytest.param("inbox/../../secret", id="dotdot-through-the-root"),
        pytest.param("inbox/2026-11-01/../../../secret", id="dotdot-deep"),
        pytest.param("{tmp}/secret", id="absolute-elsewhere"),
        pytest.param("/etc", id="etc"),
        pytest.param("/", id="filesystem-root"),
        pytest.param("", id="empty-is-the-project"),
        pytest.param(".", id="the-project"),
        pytest.param("inbox-evil", id="sibling-with-the-root-as-prefix"),
        pytest.param("inbox/escape", id="symlink-out-of-the-root"),
        pytest.param("inbox/escape/anything", id="under-a-symlink-out"),
        pytest.param("inbox/loop", id="symlink-loop"),
        pytest.param("inbox/\x00", id="nul-byte"),
        pytest.param("file:///etc", id="file-url-elsewhere"),
        pytest.param("file://evil.example/{base}/inbox", id="file-url-with-a-host"),
        pytest.param("file:/etc", id="single-slash-file-url"),
        pytest.param("http://169.254.169.254/latest/meta-data", id="http-url"),
        pytest.param("https://intranet.example/inbox", id="https-url"),
        pytest.param("s3://other-bucket/inbox", id="other-bucket"),
        pytest.param("s3://bucket/inbox-evil", id="url-sibling-prefix"),
        pytest.param("s3://bucket/inbox/../secret", id="url-dotdot"),
        pytest.param("s3://bucket/inbox/%2e%2e/secret", id="url-percent-dotdot"),
        pytest.param("s3://bucket/inbox//x", id="url-empty-segment"),
        pytest.param("s3://bucket/inbox?versionId=1", id="url-query"),
        pytest.param("s3://bucket/inbox#x", id="url-fragment"),
        pytest.param("s3://bucket/inbox\\..\\secret", id="url-backslash"),
        pytest.param("gcs://bucket/inbox", id="unconfigured-scheme"),
        pytest.param("s3://bucket@evil/inbox", id="url-userinfo"),
    ],
)
def test_an_inbox_outside_every_root_is_refused_naming_the_roots(layout: Path, inbox: str) -> None:
    with pytest.raises(InboxNotAllowed) as caught:
        confine_inbox(inbox.format(base=layout, tmp=layout.parent), roots(layout), base=layout)

    message = str(caught.value)
    assert "refused" in message or "outside" in message
    assert "allowed: inbox, s3://bucket/inbox, memory://inbox (TRIAGE_INBOX_ROOTS)" in message
    assert str(layout.parent / "secret") not in message or "secret" in inbox  # never where a symlink led
    assert isinstance(caught.value, RunNotAllowed)


@pytest.mark.parametrize(
    ("inbox", "expected"),
    [
        pytest.param("s3://bucket/inbox", "s3://bucket/inbox", id="the-root"),
        pytest.param("s3://bucket/inbox/", "s3://bucket/inbox", id="trailing-slash"),
        pytest.param("S3://bucket/inbox/2026", "s3://bucket/inbox/2026", id="scheme-case"),
        pytest.param("memory://inbox/x", "memory://inbox/x", id="memory"),
    ],
)
def test_a_url_under_a_url_root_is_accepted(layout: Path, inbox: str, expected: str) -> None:
    assert confine_inbox(inbox, roots(layout), base=layout) == expected


def test_no_roots_refuses_every_inbox(layout: Path) -> None:
    with pytest.raises(InboxNotAllowed, match="no inbox roots"):
        confine_inbox("inbox", (), base=layout)


def test_the_default_roots_hold_the_default_inbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(settings.ENV_INBOX_ROOTS, raising=False)
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path))

    defaults = settings.inbox_roots()

    assert defaults == (str(project_root() / "include" / "sample_inbox"), str(tmp_path / "inbox"))
    default_inbox = ClassifyRunConfig().inbox
    assert confine_inbox(default_inbox, defaults, base=project_root()) == (project_root() / default_inbox).resolve()
    assert confine_inbox(str(tmp_path / "inbox" / "x"), defaults, base=project_root()) == tmp_path / "inbox" / "x"
    with pytest.raises(InboxNotAllowed):
        confine_inbox("dags", defaults, base=project_root())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(" /a , s3://b/c ,,", ("/a", "s3://b/c"), id="comma-separated"),
        pytest.param("", (), id="set-and-empty-is-none"),
    ],
)
def test_inbox_roots_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv(settings.ENV_INBOX_ROOTS, value)
    assert settings.inbox_roots() == expected


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        pytest.param(None, False, id="unset"),
        pytest.param("", False, id="empty"),
        pytest.param("0", False, id="zero"),
        pytest.param("no", False, id="no"),
        pytest.param("1", True, id="one"),
        pytest.param(" TRUE ", True, id="true"),
        pytest.param("yes", True, id="yes"),
    ],
)
def test_drills_are_allowed_only_where_the_environment_says_so(
    monkeypatch: pytest.MonkeyPatch, value: str | None, allowed: bool
) -> None:
    if value is None:
        monkeypatch.delenv(settings.ENV_ALLOW_DRILL, raising=False)
    else:
        monkeypatch.setenv(settings.ENV_ALLOW_DRILL, value)
    assert settings.drill_allowed() is allowed


@pytest.mark.parametrize(
    "drill",
    [
        pytest.param({"transient_error_rate": 0.1}, id="transient"),
        pytest.param({"permanent_error_rate": 0.01}, id="permanent"),
        pytest.param({"inconclusive_rate": 1.0}, id="inconclusive"),
        pytest.param({"duplicate_rate": 0.5}, id="duplicates"),
    ],
)
def test_a_drill_is_refused_when_disabled_and_accepted_when_enabled(drill: dict[str, float]) -> None:
    config = ClassifyRunConfig(drill=DrillSettings.model_validate(drill))

    with pytest.raises(DrillNotAllowed, match="TRIAGE_ALLOW_DRILL"):
        check_drill(config, allowed=False)
    check_drill(config, allowed=True)


@pytest.mark.parametrize(
    "drill",
    [pytest.param({}, id="no-drill"), pytest.param({"seed": 7}, id="seed-only: it only picks synthetic documents")],
)
def test_no_drill_is_never_refused(drill: dict[str, int]) -> None:
    check_drill(ClassifyRunConfig(drill=DrillSettings.model_validate(drill)), allowed=False)
