"""Binning event rows, filling gaps, counters that reset, grid alignment."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.series import align_to_grid, bin_events, counter_increase, fill_gaps


def test_events_are_counted_per_bin_including_empty_bins():
    times = ["2024-01-01 00:00:10", "2024-01-01 00:00:50", "2024-01-01 00:03:00"]
    counts = bin_events(times, "1min")
    assert list(counts) == [2, 0, 0, 1]
    assert counts.index[0] == pd.Timestamp("2024-01-01 00:00:00")


def test_values_are_summed_or_averaged_and_empty_mean_bins_are_nan():
    times = ["2024-01-01 00:00:10", "2024-01-01 00:00:50", "2024-01-01 00:02:00"]
    assert list(bin_events(times, "1min", [1, 3, 5], "sum")) == [4, 0, 5]
    mean = bin_events(times, "1min", [1, 3, 5], "mean")
    assert mean.iloc[0] == 2 and np.isnan(mean.iloc[1]) and mean.iloc[2] == 5
    with pytest.raises(ValueError, match="needs a value column"):
        bin_events(times, "1min", None, "mean")
    with pytest.raises(ValueError, match="bad frequency"):
        bin_events(times, "fortnightish")


def test_short_gaps_are_interpolated_long_ones_carried_and_edges_filled():
    y = np.array([np.nan, 1, np.nan, 3, np.nan, np.nan, np.nan, 9, np.nan])
    filled = fill_gaps(y, max_interpolate=2)
    assert list(filled) == [1, 1, 2, 3, 3, 3, 3, 9, 9]
    with pytest.raises(ValueError, match="no finite value"):
        fill_gaps(np.array([np.nan, np.nan]))


def test_counter_resets_count_as_restarts_from_zero():
    inc = counter_increase(np.array([10, 15, 3, 8]))
    assert np.isnan(inc[0]) and list(inc[1:]) == [5, 3, 5]


def test_samples_land_on_the_nearest_grid_point_and_holes_stay_nan():
    grid, values = align_to_grid([100.2, 159.9, 400], [1, 2, 3], 60, 100, 340)
    assert list(grid) == [100, 160, 220, 280, 340]
    assert values[0] == 1 and values[1] == 2 and np.isnan(values[2:]).all()
