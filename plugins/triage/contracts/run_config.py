"""The run configuration of ``classify_documents``: one pydantic model, the DAG's params.

The trigger form is generated from this model (:func:`airflow_params`), and operators
validate ``context["params"]`` against it, so the form, the defaults and the code can never
drift apart. Invalid input is refused by the form (JSON-schema keywords) and again here with
a typed error.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from triage.contracts.drill import DrillSettings
from triage.contracts.params import DagParams, InvalidParams


class InvalidRunConfig(InvalidParams):
    """The run's params do not describe a valid run."""


class RunNotAllowed(InvalidRunConfig):
    """Valid params that this deployment does not allow; retrying cannot help."""


class DrillNotAllowed(RunNotAllowed):
    """The run asks for a failure drill where the deployment does not allow drills."""


class InboxNotAllowed(RunNotAllowed):
    """The run's inbox is not inside one of the deployment's inbox roots."""


class ModelModeRefused(InvalidRunConfig):
    """The run asks for batch mode with something batch mode cannot do (the keyword classifier,
    a failure drill): refused when the run starts, since every retry would get the same params."""


class ClassifyRunConfig(DagParams):
    """What one ``classify_documents`` run does."""

    dag_id: ClassVar[str] = "classify_documents"
    invalid: ClassVar[type[InvalidParams]] = InvalidRunConfig

    source: Literal["synthetic", "jsonl"] = Field(
        default="synthetic",
        title="Source",
        description="Where documents come from: generated tickets (synthetic) or an inbox of JSON-lines files (jsonl).",
        json_schema_extra={"section": "Retrieval"},
    )
    documents: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        title="Synthetic documents",
        description="How many synthetic documents the run's data interval holds (source = synthetic).",
        json_schema_extra={"section": "Retrieval"},
    )
    inbox: str = Field(
        default="include/sample_inbox",
        title="Inbox",
        description="Folder or object-storage URL of the jsonl inbox, one sub-folder per day (YYYY-MM-DD); "
        "relative paths are taken from the project folder; it must lie inside one of the deployment's inbox "
        "roots (TRIAGE_INBOX_ROOTS) (source = jsonl).",
        json_schema_extra={"section": "Retrieval"},
    )
    classifier: Literal["auto", "keyword", "llm", "learned"] = Field(
        default="auto",
        title="Classifier",
        description="auto: learned when the model registry has a champion, else keyword; keyword: the taxonomy's "
        "keywords; llm: an OpenAI-compatible model through the triage_llm connection; learned: the champion of the "
        "model registry, trained from labelled examples (triage train, the train_classifier DAG); a run fails at "
        "once when there is none.",
        json_schema_extra={"section": "Classification"},
    )
    model_mode: Literal["interactive", "batch"] = Field(
        default="interactive",
        title="Model mode",
        description="How the llm classifier asks the model: interactive (one call per document, answers in "
        "minutes) or batch (the provider's /v1/batches: about half the price, answers within 24 hours, the run "
        "waiting deferred in the triggerer meanwhile; for large backfills). Batch needs classifier = llm and no "
        "failure drill.",
        json_schema_extra={"section": "Classification"},
    )
    confidence_threshold: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        title="Confidence threshold",
        description="Below this confidence a label is inconclusive and the document goes to manual review.",
        json_schema_extra={"section": "Classification"},
    )
    audit_rate: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        title="Audit rate",
        description="Share of auto-accepted documents also sent to review as audit_sample: their label stands and "
        "is published, and a reviewer confirms or corrects it (the audited precision of the Quality report). "
        "Chosen by a hash of the job id, so a retry samples the same documents; 0: no audit.",
        json_schema_extra={"section": "Classification"},
    )
    max_attempts: int = Field(
        default=4,
        ge=1,
        le=20,
        title="Max attempts",
        description="Attempts per document before a transient failure goes to manual review (retries_exhausted).",
        json_schema_extra={"section": "Reliability"},
    )
    lease_seconds: int = Field(
        default=300,
        ge=10,
        le=3600,
        title="Lease (seconds)",
        description="How long a worker owns a claimed batch without a heartbeat before reconciliation takes it back.",
        json_schema_extra={"section": "Reliability"},
    )
    concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        title="Concurrency",
        description="Classifier calls in flight at once in one classify task (the llm classifier; keyword runs "
        "inline), at most the task's 8 slots of the llm_api pool.",
        json_schema_extra={"section": "Reliability"},
    )
    drill: DrillSettings = Field(
        default_factory=DrillSettings,
        title="Failure drill",
        description="Injected fault rates (transient_error_rate, permanent_error_rate, inconclusive_rate, "
        "duplicate_rate in [0, 1]) and their seed; all zero is no drill. A drill runs only where the deployment "
        "allows it (TRIAGE_ALLOW_DRILL=1: make run, make chaos); elsewhere the run fails at once.",
        json_schema_extra={"section": "Failure drill"},
    )

    @model_validator(mode="after")
    def _batch_mode_asks_the_model(self) -> ClassifyRunConfig:
        if self.model_mode != "batch":
            return self
        if self.classifier != "llm":
            raise ModelModeRefused(
                f"model_mode batch sends documents to the provider's batch interface, which only the llm classifier "
                f"has; this run asks for classifier {self.classifier}: set classifier to llm, or model_mode to "
                "interactive"
            )
        if self.drill.requested:
            raise ModelModeRefused(
                "model_mode batch cannot inject drill faults (the provider answers the batch, not Triage's "
                "classifier): set every drill rate to 0, or model_mode to interactive"
            )
        return self


def check_drill(config: ClassifyRunConfig, *, allowed: bool) -> None:
    """Refuse a drill where drills are off, rather than run it or quietly drop it.

    :raises DrillNotAllowed: the run asks for a drill and ``allowed`` is false.
    """
    if config.drill.requested and not allowed:
        raise DrillNotAllowed(
            "this deployment does not run failure drills (TRIAGE_ALLOW_DRILL is not set), and the drill param asks "
            "for one; trigger the run again with every drill rate at 0"
        )


def param_schemas() -> dict[str, dict[str, Any]]:
    return ClassifyRunConfig.param_schemas()
