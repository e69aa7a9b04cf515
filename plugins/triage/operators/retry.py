"""How Triage's tasks are retried: every DAG's ``default_args`` (:func:`default_args`) and the
classify task's retry policy (Airflow 3.3's ``retry_policy``): how long Airflow waits before
retrying a try that stopped on a dependency outage.

The retry-or-fail decision stays where it was (the operator raises ``AirflowException`` to
retry, ``AirflowFailException`` not to): a policy would only restate it. What a policy states
more clearly than the task's fixed ``retry_delay`` is the one delay that depends on the failure:
when the model said how long it will be down (``Retry-After``), the retry comes then, not at
the exponential backoff's next step, and the task instance records why.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import RetryDecision, RetryPolicy
from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from airflow.sdk import Context


def default_args(
    *, retries: int, max_retry_delay: timedelta, retry_delay: timedelta = timedelta(seconds=30), **more: Any
) -> dict[str, Any]:
    """A Triage DAG's ``default_args`` (a new dict each call): owned by ``triage``, ``retries``
    retries with exponential backoff (factor 2) from ``retry_delay`` up to ``max_retry_delay``.

    :param more: the DAG's other task defaults (``execution_timeout``, ``on_failure_callback``)."""
    return {
        "owner": "triage",
        "retries": retries,
        "retry_delay": retry_delay,
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": max_retry_delay,
        **more,
    }


class DependencyOutage(AirflowException):
    """The try stopped because a dependency is down; its batch's unfinished jobs are parked.

    :param dependency: ``model``, ``payload_store`` or ``label_provider``.
    :param retry_after: the model's ``Retry-After`` in seconds, bounded; None if it gave none.
    """

    def __init__(self, message: str, *, dependency: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.dependency, self.retry_after = dependency, retry_after


class OutageRetryPolicy(RetryPolicy):
    """Retry a :class:`DependencyOutage` after the model's ``Retry-After`` when it gave one;
    anything else, and an outage without one, gets the task's standard retry (exponential
    backoff). It never adds a try: Airflow caps a policy's retries at the task's ``retries``."""

    def evaluate(
        self, exception: BaseException, try_number: int, max_tries: int, context: Context | None = None
    ) -> RetryDecision:
        if isinstance(exception, DependencyOutage) and exception.retry_after is not None:
            return RetryDecision.retry(
                timedelta(seconds=exception.retry_after),
                reason=f"outage:{exception.dependency}: Retry-After {exception.retry_after:.0f}s",
            )
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {"policy": "triage.operators.retry.OutageRetryPolicy"}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> OutageRetryPolicy:
        return cls()


OUTAGE_RETRY_POLICY = OutageRetryPolicy()
