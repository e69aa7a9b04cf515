"""The store's part ``JobStore.probes``: the half-open probe of an outage, each move one
transaction (the statements and why are :mod:`triage.jobs.sql.moves.probes`).
"""

from __future__ import annotations

import uuid

from triage.jobs.sql.moves.probes import probe_lock, probe_parked, resume_after_probe
from triage.jobs.store.ledger import Part


class OutageProbes(Part):
    """The store's half of the probe: take one parked job out as the probe, and queue the rest
    once it was answered. Each is one transaction under ``actor`` (the worker's lease owner)."""

    def probe_parked(
        self, batch_key: str, step: str, *, actor: str, classifier_version: str | None = None
    ) -> tuple[uuid.UUID, str] | None:
        """Queue one job of the batch and step parked on an outage as the probe, unless another
        worker is probing or working on them (:func:`probe_parked`); its (id, dependency), or
        None. The caller claims it next."""
        params = {"p_batch_key": batch_key, "p_step": step, "p_classifier_version": classifier_version}
        with self.transaction(actor) as conn:
            conn.execute(probe_lock(), params)
            row = conn.execute(probe_parked(), params).first()
        return None if row is None else (row.id, str(row.dependency))

    def resume_after_probe(
        self, batch_key: str, step: str, *, dependency: str, actor: str, classifier_version: str | None = None
    ) -> int:
        """Queue every job of the batch and step parked on ``dependency``: the probe was
        answered (:func:`resume_after_probe`); how many."""
        params = {
            "p_batch_key": batch_key,
            "p_step": step,
            "p_classifier_version": classifier_version,
            "dependency": dependency,
        }
        with self.transaction(actor) as conn:
            return len(conn.execute(resume_after_probe(), params).all())
