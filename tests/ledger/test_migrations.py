"""Migrations: from empty they build exactly the SQLAlchemy metadata, and they go back down."""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from triage import migrations
from triage.database import DatabaseUrl, create_engine
from triage.jobs.schema import SCHEMA, metadata

PARTITION = re.compile(r"_(p\d{8}|legacy|default)$")
"""The daily partitions of job_events and outbox (migration 0015): made by the maintenance, not metadata."""


def _diff(url: DatabaseUrl) -> list[object]:
    engine = create_engine(url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
                "include_object": lambda obj, name, type_, reflected, compare_to: (
                    name != "alembic_version" and not (type_ == "table" and PARTITION.search(name or ""))
                ),
                "compare_type": True,
            },
        )
        diff = compare_metadata(context, metadata)
    engine.dispose()
    return diff


def _objects(url: DatabaseUrl) -> set[str]:
    engine = create_engine(url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'triage'"
                " UNION ALL SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                " WHERE n.nspname = 'triage' AND t.typtype = 'e'"
                " UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'triage'"
            )
        ).scalars()
        names = set(rows)
    engine.dispose()
    return names


def test_migrations_from_empty_equal_the_metadata(fresh_database: DatabaseUrl) -> None:
    migrations.upgrade(fresh_database)
    assert (
        migrations.current_revision(fresh_database)
        == ScriptDirectory.from_config(migrations.alembic_config(fresh_database)).get_current_head()
    )
    assert _diff(fresh_database) == []


def test_version_table_lives_in_the_triage_schema(fresh_database: DatabaseUrl) -> None:
    migrations.upgrade(fresh_database)
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('triage.alembic_version')")).scalar() is not None
        assert conn.execute(sa.text("SELECT to_regclass('public.alembic_version')")).scalar() is None
    engine.dispose()


def test_downgrade_to_base_and_up_again(fresh_database: DatabaseUrl) -> None:
    migrations.upgrade(fresh_database)
    migrations.downgrade(fresh_database, "base")
    assert migrations.current_revision(fresh_database) is None
    left = _objects(fresh_database) - {"alembic_version", "alembic_version_pkc"}
    assert left == set()
    migrations.upgrade(fresh_database)
    assert _diff(fresh_database) == []


def test_0006_upgrades_a_database_of_0005_with_jobs_mid_life(fresh_database: DatabaseUrl) -> None:
    """Jobs written before attempt budgets: each started its budget at 0 (requeues and advances
    reset the attempt), so after the upgrade a requeue numbers on from the attempt it reached."""
    from triage.jobs.store import JobStore

    migrations.upgrade(fresh_database, "0005")
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    with engine.begin() as conn:
        job_id = conn.execute(
            sa.text(
                "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
                " classifier_version, correlation_id, batch_key, step, status, status_reason, attempt, max_attempts)"
                " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'manual_review', 'inconclusive', 2, 3)"
                " RETURNING id"
            )
        ).scalar_one()
    migrations.upgrade(fresh_database)
    assert _diff(fresh_database) == []
    JobStore(engine).review.resolve_with_requeue(job_id, actor="alice")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT status::text, attempt, attempt_base, max_attempts FROM triage.jobs")).one()
    engine.dispose()
    assert tuple(row) == ("queued", 2, 2, 5)


def test_primary_keys_and_identity_columns_equal_the_metadata(fresh_database: DatabaseUrl) -> None:
    """What autogenerate's comparison above does not look at: each table's primary key and which
    columns the database numbers itself (the metadata once declared classifications.id as drawn
    from job_events' sequence with no key, while the database has its identity primary key)."""
    migrations.upgrade(fresh_database)
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    inspector = sa.inspect(engine)
    for table in metadata.sorted_tables:
        reflected = inspector.get_pk_constraint(table.name, schema=SCHEMA)["constrained_columns"]
        assert reflected == [c.name for c in table.primary_key.columns], table.name
        identity = {c["name"] for c in inspector.get_columns(table.name, schema=SCHEMA) if c.get("identity")}
        assert identity == {c.name for c in table.columns if c.identity is not None}, table.name
    engine.dispose()
