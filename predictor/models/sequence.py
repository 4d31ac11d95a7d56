"""A small GRU trained on the series itself, on CPU, in about a second.

It reads the last ``window`` points through a GRU and, next to its final hidden state, the
values one season before each target step ("anchors") and the last value. A linear head maps
them to all horizons at once (direct multi-horizon forecasting, no error feedback loop). The head
starts as the longest seasonal copy (or the last value without seasons) so that training on a
short series moves away from a sound baseline instead of from noise. The loss is L1, the
quantity WAPE measures. Values are divided by their mean magnitude so one learning rate fits
every series.

Short histories made it unstable (a few hundred samples, thousands of weights): the most recent
``holdout_fraction`` of the training origins is held out, the weights are kept from whichever
epoch did best on it, and the untrained start (the seasonal copy) counts as epoch zero, so
training that does not beat the copy on unseen points is thrown away. Seeds are fixed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from predictor.models.base import ForecastModel

MIN_SAMPLES = 32
MIN_HOLDOUT = 8


class _Net(nn.Module):
    def __init__(self, hidden: int, extra: int, horizons: int) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size=1, hidden_size=hidden, batch_first=True)
        self.head = nn.Linear(hidden + extra, horizons)

    def forward(self, window: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(window.unsqueeze(-1))
        return self.head(torch.cat([h[-1], extra], dim=1))


class SequenceModel(ForecastModel):
    """GRU over the recent window plus seasonal anchors; see the module docstring."""

    name = "gru"

    def __init__(
        self,
        max_horizon: int,
        window: int = 24,
        periods: tuple[int, ...] = (),
        hidden: int = 16,
        epochs: int = 15,
        max_steps: int = 150,
        learning_rate: float = 0.01,
        seed: int = 0,
        holdout_fraction: float = 0.2,
        **kwargs,
    ) -> None:
        self.window = window
        self.holdout_fraction = holdout_fraction
        self.trained = False  # False: training did not beat the seasonal copy on the holdout
        self.all_periods = tuple(sorted(p for p in periods if p >= 2))
        self.periods: tuple[int, ...] = ()
        self.hidden = hidden
        self.epochs = epochs
        self.max_steps = max_steps
        self.learning_rate = learning_rate
        self.seed = seed
        self.scale = 1.0
        self.net: _Net | None = None
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return self.window + self.max_horizon + MIN_SAMPLES + MIN_HOLDOUT

    def history_capacity(self) -> int:
        return max(self.window, *self.all_periods, 1)

    def _features(self, y: np.ndarray, origins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Input windows and extra features (last value, anchors) for forecasts made after
        observing ``y[:origin]``."""
        steps = np.arange(self.max_horizon)
        windows = y[origins[:, None] - self.window + np.arange(self.window)]
        extra = [y[origins - 1][:, None]]
        for m in self.periods:
            extra.append(y[origins[:, None] - m + steps % m])
        return windows, np.concatenate(extra, axis=1)

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        # Thousands of weights would memorise the replayed tail: train on the head only.
        y = y[:state_at]
        torch.manual_seed(self.seed)
        self.scale = float(np.mean(np.abs(y))) or 1.0
        z = y / self.scale
        self.periods = tuple(
            m
            for m in self.all_periods
            if len(z) - m - self.max_horizon >= MIN_SAMPLES + MIN_HOLDOUT
        )
        first = max(self.window, *self.periods, 1)
        origins = np.arange(first, len(z) - self.max_horizon + 1)
        windows, extra = self._features(z, origins)
        targets = z[origins[:, None] + np.arange(self.max_horizon)]
        net = _Net(self.hidden, extra.shape[1], self.max_horizon)
        with torch.no_grad():
            net.head.weight.zero_()
            net.head.bias.zero_()
            # Start from the longest seasonal copy, or from the last value.
            anchor = 1 + (len(self.periods) - 1) * self.max_horizon if self.periods else 0
            for h in range(self.max_horizon):
                column = anchor + h if self.periods else 0
                net.head.weight[h, self.hidden + column] = 1.0
        x_w = torch.tensor(windows, dtype=torch.float32)
        x_e = torch.tensor(extra, dtype=torch.float32)
        t = torch.tensor(targets, dtype=torch.float32)
        # Origins are in time order: the last ones are the holdout, unseen by the optimiser.
        n_train = len(t) - max(MIN_HOLDOUT, int(len(t) * self.holdout_fraction))
        optimiser = torch.optim.Adam(net.parameters(), lr=self.learning_rate)
        generator = torch.Generator().manual_seed(self.seed)

        def holdout_loss() -> float:
            with torch.no_grad():
                return float((net(x_w[n_train:], x_e[n_train:]) - t[n_train:]).abs().mean())

        best_loss = holdout_loss()
        best_state = {k: v.clone() for k, v in net.state_dict().items()}
        self.trained = False
        # A few epochs capped at max_steps: the cost stays bounded for long histories.
        batch = 128
        steps = 0
        for _ in range(self.epochs):
            if steps >= self.max_steps:
                break
            order = torch.randperm(n_train, generator=generator)
            for start in range(0, n_train, batch):
                if steps >= self.max_steps:
                    break
                idx = order[start : start + batch]
                optimiser.zero_grad()
                loss = (net(x_w[idx], x_e[idx]) - t[idx]).abs().mean()
                loss.backward()
                optimiser.step()
                steps += 1
            loss = holdout_loss()
            if loss < best_loss:
                best_loss, self.trained = loss, True
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
        net.load_state_dict(best_state)
        net.eval()
        self.net = net

    def _forecast_path(self) -> np.ndarray:
        assert self.net is not None
        z = self.history.values() / self.scale
        windows, extra = self._features(z, np.array([len(z)]))
        with torch.no_grad():
            out = self.net(
                torch.tensor(windows, dtype=torch.float32),
                torch.tensor(extra, dtype=torch.float32),
            )
        return out.numpy()[0].astype(float) * self.scale
