"""Median of several models: errors of different kinds partly cancel, and one bad member
cannot drag the forecast far (unlike a mean)."""

from __future__ import annotations

import numpy as np

from predictor.models.base import ForecastModel


class MedianEnsemble(ForecastModel):
    """Point forecast = the median of the members' point forecasts at each horizon."""

    def __init__(self, members: list[ForecastModel], name: str = "ensemble", **kwargs) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two members")
        self.members = members
        self.name = name
        super().__init__(members[0].max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return max(m.min_points for m in self.members) + 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        for member in self.members:
            member.fit_until(y, state_at)

    def _advance(self, value: float) -> None:
        for member in self.members:
            member.update(value)

    def parts(self) -> dict[str, ForecastModel]:
        return {m.name: m for m in self.members}

    def _forecast_path(self) -> np.ndarray:
        return np.median(np.stack([m.latest_path() for m in self.members]), axis=0)
