"""The taxonomy: the closed set of labels a classifier may return.

It lives in ``include/taxonomy.yaml`` (data, not code) so it can be reviewed and changed without
a release. Its content hash is part of every classifier version, and the classifier version is
part of the idempotency key: a new taxonomy is new work, never a silent mix of old and new
labels.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from triage.contracts.documents import canonical_json_bytes

__all__ = [
    "TAXONOMY_ENV",
    "Label",
    "Taxonomy",
    "TaxonomyError",
    "default_taxonomy_path",
]

TAXONOMY_ENV: Final = "TRIAGE_TAXONOMY"
"""Environment variable naming another taxonomy file than ``include/taxonomy.yaml``."""

_LABEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_YAML_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser under the same safe constructor (plain data only, nothing that runs code) when
PyYAML was built with it: the same mapping at ~0.5 ms a load instead of ~6 ms, paid by every
task that loads the taxonomy (retrieve twice)."""


class TaxonomyError(ValueError):
    """The taxonomy file is missing, unreadable or does not describe a valid taxonomy."""


class Label(BaseModel):
    """One label: a stable snake_case ``name``, what it means, and keywords that suggest it.

    Keywords are optional: the learned and llm classifiers do without them; the keyword
    classifier refuses a taxonomy where a label has none (:class:`~triage.classifiers.keyword.KeywordClassifier`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    description: str = Field(min_length=1)
    keywords: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _snake_case(cls, value: str) -> str:
        # Names are stored in the database and compared with model output: keep them plain.
        if not _LABEL_NAME.fullmatch(value):
            raise ValueError("label names are snake_case: [a-z][a-z0-9_]*, at most 64 characters")
        return value

    @field_validator("keywords")
    @classmethod
    def _normalised_keywords(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Matching is case-insensitive; normalising here makes the content hash insensitive to
        # case and spacing too, so cosmetic edits do not invalidate earlier results.
        normalised = tuple(" ".join(keyword.lower().split()) for keyword in value)
        if any(not keyword for keyword in normalised):
            raise ValueError("keywords must not be blank")
        if len(set(normalised)) != len(normalised):
            raise ValueError("keywords of a label must be distinct")
        return normalised


class Taxonomy(BaseModel):
    """An ordered, closed set of labels; order breaks ties between equally scored labels."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    schema_version: Literal[1] = 1
    labels: tuple[Label, ...] = Field(min_length=1)

    @field_validator("labels")
    @classmethod
    def _unique_names(cls, value: tuple[Label, ...]) -> tuple[Label, ...]:
        names = [label.name for label in value]
        if len(set(names)) != len(names):
            raise ValueError("label names must be unique")
        return value

    @property
    def names(self) -> frozenset[str]:
        """The label names, for membership checks on classifier output."""
        return frozenset(label.name for label in self.labels)

    @property
    def content_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of the labels, independent of YAML formatting."""
        return hashlib.sha256(canonical_json_bytes(self.model_dump(mode="json"))).hexdigest()

    def label(self, name: str) -> Label:
        """The label called ``name``; :class:`KeyError` if the taxonomy has none."""
        for label in self.labels:
            if label.name == name:
                return label
        raise KeyError(name)

    @classmethod
    def from_mapping(cls, data: object) -> Taxonomy:
        """Validate parsed YAML/JSON data.

        :raises TaxonomyError: naming the offending fields (never their values).
        """
        if not isinstance(data, dict):
            raise TaxonomyError("a taxonomy is a mapping with a 'labels' list")
        # YAML gives lists; the model holds tuples (hashable, immutable). Convert the known
        # shapes only, leaving anything unexpected for validation to refuse.
        labels = data.get("labels")
        if isinstance(labels, list):
            data = {
                **data,
                "labels": tuple(
                    {**item, "keywords": tuple(item["keywords"])}
                    if isinstance(item, dict) and isinstance(item.get("keywords"), list)
                    else item
                    for item in labels
                ),
            }
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or '<root>'}: {error['msg']}"
                for error in exc.errors(include_url=False, include_input=False)
            )
            raise TaxonomyError(f"invalid taxonomy: {problems}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Taxonomy:
        """Read a taxonomy file (default: :func:`default_taxonomy_path`).

        :raises TaxonomyError: if the file is missing, is not YAML, or is not a valid taxonomy.
        """
        resolved = Path(path) if path is not None else default_taxonomy_path()
        try:
            raw = resolved.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TaxonomyError(f"cannot read taxonomy {resolved}: {exc}") from exc
        try:
            data = yaml.load(raw, Loader=_YAML_LOADER)
        except yaml.YAMLError as exc:
            raise TaxonomyError(f"taxonomy {resolved} is not valid YAML") from exc
        try:
            return cls.from_mapping(data)
        except TaxonomyError as exc:
            raise TaxonomyError(f"{resolved}: {exc}") from None


def default_taxonomy_path() -> Path:
    """``$TRIAGE_TAXONOMY`` if set, else ``<repo>/include/taxonomy.yaml``.

    The repository root is found from this file's location
    (``<repo>/plugins/triage/classifiers/taxonomy.py``), which holds both in a checkout and in
    the official Airflow image layout, where ``plugins/`` and ``include/`` are siblings.
    """
    override = os.environ.get(TAXONOMY_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "include" / "taxonomy.yaml"
