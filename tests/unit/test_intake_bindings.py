"""Intake's source bindings as configuration (``triage.web.intake_bindings``): what a binding text
means, which texts are refused, and the roles an auth manager's user object holds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from triage.web.intake_bindings import RESERVED_SOURCES, BindingError, parse, roles_of


def test_pull_sources_names_are_reserved() -> None:
    assert {"synthetic", "jsonl", "test"} <= RESERVED_SOURCES


@pytest.mark.parametrize(
    ("source", "user", "roles", "refused"),
    [
        pytest.param("helpdesk", "bot", (), None, id="bound-user"),
        pytest.param(
            "helpdesk", "alice", ("crm",), "alice may not post documents for source helpdesk", id="other-user"
        ),
        pytest.param("crm", "alice", ("crm",), None, id="bound-role"),
        pytest.param("crm", "crm", (), "crm may not post", id="a-user-named-like-the-role"),
        pytest.param("billing", "bot", (), "no caller is bound to source billing", id="unbound-source"),
        pytest.param("jsonl", "bot", (), "pull source", id="reserved"),
        pytest.param("erp", "bot", (), "pull source", id="reserved-extra"),
    ],
)
def test_a_binding_says_who_may_post_for_what(
    source: str, user: str, roles: tuple[str, ...], refused: str | None
) -> None:
    bindings = parse('{"helpdesk": ["user:bot"], "crm": ["role:crm"]}', "erp")
    answer = bindings.refusal(source, user, roles)
    if refused is None:
        assert answer is None
    else:
        assert answer is not None
        assert refused in answer


def test_unbound_allows_any_unreserved_source() -> None:
    bindings = parse(None)
    assert bindings.refusal("helpdesk", "anyone", ()) is None
    assert bindings.refusal("test", "anyone", ("admin",)) is not None


@pytest.mark.parametrize(
    ("sources", "reserved"),
    [
        pytest.param("{", "", id="not-json"),
        pytest.param('{"a": ["group:x"]}', "", id="unknown-kind"),
        pytest.param('{"a": ["user:"]}', "", id="no-name"),
        pytest.param('{"synthetic": []}', "", id="binds-a-pull-source"),
        pytest.param('{"erp": ["user:x"]}', "erp", id="binds-a-reserved-extra"),
        pytest.param("", "Not A Name", id="bad-reserved-name"),
        # a source listed twice: json.loads keeps the last list, silently dropping the first's callers
        pytest.param('{"helpdesk": ["user:bot"], "helpdesk": ["user:alice"]}', "", id="a-source-twice"),
        # a name with a space never equals a user's or role's name: a binding that binds nobody
        pytest.param('{"crm": ["role: crm"]}', "", id="space-before-a-name"),
        pytest.param('{"crm": ["user:bot "]}', "", id="space-after-a-name"),
        pytest.param("[" * 100_000, "", id="nested-past-the-recursion-limit"),  # RecursionError, not ValueError
    ],
)
def test_an_unreadable_binding_is_an_error(sources: str, reserved: str) -> None:
    with pytest.raises(BindingError):
        parse(sources, reserved)


@dataclass
class Role:
    name: str


@dataclass
class FabLikeUser:
    roles: list[Role]


@dataclass
class SimpleLikeUser:
    role: str | None


def test_roles_of_reads_simple_and_fab_users() -> None:
    assert roles_of(SimpleLikeUser("user")) == {"user"}
    assert roles_of(SimpleLikeUser(None)) == frozenset()
    assert roles_of(FabLikeUser([Role("Viewer"), Role("crm_intake")])) == {"Viewer", "crm_intake"}
    assert roles_of(object()) == frozenset()


def test_an_unreadable_binding_does_not_repeat_its_entries() -> None:
    """The error reaches every intake caller in a 503: it says which source and what is wrong,
    never the configured user or role names (who else may post, and as whom)."""
    with pytest.raises(BindingError) as raised:
        parse('{"helpdesk": ["helpdesk-bot"]}')
    assert "helpdesk" in str(raised.value)
    assert "helpdesk-bot" not in str(raised.value)
