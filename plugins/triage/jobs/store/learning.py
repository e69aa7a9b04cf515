"""The store's learning part (``JobStore.learning``): the labelled examples and the model
registry's rows, by the named statements of :mod:`triage.jobs.sql.writes.learning`, each call in
a transaction (or read) of its own. What the rows mean (training, thresholds, the artifact read
without pickle) is :mod:`triage.learning`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from triage.jobs.sql.reads.taxonomy import known_labels
from triage.jobs.sql.writes import learning as L
from triage.jobs.store.ledger import Part

__all__ = ["LearningRows"]


class LearningRows(Part):
    """Labelled examples and model versions: the store's part ``JobStore.learning``."""

    def add_examples(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Insert labelled examples (an external id seen before of the source adds nothing);
        the external ids of those added."""
        if not rows:
            return []
        with self.transaction(None) as conn:
            return list(conn.execute(L.insert_examples(), list(rows)).scalars().all())

    def unknown_labels(self, names: Collection[str]) -> list[str]:
        """The names of ``names`` that ``triage.taxonomy_labels`` does not hold (sorted): an
        example may be stored under a label of that table only (its foreign key)."""
        with self.engine.connect() as conn:
            known = set(conn.execute(known_labels(), {"names": sorted(names)}).scalars())
        return sorted(set(names) - known)

    def training_examples(self) -> list[Any]:
        """Every example to train on (the newest label of each content)."""
        with self.engine.connect() as conn:
            return list(conn.execute(L.training_examples()).all())

    def add_model(self, row: Mapping[str, Any]) -> bool:
        """Insert a model version; False: that version exists already."""
        with self.transaction(None) as conn:
            return conn.execute(L.insert_model(), dict(row)).first() is not None

    def promote(self, version: str, *, actor: str, reason: str) -> dict[str, str]:
        """Make ``version`` champion and retire the one before; the versions changed and their
        new status (empty: no such version, or the champion already)."""
        params = {"p_version": version, "p_actor": actor, "p_reason": reason}
        with self.transaction(None) as conn:
            return dict(conn.execute(L.promote(), params).tuples().all())

    def model_status(self, version: str) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(L.model_status(), {"p_version": version}).scalar_one_or_none()
        return None if found is None else str(found)

    def models(self) -> list[dict[str, Any]]:
        """Every version, newest first, without artifacts."""
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(L.models())]

    def champion_version(self) -> str | None:
        with self.engine.connect() as conn:
            found = conn.execute(L.champion_version()).scalar_one_or_none()
        return None if found is None else str(found)

    def champion(self) -> Any | None:
        """The champion's row, artifact included; None: there is none."""
        with self.engine.connect() as conn:
            return conn.execute(L.champion()).first()

    def model(self, version: str) -> Any | None:
        """The row of ``version`` (any status), artifact included; None: no such version."""
        with self.engine.connect() as conn:
            return conn.execute(L.model(), {"p_version": version}).first()
