"""The classify task's retry policy: an outage with the model's ``Retry-After`` is retried then;
everything else gets the task's standard retry (no database)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk import RetryAction
from airflow.sdk.exceptions import AirflowException

from triage.classifiers.llm import retry_after
from triage.operators.retry import OUTAGE_RETRY_POLICY, DependencyOutage
from triage.pipeline.classify import MAX_RETRY_AFTER_SECONDS, bounded_retry_after


def test_an_outage_with_retry_after_is_retried_after_it() -> None:
    decision = OUTAGE_RETRY_POLICY.evaluate(DependencyOutage("down", dependency="model", retry_after=120.0), 1, 4)
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, timedelta(seconds=120))
    assert decision.reason is not None
    assert "outage:model" in decision.reason


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(DependencyOutage("down", dependency="payload_store", retry_after=None), id="outage-no-hint"),
        pytest.param(AirflowException("work remains"), id="work-remains"),
        pytest.param(ValueError("bug"), id="anything-else"),
    ],
)
def test_anything_else_gets_the_standard_retry(exc: BaseException) -> None:
    assert OUTAGE_RETRY_POLICY.evaluate(exc, 1, 4).action == RetryAction.DEFAULT


@pytest.mark.parametrize(
    ("given", "bounded"),
    [
        pytest.param(None, None, id="none"),
        pytest.param(-5.0, 0.0, id="negative"),
        pytest.param(30.0, 30.0, id="as-is"),
        pytest.param(1e9, MAX_RETRY_AFTER_SECONDS, id="capped"),
    ],
)
def test_retry_after_is_bounded(given: float | None, bounded: float | None) -> None:
    assert bounded_retry_after(given) == bounded


def test_retry_after_reads_seconds_and_http_dates() -> None:
    import httpx

    assert retry_after(httpx.Response(503, headers={"Retry-After": "17"})) == 17.0
    assert retry_after(httpx.Response(503)) is None
    assert retry_after(httpx.Response(503, headers={"Retry-After": "soon"})) is None
    assert retry_after(httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
