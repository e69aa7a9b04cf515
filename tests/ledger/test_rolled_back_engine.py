"""The ledger tier's default engine (tests/ledger/conftest.py): the product's transactions are
savepoints of the test's rolled-back one, and end as transactions end."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import insert_job

CHAMPION = """
INSERT INTO triage.classifier_models (version, status, taxonomy_sha256, training_set_sha256, label_counts,
    metrics, thresholds, target_precision, params, artifact, artifact_sha256, created_by)
VALUES (:version, 'champion', 't', 's', '{}', '{}', '{}', 0.9, '{}', '\\x00', repeat('a', 64), 'test')
"""


def jobs(conn: sa.Connection) -> int:
    return conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one()


def test_a_commit_is_seen_by_the_test_and_a_failed_transaction_leaves_nothing(
    engine: sa.Engine, ledger: sa.Connection
) -> None:
    with engine.begin() as conn:
        insert_job(conn)
    assert jobs(ledger) == 1

    def failing() -> None:
        with engine.begin() as conn:
            insert_job(conn)
            conn.execute(sa.text("SELECT 1 / 0"))  # the transaction fails: its insert goes with it

    with pytest.raises(sa.exc.DBAPIError):
        failing()
    assert jobs(ledger) == 1
    with engine.connect() as conn:  # no commit: rolled back when it closes
        insert_job(conn)
    assert jobs(ledger) == 1


def test_a_deferred_constraint_is_checked_at_the_commit(engine: sa.Engine, ledger: sa.Connection) -> None:
    """One champion model at a time is checked at commit (so one statement may promote and
    retire); a savepoint's release checks it as a commit would."""

    def two_champions() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(CHAMPION), {"version": f"v-{uuid.uuid4()}"})
            conn.execute(sa.text(CHAMPION), {"version": f"v-{uuid.uuid4()}"})  # accepted until the commit

    with pytest.raises(sa.exc.IntegrityError, match="classifier_models_one_champion"):
        two_champions()
    assert ledger.execute(sa.text("SELECT count(*) FROM triage.classifier_models")).scalar_one() == 0


def test_the_actor_a_transaction_sets_ends_with_it(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT set_config('triage.actor', 'alice', true)"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT current_setting('triage.actor', true)")).scalar() in ("", None)
