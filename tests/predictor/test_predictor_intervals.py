"""The upper bound covers what its quantile promises, on noise of known distributions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from predictor.backtest import rolling_origin
from predictor.intervals import ResidualWindow
from predictor.models import ETSModel, NaiveModel


def test_window_quantile_matches_the_known_distribution():
    rng = np.random.default_rng(0)
    window = ResidualWindow(max_horizon=1, size=4000)
    for e in rng.normal(0, 2, 4000):
        window.add(1, e)
    assert window.quantile(1, 0.9) == pytest.approx(2 * stats.norm.ppf(0.9), rel=0.06)


def test_window_forgets_old_errors_and_borrows_from_shorter_horizons():
    window = ResidualWindow(max_horizon=3, size=3)
    for e in [100, 100, 1, 2, 3]:
        window.add(1, e)
    assert list(window.errors(1)) == [1, 2, 3]
    assert window.quantile(3, 0.5) == window.quantile(1, 0.5)
    assert ResidualWindow(2).quantile(2, 0.9) == 0.0


@pytest.mark.parametrize(
    "noise",
    [
        lambda rng, n: rng.normal(0, 5, n),
        lambda rng, n: rng.exponential(5, n),  # skewed, like bursts of load
    ],
)
@pytest.mark.parametrize("factory", [lambda: NaiveModel(3), lambda: ETSModel(3, log=False)])
def test_backtest_coverage_of_the_0_9_upper_bound_is_near_90_percent(noise, factory):
    rng = np.random.default_rng(7)
    y = 100 + noise(rng, 2400)
    result = rolling_origin(factory, y, [1, 3], test_start=800, quantile=0.9)
    for h in (1, 3):
        assert 86 <= result.coverage[h] <= 94
