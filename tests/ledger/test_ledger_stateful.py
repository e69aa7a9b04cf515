"""Hypothesis drives several actors at one batch; no sequence of moves breaks an invariant."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LeaseLost, LedgerError, NotInReview, ReplayLimitReached
from triage.jobs.vocabulary.models import Claim, ClaimedJob, Complete, LabelWrite, Outcome, RetryLater, SendToReview

ACTORS = ("alice", "bob", "carol")
JOBS = 6


def test_no_sequence_of_moves_breaks_an_invariant(store: JobStore) -> None:
    class Ledger(RuleBasedStateMachine):
        @initialize()
        def setup(self) -> None:
            self.batch = f"stateful-{uuid.uuid4().hex[:8]}"
            store.register(new_jobs(JOBS, prefix=self.batch), batch_key=self.batch, step="classify", max_attempts=3)
            self.claims: dict[str, Claim] = {}
            self.fresh: dict[str, bool] = {}

        def q(self, sql: str) -> list[sa.Row]:
            with store.engine.connect() as conn:
                return list(conn.execute(sa.text(sql), {"b": self.batch}).all())

        def statuses(self, claim: Claim) -> dict[uuid.UUID, str]:
            with store.engine.connect() as conn:
                return dict(
                    conn.execute(
                        sa.text("SELECT id, status::text FROM triage.jobs WHERE id = ANY(:ids)"),
                        {"ids": [j.id for j in claim.jobs]},
                    )
                    .tuples()
                    .all()
                )

        @rule(actor=st.sampled_from(ACTORS), limit=st.integers(1, 3))
        def claim(self, actor: str, limit: int) -> None:
            got = store.claim(batch_key=self.batch, step="classify", limit=limit, lease_seconds=60, owner=actor)
            if got.jobs:
                self.claims[actor], self.fresh[actor] = got, True

        @rule(actor=st.sampled_from(ACTORS), kind=st.sampled_from(["complete", "retry", "review", "heartbeat"]))
        def act(self, actor: str, kind: str) -> None:
            claim = self.claims.get(actor)
            if claim is None:
                return
            before = self.statuses(claim)
            try:
                if kind == "heartbeat":
                    store.heartbeat(claim, lease_seconds=60)
                    return
                by_kind: dict[str, Callable[[ClaimedJob], Outcome]] = {
                    "complete": lambda j: Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v")),
                    "retry": lambda j: RetryLater(j.id, j.attempt, "timeout", delay_seconds=0),
                    "review": lambda j: SendToReview(j.id, j.attempt, "inconclusive"),
                }
                outcomes = by_kind[kind]
                store.record(claim, [outcomes(j) for j in claim.jobs])
            except LeaseLost:
                assert not self.fresh[actor], "a fresh lease was refused"
                assert self.statuses(claim) == before, "a refused write changed something"
            else:
                assert kind == "heartbeat" or self.fresh[actor], "a write under a stale lease was accepted"
            if kind != "heartbeat":
                del self.claims[actor]

        @rule(actor=st.sampled_from(ACTORS))
        def expire(self, actor: str) -> None:
            claim = self.claims.get(actor)
            if claim is None:
                return
            with store.engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE lease_token = :t"
                    ),
                    {"t": claim.token},
                )
            self.fresh[actor] = False

        @rule()
        def reconcile(self) -> None:
            store.release_expired_leases(max_rescues=2)

        @rule()
        def make_due(self) -> None:
            with store.engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE triage.jobs SET next_attempt_at = now() - interval '1 second'"
                        " WHERE batch_key = :b AND status = 'retryable_failed'"
                    ),
                    {"b": self.batch},
                )

        @precondition(lambda self: True)
        @rule(pick=st.integers(0, JOBS - 1))
        def requeue(self, pick: int) -> None:
            in_review = self.q(
                "SELECT id FROM triage.jobs WHERE batch_key = :b AND status = 'manual_review' ORDER BY id"
            )
            if not in_review:
                return
            with contextlib.suppress(ReplayLimitReached, NotInReview):
                store.review.resolve_with_requeue(in_review[pick % len(in_review)][0], actor="reviewer", max_replays=2)

        @invariant()
        def nothing_lost_or_doubled(self) -> None:
            assert self.q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b")[0][0] == JOBS

        @invariant()
        def no_attempt_claimed_twice(self) -> None:
            assert (
                self.q(
                    "SELECT e.job_id, e.attempt FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
                    " WHERE j.batch_key = :b AND e.to_status = 'running' AND j.replays = 0"
                    " GROUP BY 1, 2 HAVING count(*) > 1"
                )
                == []
            )

        @invariant()
        def review_rows_match_review_state(self) -> None:
            assert (
                self.q(
                    "SELECT j.id FROM triage.jobs j LEFT JOIN triage.manual_review r"
                    " ON r.job_id = j.id AND r.resolved_at IS NULL WHERE j.batch_key = :b"
                    " GROUP BY j.id, j.status HAVING count(r.id) <> (j.status = 'manual_review')::int"
                )
                == []
            )

        @invariant()
        def completions_have_one_label_and_one_event(self) -> None:
            completed, events, labels, outbox = self.q(
                "SELECT count(*) FILTER (WHERE j.status = 'completed'),"
                " (SELECT count(*) FROM triage.job_events e JOIN triage.jobs x ON x.id = e.job_id"
                "   WHERE x.batch_key = :b AND e.to_status = 'completed'),"
                " (SELECT count(*) FROM triage.document_labels l JOIN triage.jobs x ON x.id = l.job_id"
                "   WHERE x.batch_key = :b),"
                " (SELECT count(*) FROM triage.outbox o JOIN triage.jobs x ON x.id = o.job_id"
                "   WHERE x.batch_key = :b AND o.event_type = 'job.completed')"
                " FROM triage.jobs j WHERE j.batch_key = :b"
            )[0]
            assert completed == events == labels == outbox

        @invariant()
        def settled_jobs_hold_no_lease(self) -> None:
            assert (
                self.q(
                    "SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status <> 'running'"
                    " AND lease_token IS NOT NULL"
                )[0][0]
                == 0
            )

    run_state_machine_as_test(
        Ledger,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    assert issubclass(LeaseLost, LedgerError)
