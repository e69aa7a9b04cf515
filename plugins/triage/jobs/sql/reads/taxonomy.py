"""Reads of ``triage.taxonomy_labels`` (kept in step with the taxonomy file by ``triage migrate``,
:mod:`triage.jobs.sql.writes.taxonomy`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema.access import taxonomy_labels

__all__ = ["known_labels"]


def known_labels() -> sa.Select[tuple[str]]:
    """The names of ``:names`` the table holds (active or retired: rows may name either)."""
    names = sa.bindparam("names", type_=pg.ARRAY(sa.Text))
    return sa.select(taxonomy_labels.c.name).where(taxonomy_labels.c.name == sa.func.any(names))
