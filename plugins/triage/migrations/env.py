"""Alembic environment: online migrations only, in schema ``triage``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from triage.jobs.schema import SCHEMA, metadata
from triage.migrations import VERSION_TABLE, VERSION_TABLE_SCHEMA


def run_migrations_online() -> None:
    engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url") or "", poolclass=sa.NullPool)
    with engine.connect() as connection:
        # The version table lives in the schema, so the schema must exist first.
        connection.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"'))
        connection.commit()
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            version_table_schema=VERSION_TABLE_SCHEMA,
            include_schemas=True,
            include_name=lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
