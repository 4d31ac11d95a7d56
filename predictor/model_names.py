"""The names of the catalogue's models, without the models: checking a ``models:`` list or a
``--models`` flag needs no torch or statsmodels (:mod:`predictor.models.catalog` builds them)."""

from __future__ import annotations

from collections.abc import Sequence

DAY = 86400.0
WEEK = 7 * DAY
SEASON_NAMES = {DAY: "daily", WEEK: "weekly"}
LEARNED = (
    "seasonal_level",
    "seasonal_blend",
    "seasonal_mean",
    "recent_level",
    "ets_log",
    "mstl",
    "autoregressive",
    "calendar",
    "boosted",
    "hierarchy",
    "gru",
    "ensemble",
    "ensemble_trimmed",
    "combination",
    "tracking",
)


def season_name(seconds: float) -> str:
    return SEASON_NAMES.get(float(seconds), f"{int(seconds)}s")


def known_models(seasons_seconds: Sequence[float]) -> list[str]:
    """Every model name the catalog can offer for these seasons, given enough history."""
    seasonal = [f"seasonal_naive_{season_name(s)}" for s in sorted(seasons_seconds)]
    return ["naive", *seasonal, *LEARNED]
