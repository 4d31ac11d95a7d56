"""The immutable histogram behind ``autoglm_exporter_collection_seconds``."""

from __future__ import annotations

import pytest

from exporter.histogram import Histogram


def test_a_value_on_a_bound_counts_in_that_bucket_and_large_values_only_in_inf():
    empty = Histogram.empty([0.1, 1.0])
    full = empty.observe(0.1).observe(0.5).observe(7.0)
    assert full.cumulative() == [(0.1, 1), (1.0, 2), (float("inf"), 3)]
    assert (full.count, full.sum) == (3, pytest.approx(7.6))
    assert empty.cumulative() == [(0.1, 0), (1.0, 0), (float("inf"), 0)]  # observe copies


@pytest.mark.parametrize("bounds", [[], [1.0, 0.5], [0.5, 0.5]])
def test_bounds_must_be_given_and_strictly_ascending(bounds):
    with pytest.raises(ValueError, match="ascending"):
        Histogram.empty(bounds)
