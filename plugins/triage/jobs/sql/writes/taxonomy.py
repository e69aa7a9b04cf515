"""``triage.taxonomy_labels`` kept in step with the taxonomy file (migration 0021).

The database refuses a label outside the active rows of this table (``document_labels``, a
reviewer's ``labelled`` decision), so raw SQL is held to the taxonomy as the classifiers are.
:func:`sync_taxonomy` runs as the tables' owner at every ``triage migrate``
(:func:`triage.migrations.upgrade`): labels of the file are added (or active again), labels no
longer in it are retired, never deleted (rows written under them stay readable and valid).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema.access import taxonomy_labels

NAMES = sa.bindparam("names", type_=pg.ARRAY(sa.Text))


def add_labels() -> sa.Insert:
    """Every name of ``:names`` active: new ones inserted, retired ones taken back."""
    given = sa.select(sa.func.unnest(NAMES).label("name")).subquery()
    stmt = pg.insert(taxonomy_labels).from_select(["name"], sa.select(given.c.name))
    return stmt.on_conflict_do_update(
        index_elements=["name"], set_={"retired_at": None}, where=taxonomy_labels.c.retired_at.is_not(None)
    ).returning(taxonomy_labels.c.name)


def retire_labels() -> sa.Update:
    """Every active name not in ``:names`` retired now."""
    return (
        sa.update(taxonomy_labels)
        .where(taxonomy_labels.c.retired_at.is_(None), taxonomy_labels.c.name != sa.func.all_(NAMES))
        .values(retired_at=sa.func.now())
        .returning(taxonomy_labels.c.name)
    )


@dataclass(frozen=True)
class TaxonomySync:
    added: list[str]  # new, or active again
    retired: list[str]


def sync_taxonomy(conn: sa.Connection, names: Collection[str]) -> TaxonomySync:
    """Make the active rows of ``taxonomy_labels`` exactly ``names`` (inside the caller's transaction)."""
    ordered = sorted(names)
    added = list(conn.execute(add_labels(), {"names": ordered}).scalars())
    retired = list(conn.execute(retire_labels(), {"names": ordered}).scalars())
    return TaxonomySync(sorted(added), sorted(retired))


def active_labels(conn: sa.Connection) -> set[str]:
    return set(conn.execute(sa.select(taxonomy_labels.c.name).where(taxonomy_labels.c.retired_at.is_(None))).scalars())
