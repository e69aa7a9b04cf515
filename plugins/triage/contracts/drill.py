"""Failure-drill settings and the deterministic coin that drives them.

The drill (``make chaos``, the ``drill`` param of ``classify_documents``) injects faults into
classification and duplicates into retrieval. Every injected fault is a pure function of
``(seed, idempotency key, attempt)``, never of time or process, so a drill run can be replayed
and its expected outcome computed independently of the code under test.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DrillSettings", "drill_fraction"]

_RATE_TOLERANCE = 1e-9


class DrillSettings(BaseModel):
    """Rates of injected faults; all zero (the default) means no drill."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transient_error_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of attempts failing with a transient error."
    )
    permanent_error_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of attempts failing with a permanent error."
    )
    inconclusive_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of attempts returning a low confidence."
    )
    duplicate_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of documents the source delivers twice."
    )
    seed: int = Field(default=0, description="Seed of every drill decision.")
    kill_on: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="A document (its external_id, or its content sha256) whose classification SIGKILLs the "
        "worker process, every attempt: a poison document (segfault, OOM) for the poison-isolation drill.",
    )
    retry_after_seconds: float | None = Field(
        default=None,
        ge=0.0,
        le=900.0,
        description="Retry-After the injected transient errors carry, as a model's 429/503 would (none: no hint).",
    )

    @model_validator(mode="after")
    def _fault_rates_fit_in_one(self) -> DrillSettings:
        # The three fault rates partition one uniform draw per attempt, so they cannot exceed 1.
        total = self.transient_error_rate + self.permanent_error_rate + self.inconclusive_rate
        if total > 1.0 + _RATE_TOLERANCE:
            raise ValueError("transient_error_rate + permanent_error_rate + inconclusive_rate must be <= 1")
        return self

    @property
    def requested(self) -> bool:
        """Whether this is a drill at all: any rate above zero. The seed alone injects nothing
        (the synthetic source also draws its documents from it)."""
        return self.injects_faults or self.duplicate_rate > 0.0

    @property
    def injects_faults(self) -> bool:
        """Whether any classification fault is injected (duplicates concern sources only)."""
        rates = self.transient_error_rate + self.permanent_error_rate + self.inconclusive_rate
        return rates > 0.0 or self.kill_on is not None


def drill_fraction(seed: int, *parts: str | int) -> float:
    """A uniform number in ``[0, 1)`` determined only by ``seed`` and ``parts``.

    BLAKE2b over a length-prefixed, type-tagged encoding, so ``("a", "bc")`` and ``("ab", "c")``
    or ``1`` and ``"1"`` never collide, and the result is the same in every process (Python's
    ``hash()`` is salted per process and would not be).
    """
    digest = hashlib.blake2b(digest_size=8, person=b"triage-drill")
    for item in (seed, *parts):
        tag = b"i" if isinstance(item, int) else b"s"
        encoded = str(item).encode("utf-8", "surrogatepass")
        digest.update(tag + len(encoded).to_bytes(4, "big") + encoded)
    # 53 bits: exactly representable as a float, and strictly below 1.0.
    return (int.from_bytes(digest.digest(), "big") >> 11) / float(1 << 53)
