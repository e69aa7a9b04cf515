"""What one ``review_jobs`` run decides: one pydantic model, the DAG's params.

The trigger form is generated from :class:`ReviewRunConfig` (:func:`param_schemas`) and the
operator validates ``context["params"]`` against it again. A JSON-schema param cannot depend on
another param, so "a label is required when decision is label" is enforced here, where an
invalid run fails with a clear message before anything changes. So is the decision ``replay``:
it takes the filter fields (:class:`~triage.contracts.replay.ReplaySelection`) instead of job
ids, and is a dry run unless ``dry_run`` is unticked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, model_validator

from triage.contracts.params import DagParams, InvalidParams
from triage.contracts.replay import NARROWING_FIELDS, ReplayFilter, ReplaySelection

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class InvalidReviewConfig(InvalidParams):
    """The run's params do not describe a valid review decision."""


class ReviewRunConfig(DagParams, ReplaySelection):
    """One reviewer's decision, applied to each of ``job_ids``; or a replay of the jobs the
    filter fields select (decision ``replay``)."""

    dag_id: ClassVar[str] = "review_jobs"
    invalid: ClassVar[type[InvalidParams]] = InvalidReviewConfig

    job_ids: list[str] = Field(
        default=[],
        max_length=1000,
        title="Job ids",
        description="The jobs to decide on (UUIDs, one per line), e.g. from the manual-review queue of the "
        "reconcile_jobs report. Each is decided on its own: a refused job never blocks the others. "
        "Leave empty for decision replay (the filter below selects the jobs).",
        json_schema_extra={"section": "Decision", "items": {"type": "string", "pattern": UUID_PATTERN}},
    )
    decision: Literal["label", "requeue", "reject", "replay"] = Field(
        title="Decision",
        description="label: the job is done with the label below; requeue: run its step again as a fresh job "
        "(a new attempt budget, bounded by max replays); reject: no attempt will ever succeed (terminal_failed); "
        "replay: requeue the jobs the filter below selects (manual_review and/or terminal_failed), a dry run "
        "unless Dry run is unticked.",
        json_schema_extra={"section": "Decision"},
    )
    label: str | None = Field(
        default=None,
        title="Label",
        description="The taxonomy label (required for decision = label; leave empty otherwise).",
        json_schema_extra={"section": "Decision"},
    )
    note: str | None = Field(
        default=None,
        max_length=2000,
        title="Note",
        description="Why: kept with the review row (and the replay's record). Required to apply a replay. "
        "Ids and reasons only; never paste document text here.",
        json_schema_extra={"section": "Decision", "format": "multiline"},
    )
    max_replays: int = Field(
        default=3,
        ge=1,
        le=20,
        title="Max replays",
        description="A requeue is refused once a job was requeued from review this often; a replay leaves such "
        "jobs alone.",
        json_schema_extra={"section": "Limits"},
    )

    @model_validator(mode="after")
    def _label_goes_with_its_decision(self) -> ReviewRunConfig:
        if self.decision == "replay":
            if self.job_ids:
                raise ValueError("decision 'replay' selects jobs by the filter fields: leave job ids empty")
            self.replay_filter()  # its refusal (a ValueError) becomes this model's
        else:
            if not self.job_ids:
                raise ValueError(f"decision {self.decision!r} needs job ids")
            named = [name for name in NARROWING_FIELDS if getattr(self, name) is not None]
            if named:
                raise ValueError(f"the filter fields ({', '.join(named)}) are for decision 'replay' only")
        if self.decision == "label" and not self.label:
            raise ValueError("decision 'label' needs a label from the taxonomy")
        if self.decision != "label" and self.label:
            raise ValueError(f"a label is only for decision 'label', not {self.decision!r}; clear it or decide 'label'")
        return self

    def replay_filter(self) -> ReplayFilter:
        """The replay this run asks for (decision ``replay``).

        :raises InvalidReplayFilter: the filter fields do not make a filter that may run.
        """
        fields = {name: getattr(self, name) for name in ReplaySelection.model_fields}
        return ReplayFilter.parse({**fields, "note": self.note})


def param_schemas(label_names: list[str]) -> dict[str, dict[str, Any]]:
    """Each field as the keywords Airflow's ``Param`` takes, the decision's fields first and the
    replay's filter after them. The decision is required by the form; ``label`` is a drop-down of
    ``label_names`` (or free text when the taxonomy could not be read at parse time: the operator
    checks it anyway)."""
    out = ReviewRunConfig.param_schemas()
    if label_names:
        out["label"]["enum"] = [None, *label_names]
    replay = [name for name in out if name in ReplaySelection.model_fields]
    return {**{k: v for k, v in out.items() if k not in replay}, **{k: out[k] for k in replay}}


def form_label_names() -> list[str]:
    """The taxonomy's label names for the form's drop-down, read at DAG parse time.

    Deliberately light (YAML only: importing :mod:`triage.classifiers` would load the model
    clients at every parse) and forgiving: a missing or broken file gives an empty list, the
    label becomes free text, and the operator refuses a label outside the taxonomy it loads.
    """
    override = os.environ.get("TRIAGE_TAXONOMY")
    path = Path(override) if override else Path(__file__).resolve().parents[3] / "include" / "taxonomy.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [str(item["name"]) for item in data["labels"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return []
