"""``triage evaluate``: a classifier scored on a labelled file, the same way for every classifier.

The file is the import format (:mod:`triage.learning.examples`); its refused lines are counted
and left out. The learned classifier is scored at its own per-label thresholds; the keyword
classifier at the run's ``confidence_threshold`` (the default of ``classify_documents``), for
every label. Coverage is the share of documents that would be accepted without a person, the
accepted precision how often those labels are right.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from triage.classifiers.base import ClassifyRequest
from triage.learning.examples import LabelledDocument
from triage.learning.metrics import Prediction, score

__all__ = ["evaluate", "keyword_predictor", "render"]

Predict = Callable[[str], tuple[str | None, float]]


def keyword_predictor(classifier: Any) -> Predict:
    """A keyword classifier's answers as ``(label, confidence)``."""

    def predict(text: str) -> tuple[str | None, float]:
        output = classifier.classify(ClassifyRequest("", "", "", "", 1, text))
        return output.label, output.confidence

    return predict


def evaluate(
    examples: Sequence[LabelledDocument],
    predict: Predict,
    thresholds: dict[str, float | None],
    *,
    model_version: str,
    refused: int = 0,
) -> dict[str, Any]:
    """The metrics of ``predict`` on ``examples`` at ``thresholds`` (JSON-ready), with the
    inference rate on this process's CPU."""
    started = time.process_time()
    predictions = [Prediction(e.label, *predict(e.payload.text)) for e in examples]
    cpu = time.process_time() - started
    result = score(predictions, thresholds)
    return {
        "model_version": model_version,
        **result,
        "refused_lines": refused,
        "docs_per_cpu_second": round(len(predictions) / cpu) if cpu > 0 else None,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def render(result: dict[str, Any]) -> str:
    """The metrics as text for a terminal."""
    lines = [
        f"model {result['model_version']}: {result['n']} examples"
        + (f" ({result['refused_lines']} lines refused)" if result["refused_lines"] else ""),
        f"accuracy {_percent(result['accuracy'])} · macro-F1 {_percent(result['macro_f1'])} · "
        f"coverage {_percent(result['coverage'])} at accepted precision {_percent(result['accepted_precision'])}",
        "",
        f"{'label':<28}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>9}{'accepted':>10}{'at prec.':>10}",
    ]
    for label, row in result["per_label"].items():
        lines.append(
            f"{label:<28}{_percent(row['precision']):>10}{_percent(row['recall']):>10}"
            f"{_percent(row['f1']):>10}{row['support']:>9}{row.get('accepted', '-'):>10}"
            f"{_percent(row.get('accepted_precision')):>10}"
        )
    if result["confused"]:
        lines += ["", "most confused (truth -> predicted):"]
        lines += [f"  {c['truth']} -> {c['predicted']}: {c['count']}" for c in result["confused"]]
    return "\n".join(lines)
