"""Which auto-accepted jobs are audit samples: a pure function of the job id and the rate."""

from __future__ import annotations

import uuid

import pytest
from uuid6 import uuid7

from triage.jobs.audit_samples import audit_fraction, is_audit_sample

IDS = [uuid7() for _ in range(20_000)]


@pytest.mark.parametrize("rate", [0.02, 0.1, 0.5], ids=lambda r: f"rate-{r}")
def test_the_share_sampled_is_the_rate(rate: float) -> None:
    """Time-ordered ids (UUIDv7, as the ledger's) sample as uniformly as random ones: within
    four standard deviations of the binomial."""
    share = sum(is_audit_sample(i, rate) for i in IDS) / len(IDS)
    sd = (rate * (1 - rate) / len(IDS)) ** 0.5
    assert abs(share - rate) < 4 * sd


def test_a_retry_samples_the_same_jobs() -> None:
    first = [i for i in IDS if is_audit_sample(i, 0.02)]
    again = [i for i in map(lambda j: uuid.UUID(str(j)), IDS) if is_audit_sample(i, 0.02)]
    assert first == again
    assert audit_fraction(IDS[0]) == audit_fraction(uuid.UUID(bytes=IDS[0].bytes))


def test_a_higher_rate_keeps_every_job_a_lower_one_sampled() -> None:
    """Raising the rate adds samples, never swaps them: the fraction is compared with the rate."""
    low = {i for i in IDS if is_audit_sample(i, 0.02)}
    high = {i for i in IDS if is_audit_sample(i, 0.05)}
    assert low < high


@pytest.mark.parametrize(("rate", "expected"), [(0.0, 0), (1.0, len(IDS))], ids=["none", "all"])
def test_the_bounds(rate: float, expected: int) -> None:
    assert sum(is_audit_sample(i, rate) for i in IDS) == expected
