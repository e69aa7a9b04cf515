"""The operator of ``train_classifier``: an adapter over :func:`triage.learning.registry.train_candidate`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from triage.operators.base import TriageOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


class TrainClassifierOperator(TriageOperator):
    """Train a candidate from the labelled examples, promote it by the registry's rule, and
    return what happened (XCom: version, status, held-out metrics, the champion's on the same
    examples). Too few examples fail the run at once (no retry adds examples).

    :param payload_base: the payload store (default: Variable ``triage_payload_base``, then
        ``$TRIAGE_PAYLOAD_BASE``, then ``$TRIAGE_HOME/payloads``).
    """

    template_fields = ("payload_base",)

    def __init__(self, *, payload_base: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.payload_base = payload_base

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.classifiers.taxonomy import Taxonomy, TaxonomyError
        from triage.contracts.train_params import InvalidTrainParams, TrainParams
        from triage.learning.registry import train_candidate
        from triage.learning.training import TrainingRefused, TrainSettings
        from triage.operators.classify_documents import _payloads

        try:
            params = TrainParams.from_params(context["params"])
            taxonomy = Taxonomy.load()
        except (InvalidTrainParams, TaxonomyError) as exc:
            raise AirflowFailException(str(exc)) from None
        payloads = _payloads(self.payload_base)
        trainer = f"airflow:{context['run_id']}"
        try:
            report = train_candidate(
                self.engine,
                payloads,
                taxonomy_names=sorted(taxonomy.names),
                taxonomy_sha256=taxonomy.content_hash,
                settings=TrainSettings(
                    target_precision=params.target_precision,
                    holdout_percent=params.holdout_percent,
                    min_examples=params.min_examples,
                    thresholds=params.thresholds,
                ),
                actor=trainer,
            )
        except TrainingRefused as exc:
            raise AirflowFailException(f"nothing to train: {exc}") from None
        finally:
            self.dispose()
        m = report.metrics
        log.info(
            "model=%s status=%s promoted=%s held_out=%s accuracy=%s macro_f1=%s coverage=%s accepted_precision=%s "
            "reason=%s",
            report.version,
            report.status,
            report.promoted,
            m["n"],
            m["accuracy"],
            m["macro_f1"],
            m["coverage"],
            m["accepted_precision"],
            report.reason,
        )
        return report.to_dict()
