"""The demo model's largest batch: the largest power of two whose kernel fits inside the SLO."""

from __future__ import annotations

import pytest

from stack.kernel import MAX_BATCH, kernel_seconds, largest_batch_within


@pytest.mark.parametrize(
    ("slo", "batch"), [(0.001, 1), (0.05, 2), (0.25, 8), (0.5, 16), (1.0, 32), (60.0, MAX_BATCH)]
)
def test_the_largest_batch_fits_the_slo_and_the_next_does_not(slo: float, batch: int) -> None:
    assert largest_batch_within(slo) == batch
    assert batch == 1 or kernel_seconds(batch) <= slo
    assert batch == MAX_BATCH or kernel_seconds(2 * batch) > slo
