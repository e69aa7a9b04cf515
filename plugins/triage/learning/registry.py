"""The model registry: train a candidate from the ledger's examples, list, promote, load.

A version is a row of ``triage.classifier_models`` (candidate, champion or retired) with its
training set hash, counts per label, held-out metrics, per-label thresholds and artifact (its
SHA-256 beside it, checked on every load). The promotion rule: a candidate becomes champion
only if it beats the champion's macro-F1 on the same held-out examples (the champion is scored
on them at training time; the split is fixed by example id, so neither was trained on them)
without its accepted precision falling below the target; with no champion yet, the first
candidate becomes champion. A person may promote any candidate or retired version by hand
(``triage models promote``), which is recorded with their name.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from triage.contracts.documents import DocumentPayload, MalformedDocument
from triage.jobs.store import JobStore
from triage.learning.model import ArtifactRefused, LinearTextModel
from triage.learning.training import DEFAULT_SETTINGS, Example, TrainedModel, TrainSettings, evaluate_model, train
from triage.payloads import PayloadError, PayloadStore

__all__ = [
    "LoadedModel",
    "NoChampion",
    "TrainReport",
    "UnknownModel",
    "champion_version",
    "list_models",
    "load_champion",
    "load_model",
    "load_training_examples",
    "promote",
    "promotion_decision",
    "resolve_classifier",
    "train_candidate",
]

NEVER: Final = 2.0
"""The threshold of a label that never auto-accepts (no confidence reaches it)."""

READ_CHUNK: Final = 2000


class NoChampion(LookupError):
    """No model is champion yet: ``triage train`` (or the ``train_classifier`` DAG) makes one."""


class UnknownModel(LookupError):
    """No model of that version, or it cannot be promoted (it is the champion already)."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A registry version ready to classify: the model and its per-label thresholds."""

    version: str
    status: str
    model: LinearTextModel
    thresholds: dict[str, float | None]
    target_precision: float

    def threshold(self, label: str) -> float:
        found = self.thresholds.get(label)
        return NEVER if found is None else float(found)


@dataclass(frozen=True, slots=True)
class TrainReport:
    """What ``triage train`` did: the candidate, whether it is new, the comparison, the status."""

    version: str
    new: bool
    status: str
    promoted: bool
    reason: str
    metrics: dict[str, Any]
    champion_version: str | None
    champion_metrics: dict[str, Any] | None
    label_counts: dict[str, int]
    thresholds: dict[str, float | None]
    skipped: dict[str, int]
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "new": self.new,
            "status": self.status,
            "promoted": self.promoted,
            "reason": self.reason,
            "metrics": self.metrics,
            "champion_version": self.champion_version,
            "champion_metrics": self.champion_metrics,
            "label_counts": self.label_counts,
            "thresholds": self.thresholds,
            "skipped": self.skipped,
            "params": self.params,
        }


def load_training_examples(
    engine: sa.Engine, payloads: PayloadStore, taxonomy_names: Collection[str]
) -> tuple[list[Example], dict[str, int]]:
    """The ledger's examples with their texts (the newest label of each content), and how many
    were skipped and why: a label no longer in the taxonomy, a payload missing or not matching
    its hash, a document that is not a version-1 payload."""
    rows = JobStore(engine).learning.training_examples()
    names = frozenset(taxonomy_names)
    skipped = {"label_outside_taxonomy": 0, "payload_unreadable": 0, "malformed_document": 0}
    kept = [row for row in rows if row.label in names]
    skipped["label_outside_taxonomy"] = len(rows) - len(kept)
    examples: list[Example] = []
    for start in range(0, len(kept), READ_CHUNK):
        chunk = kept[start : start + READ_CHUNK]
        contents = payloads.get_many([(row.payload_ref, row.content_sha256) for row in chunk])
        for row, content in zip(chunk, contents, strict=True):
            if isinstance(content, PayloadError):
                skipped["payload_unreadable"] += 1
                continue
            try:
                text = DocumentPayload.from_bytes(content).text
            except MalformedDocument:
                skipped["malformed_document"] += 1
                continue
            examples.append(Example(row.source, row.external_id, row.label, row.content_sha256, text))
    return examples, skipped


def promotion_decision(
    candidate: dict[str, Any], champion: dict[str, Any] | None, target_precision: float
) -> tuple[bool, str]:
    """Whether a candidate with held-out ``candidate`` metrics replaces the champion whose
    metrics on the same examples are ``champion`` (None: there is no champion), and why."""
    precision = candidate.get("accepted_precision")
    if precision is not None and precision < target_precision:
        return False, f"accepted precision {precision:.4f} is below the target {target_precision:.4f}"
    if champion is None:
        return True, "the first model: no champion yet"
    mine, theirs = candidate.get("macro_f1") or 0.0, champion.get("macro_f1") or 0.0
    if mine > theirs:
        return True, f"macro-F1 {mine:.4f} beats the champion's {theirs:.4f} on the same held-out examples"
    return False, f"macro-F1 {mine:.4f} does not beat the champion's {theirs:.4f} on the same held-out examples"


