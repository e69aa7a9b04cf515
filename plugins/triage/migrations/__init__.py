"""Alembic migrations of the job tables, kept inside the package so every deployment has them.

The version table is ``triage.alembic_version``: inside the project's schema, so it can never
collide with Airflow's own ``alembic_version``.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

from triage.database import DatabaseUrl

VERSION_TABLE = "alembic_version"
VERSION_TABLE_SCHEMA = "triage"


def alembic_config(url: DatabaseUrl) -> Config:
    """An Alembic config without an ini file: the URL is ours, the scripts are here."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    # ConfigParser interpolates %; the URL may carry percent-encoded characters.
    config.set_main_option(
        "sqlalchemy.url", url.sqlalchemy_url().render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def upgrade(url: DatabaseUrl, revision: str = "head") -> None:
    """Apply the migrations up to ``revision``, then bring ``triage.taxonomy_labels`` in step with
    the taxonomy file (``$TRIAGE_TAXONOMY``, else ``include/taxonomy.yaml``) when the table
    exists: the database checks labels against it (migration 0021)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)
    sync_taxonomy(url)


def sync_taxonomy(url: DatabaseUrl) -> None:
    """Load the taxonomy file's labels into ``triage.taxonomy_labels`` (as the owner); nothing
    before revision 0021. An unreadable taxonomy file raises ``TaxonomyError``: a deployment
    whose labels cannot be known cannot write any."""
    import sqlalchemy as sa

    from triage.classifiers.taxonomy import Taxonomy
    from triage.database import create_engine
    from triage.jobs.sql.writes.taxonomy import sync_taxonomy as sync

    engine = create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            if conn.execute(sa.text("SELECT to_regclass('triage.taxonomy_labels')")).scalar() is None:
                return
            sync(conn, Taxonomy.load().names)
    finally:
        engine.dispose()


def downgrade(url: DatabaseUrl, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: DatabaseUrl) -> str | None:
    """The applied revision, or None before the first migration."""
    import sqlalchemy as sa
    from alembic.migration import MigrationContext

    from triage.database import create_engine

    engine = create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "version_table_schema": VERSION_TABLE_SCHEMA}
            )
            return context.get_current_revision()
    finally:
        engine.dispose()
