"""The run configuration of ``classify_documents``: one pydantic model, the DAG's params.

The trigger form is generated from this model (:func:`airflow_params`), and operators
validate ``context["params"]`` against it, so the form, the defaults and the code can never
drift apart. Invalid input is refused by the form (JSON-schema keywords) and again here with
a typed error.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

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
    classifier: Literal["keyword", "llm"] = Field(
        default="keyword",
        title="Classifier",
        description="keyword: the taxonomy's keywords; llm: an OpenAI-compatible model through the triage_llm connection.",
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
