"""What a reviewer sees of a job before deciding: its ids, why it is in review, what the model
said and where the document is (``payload_ref``). Never the document's text: the reviewer opens
the payload through its reference when they need it, and nothing here lands in a log."""

from __future__ import annotations

import json
from typing import Any

from triage import markdown as md
from triage.jobs.vocabulary.models import ReviewCase

LABEL_OPTION = "Label: "
REQUEUE_OPTION = "Requeue"
REJECT_OPTION = "Reject"


def options(label_names: list[str]) -> list[str]:
    """One option per label, then requeue and reject: one choice is always a whole decision,
    so an answer can never be "label" without a label."""
    return [f"{LABEL_OPTION}{name}" for name in label_names] + [REQUEUE_OPTION, REJECT_OPTION]


def decision_of(option: str) -> tuple[str, str | None]:
    """``(decision, label)`` of a chosen option."""
    if option.startswith(LABEL_OPTION):
        return "label", option.removeprefix(LABEL_OPTION)
    if option in (REQUEUE_OPTION, REJECT_OPTION):
        return option.lower(), None
    raise ValueError(f"not a review option: {option!r}")


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(case: ReviewCase) -> dict[str, str]:
    """``{"job_id", "subject", "body"}`` (Markdown body) of a case, JSON-ready for XCom.

    Every value is escaped (:mod:`triage.markdown`): the external id, the review context and a
    model's label come from outside, and must stay inside their cell of the question.
    """
    if case.model_label is not None:
        confidence = f"{case.model_confidence:.2f}" if case.model_confidence is not None else "?"
        model = f"{md.code(case.model_label)} (confidence {confidence}, outcome {md.text(case.model_outcome)})"
    else:
        model = f"no label (outcome {md.text(case.model_outcome)})" if case.model_outcome else "no answer recorded"
    rows = [
        ("job", md.code(case.job_id)),
        ("document", f"{md.code(case.source)} / {md.code(case.external_id)}"),
        ("payload", md.code(case.payload_ref)),
        ("correlation id", md.code(case.correlation_id)),
        ("batch, step", f"{md.code(case.batch_key)}, {md.code(case.step)}"),
        ("in review since", f"{case.opened_at:%Y-%m-%d %H:%M:%S %Z}"),
        ("reason", md.code(case.reason) + (f" ({md.text(case.error_class)})" if case.error_class else "")),
        (
            "attempts",
            f"{case.attempt - case.attempt_base} of {case.max_attempts - case.attempt_base} "
            f"({case.attempt} in all); requeued {case.replays} times before",
        ),
        ("model said", model),
    ]
    if case.last_error:
        rows.append(("last error", md.text(_short(case.last_error))))
    if case.context:
        rows.append(("context", md.code(_short(dict(case.context)))))
    body = "\n".join(
        [
            "| | |",
            "|---|---|",
            *[f"| {k} | {md.in_table(v)} |" for k, v in rows],
            "",
            "Choose a label to complete the job, **Requeue** to run its step again (a fresh attempt budget), or "
            "**Reject** to fail it for good. Your Airflow user is recorded as the reviewer.",
        ]
    )
    subject = f"Review job {case.job_id}: {md.visible(case.reason)}"
    return {"job_id": str(case.job_id), "subject": subject, "body": body}
