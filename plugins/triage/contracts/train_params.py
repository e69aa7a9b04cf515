"""The ``train_classifier`` DAG's params: one typed model for the trigger form and the operator."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from triage.contracts.params import DagParams, InvalidParams

__all__ = ["THRESHOLD_RULES", "InvalidTrainParams", "TrainParams", "param_schemas"]

ThresholdRuleParam = Literal["verified", "pooled", "per-label"]
THRESHOLD_RULES: tuple[ThresholdRuleParam, ...] = ("verified", "pooled", "per-label")
"""The ``thresholds`` param's choices: :data:`triage.learning.training.THRESHOLD_RULES` (a test holds
them equal; contracts import nothing of the learning code)."""


class InvalidTrainParams(InvalidParams):
    """The run's params do not describe a training."""


class TrainParams(DagParams):
    """What one ``train_classifier`` run does (as ``triage train``'s options)."""

    dag_id: ClassVar[str] = "train_classifier"
    invalid: ClassVar[type[InvalidParams]] = InvalidTrainParams

    target_precision: float = Field(
        default=0.97,
        gt=0.0,
        le=1.0,
        title="Target precision",
        description="How often an auto-accepted label must be right on held-out examples; each label's "
        "confidence threshold is chosen to reach it (a label that cannot never auto-accepts).",
        json_schema_extra={"section": "Quality"},
    )
    holdout_percent: int = Field(
        default=20,
        ge=1,
        le=50,
        title="Held out (%)",
        description="The share of labelled examples kept out of training to measure the model and choose its "
        "thresholds, fixed by a hash of each example's id.",
        json_schema_extra={"section": "Quality"},
    )
    min_examples: int = Field(
        default=20,
        ge=1,
        le=100_000,
        title="Examples per label",
        description="Training examples a label needs before the model may auto-accept it.",
        json_schema_extra={"section": "Quality"},
    )

    thresholds: ThresholdRuleParam = Field(
        default="verified",
        title="Threshold rule",
        description="How each label's threshold is chosen on the held-out examples (triage train --thresholds): "
        "verified, the margin on all accepted together, proposed by one half of them and certified on the other; "
        "pooled, chosen and judged on the same ones; per-label, each label's margin on its own.",
        json_schema_extra={"section": "Quality"},
    )


def param_schemas() -> dict[str, dict[str, Any]]:
    return TrainParams.param_schemas()