def train_candidate(
    engine: sa.Engine,
    payloads: PayloadStore,
    *,
    taxonomy_names: Sequence[str],
    taxonomy_sha256: str,
    settings: TrainSettings = DEFAULT_SETTINGS,
    actor: str,
) -> TrainReport:
    """Train a candidate from the ledger's examples, score the champion on the same held-out
    examples, store the candidate and promote it by the rule (module docstring). The same
    examples, taxonomy and settings again make the same version, which is not stored twice.

    :raises triage.learning.training.TrainingRefused: too few examples to make a model.
    """
    examples, skipped = load_training_examples(engine, payloads, taxonomy_names)
    candidate = train(examples, taxonomy_sha256=taxonomy_sha256, settings=settings)
    champion: LoadedModel | None
    try:
        champion = load_champion(engine)
    except NoChampion:
        champion = None
    champion_metrics = None
    if champion is not None and champion.version != candidate.version:
        _, champion_metrics = evaluate_model(champion.model, candidate.holdout, champion.thresholds)
    promote_it, reason = promotion_decision(candidate.metrics, champion_metrics, settings.target_precision)
    new = _store(engine, candidate, actor)
    if champion is not None and champion.version == candidate.version:
        promote_it, reason = False, "the same model as the champion: nothing new to train on"
    promoted = False
    if promote_it and new:
        promoted = bool(promote(engine, candidate.version, actor=actor, reason=reason))
    status = _status(engine, candidate.version)
    return TrainReport(
        version=candidate.version,
        new=new,
        status=status,
        promoted=promoted,
        reason=reason if new else f"already trained ({status}): the same examples, taxonomy and settings",
        metrics=candidate.metrics,
        champion_version=None if champion is None else champion.version,
        champion_metrics=champion_metrics,
        label_counts=candidate.label_counts,
        thresholds=candidate.thresholds,
        skipped=skipped,
        params=candidate.params,
    )


def _store(engine: sa.Engine, candidate: TrainedModel, actor: str) -> bool:
    row = {
        "version": candidate.version,
        "status": "candidate",
        "taxonomy_sha256": candidate.taxonomy_sha256,
        "training_set_sha256": candidate.training_set_sha256,
        "label_counts": candidate.label_counts,
        "metrics": candidate.metrics,
        "thresholds": candidate.thresholds,
        "target_precision": candidate.target_precision,
        "params": candidate.params,
        "artifact": candidate.artifact,
        "artifact_sha256": candidate.artifact_sha256,
        "created_by": actor,
    }
    return JobStore(engine).learning.add_model(row)


def _status(engine: sa.Engine, version: str) -> str:
    return str(JobStore(engine).learning.model_status(version))


def promote(engine: sa.Engine, version: str, *, actor: str, reason: str) -> dict[str, str]:
    """Make ``version`` champion (the champion before it retires), as ``actor`` for ``reason``.

    :raises UnknownModel: no such version, or it is the champion already.
    """
    changed = JobStore(engine).learning.promote(version, actor=actor, reason=reason)
    if version not in changed:
        raise UnknownModel(
            f"no model {version!r} to promote (unknown, or the champion already): see triage models list"
        )
    return changed


def list_models(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every version, newest first, without artifacts."""
    return JobStore(engine).learning.models()


def _loaded(row: Any) -> LoadedModel:
    model = LinearTextModel.from_bytes(bytes(row.artifact), row.artifact_sha256)
    return LoadedModel(row.version, row.status, model, _thresholds(row.thresholds, model), float(row.target_precision))


def _thresholds(stored: Any, model: LinearTextModel) -> dict[str, float | None]:
    """A row's thresholds, checked as its artifact is: a label of the model's each, a number in
    [0, 1] or null (never auto-accepts). A threshold of any other kind would accept every answer
    (a negative one), none, or crash the first classification (a string).

    :raises ArtifactRefused: anything else.
    """
    if not isinstance(stored, dict) or not set(stored) <= set(model.labels):
        raise ArtifactRefused("the model's thresholds are not an object over its labels")
    thresholds: dict[str, float | None] = {}
    for label, value in stored.items():
        if value is not None and (type(value) not in (int, float) or not 0.0 <= value <= 1.0):
            raise ArtifactRefused(f"the model's threshold of {label!r} is not null or a number within [0, 1]")
        thresholds[label] = None if value is None else float(value)
    return thresholds


def champion_version(engine: sa.Engine) -> str | None:
    """The champion's version (its artifact not read); None: there is none."""
    return JobStore(engine).learning.champion_version()


def resolve_classifier(name: str, engine: sa.Engine) -> str:
    """The classifier a run or intake asks for by ``name``, with ``auto`` made concrete: ``learned``
    when the registry has a champion, else ``keyword``. Any other name is itself. Together with
    the run's config and the taxonomy, the champion's version is all the outcome depends on."""
    return concrete_classifier(name, champion_version(engine) if name == "auto" else None)


def concrete_classifier(name: str, champion: str | None) -> str:
    """:func:`resolve_classifier` for a champion version already read (None: no champion)."""
    if name != "auto":
        return name
    return "keyword" if champion is None else "learned"


def load_champion(engine: sa.Engine) -> LoadedModel:
    """The champion, its artifact verified against its SHA-256 and read without pickle.

    :raises NoChampion: there is none.
    :raises triage.learning.model.ArtifactRefused: its artifact is tampered with or unreadable.
    """
    row = JobStore(engine).learning.champion()
    if row is None:
        raise NoChampion(
            "no learned model is champion yet: train one with `triage train` (or trigger the train_classifier DAG)"
        )
    return _loaded(row)


def load_model(engine: sa.Engine, version: str) -> LoadedModel:
    """The version ``version`` (any status), verified as :func:`load_champion`.

    :raises UnknownModel: no such version.
    """
    row = JobStore(engine).learning.model(version)
    if row is None:
        raise UnknownModel(f"no model {version!r}: see triage models list")
    return _loaded(row)
