"""The ledger's vocabulary is declared once (``triage.jobs.vocabulary.states``) and every other layer that
names it agrees: the event contract's literal, the groups of states, the report's order of the
stuck checks. The database's enum and transitions are compared in tests/ledger."""

from __future__ import annotations

from typing import get_args

import pytest

from triage.contracts.events import EventType as ContractEventType
from triage.jobs.vocabulary.states import (
    CLAIMABLE,
    OPEN,
    SETTLED,
    TERMINAL,
    UNFINISHED,
    UNLEASED,
    EventType,
    JobStatus,
    Step,
)
from triage.reconciliation.rules import STUCK_STATES

S = JobStatus


def test_the_event_types_are_the_contract_s() -> None:
    assert sorted(get_args(ContractEventType)) == sorted(e.value for e in EventType)


def test_the_stuck_checks_cover_every_unfinished_state_once() -> None:
    assert len(STUCK_STATES) == len(set(STUCK_STATES))
    assert set(STUCK_STATES) == UNFINISHED


@pytest.mark.parametrize(
    ("group", "members"),
    [
        pytest.param(TERMINAL, {S.COMPLETED, S.TERMINAL_FAILED}, id="terminal"),
        pytest.param(SETTLED, {S.COMPLETED, S.MANUAL_REVIEW, S.TERMINAL_FAILED}, id="settled"),
        pytest.param(UNFINISHED, {S.RECEIVED, S.QUEUED, S.RUNNING, S.WAITING, S.RETRYABLE_FAILED}, id="unfinished"),
        pytest.param(UNLEASED, {S.RECEIVED, S.QUEUED, S.WAITING, S.RETRYABLE_FAILED}, id="unleased"),
        pytest.param(OPEN, set(S) - {S.COMPLETED, S.TERMINAL_FAILED}, id="open"),
        pytest.param(CLAIMABLE, {S.QUEUED, S.RETRYABLE_FAILED}, id="claimable"),
    ],
)
def test_each_group_holds_what_its_name_says(group: frozenset[JobStatus], members: set[JobStatus]) -> None:
    assert group == members


def test_steps_and_event_types_are_their_database_values() -> None:
    assert [s.value for s in Step] == ["classify", "persist"]
    assert f"{Step.PERSIST}" == "persist"  # log lines and metric names use the value
    assert EventType.COMPLETED == "job.completed"
