"""The run configuration of ``classify_documents``: one pydantic model, the DAG's params.

The trigger form is generated from this model (:func:`airflow_params`), and operators
validate ``context["params"]`` against it, so the form, the defaults and the code can never
drift apart. Invalid input is refused by the form (JSON-schema keywords) and again here with
a typed error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage.contracts.drill import DrillSettings


class InvalidRunConfig(ValueError):
    """The run's params do not describe a valid run."""


class ClassifyRunConfig(BaseModel):
    """What one ``classify_documents`` run does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["synthetic", "jsonl"] = Field(
        default="synthetic", title="Source",
        description="Where documents come from: generated tickets (synthetic) or an inbox of JSON-lines files (jsonl).",
        json_schema_extra={"section": "Retrieval"},
    )  # fmt: skip
    documents: int = Field(
        default=1000, ge=0, le=1_000_000, title="Synthetic documents",
        description="How many synthetic documents the run's data interval holds (source = synthetic).",
        json_schema_extra={"section": "Retrieval"},
    )  # fmt: skip
    inbox: str = Field(
        default="include/sample_inbox", title="Inbox",
        description="Folder or object-storage URL of the jsonl inbox, one sub-folder per day (YYYY-MM-DD); "
        "relative paths are taken from the project folder (source = jsonl).",
        json_schema_extra={"section": "Retrieval"},
    )  # fmt: skip
    classifier: Literal["keyword", "llm"] = Field(
        default="keyword", title="Classifier",
        description="keyword: the taxonomy's keywords; llm: an OpenAI-compatible model through the triage_llm connection.",
        json_schema_extra={"section": "Classification"},
    )  # fmt: skip
    confidence_threshold: float = Field(
        default=0.7, ge=0.0, le=1.0, title="Confidence threshold",
        description="Below this confidence a label is inconclusive and the document goes to manual review.",
        json_schema_extra={"section": "Classification"},
    )  # fmt: skip
    max_attempts: int = Field(
        default=4, ge=1, le=20, title="Max attempts",
        description="Attempts per document before a transient failure goes to manual review (retries_exhausted).",
        json_schema_extra={"section": "Reliability"},
    )  # fmt: skip
    lease_seconds: int = Field(
        default=300, ge=10, le=3600, title="Lease (seconds)",
        description="How long a worker owns a claimed batch without a heartbeat before reconciliation takes it back.",
        json_schema_extra={"section": "Reliability"},
    )  # fmt: skip
    concurrency: int = Field(
        default=8, ge=1, le=256, title="Concurrency",
        description="Classifier calls in flight at once in one task (the llm classifier; keyword runs inline).",
        json_schema_extra={"section": "Reliability"},
    )  # fmt: skip
    drill: DrillSettings = Field(
        default_factory=DrillSettings, title="Failure drill",
        description="Injected fault rates (transient_error_rate, permanent_error_rate, inconclusive_rate, "
        "duplicate_rate in [0, 1]) and their seed; all zero is no drill.",
        json_schema_extra={"section": "Failure drill"},
    )  # fmt: skip

    @classmethod
    def from_params(cls, params: Any) -> ClassifyRunConfig:
        """Validate a run's params (``context["params"]``, a dict or Airflow's ParamsDict)."""
        data = {k: params[k] for k in cls.model_fields if k in params}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise InvalidRunConfig(f"invalid classify_documents params: {problems}") from None


def param_schemas() -> dict[str, dict[str, Any]]:
    """Each field as the JSON-schema keywords Airflow's ``Param`` takes (plain dicts, so this
    module needs no Airflow)."""
    schema = ClassifyRunConfig.model_json_schema()
    defaults = ClassifyRunConfig().model_dump(mode="json")
    drill_schema = schema.get("$defs", {}).get("DrillSettings", {})
    out: dict[str, dict[str, Any]] = {}
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        if "$ref" in prop or "allOf" in prop:  # the nested drill object
            prop.pop("$ref", None)
            prop.pop("allOf", None)
            prop.update({"type": "object", "properties": drill_schema.get("properties", {}),
                         "additionalProperties": False})  # fmt: skip
        prop.pop("default", None)
        out[name] = {"default": defaults[name], **prop}
    return out
