"""A small GRU trained on the series itself, on CPU, in a fraction of a second.

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

Cost: selection refits every candidate several times, so training stops once the holdout has
not improved for ``patience`` optimiser steps, and a refit of the same model may start from its
previous weights (kept only if they beat the copy on the new holdout) and then takes at most
``warm_steps``. Forecasts run the trained weights in numpy: calling torch for so small a net
costs several times the arithmetic; a replay runs every origin's window through them side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.models.base import ForecastModel

if TYPE_CHECKING:
    from predictor.models.gru_network import GRUNetwork

MIN_SAMPLES = 32
MIN_HOLDOUT = 8


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
        patience: int = 24,
        warm_steps: int = 20,
        **kwargs,
    ) -> None:
        self.window = window
        self.holdout_fraction = holdout_fraction
        self.patience = patience
        self.warm_steps = warm_steps
        self.trained = False  # False: training did not beat the seasonal copy on the holdout
        self.all_periods = tuple(sorted(p for p in periods if p >= 2))
        self.periods: tuple[int, ...] = ()
        self.hidden = hidden
        self.epochs = epochs
        self.max_steps = max_steps
        self.learning_rate = learning_rate
        self.seed = seed
        self.scale = 1.0
        self.net: GRUNetwork | None = None
        self._weights: tuple[np.ndarray, ...] | None = None
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
        # torch costs seconds of CPU to import: paid only by a process that trains a GRU.
        import torch

        from predictor.models.gru_network import (
            GRUNetwork,
            inference_weights,
            same_shape,
            weights_copy,
        )

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
        net = GRUNetwork(self.hidden, extra.shape[1], self.max_horizon)
        with torch.no_grad():
            net.head.weight.zero_()
            net.head.bias.zero_()
            # Start from the longest seasonal copy, or from the last value.
            anchor = 1 + (len(self.periods) - 1) * self.max_horizon if self.periods else 0
            for h in range(self.max_horizon):
                column = anchor + h if self.periods else 0
                net.head.weight[h, self.hidden + column] = 1.0
        starts = [(False, weights_copy(net))]
        # A refit of the same model may start from its previous weights instead (when the
        # features still match): a few steps then adapt them to the new points.
        last_net = self.net
        warm = last_net is not None and same_shape(last_net, net)
        if warm and last_net is not None:
            starts.append((True, weights_copy(last_net)))
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

        best_loss, best_state, from_previous = np.inf, starts[0][1], False
        for previous, state in starts:
            net.load_state_dict(state)
            loss = holdout_loss()
            if loss < best_loss:
                best_loss, best_state, from_previous = loss, state, previous
        net.load_state_dict(best_state)
        self.trained = from_previous and self.trained
        # A few epochs capped at max_steps (fewer from warm weights), stopped once the holdout
        # has not improved for ``patience`` optimiser steps (counted in steps, not epochs, so a
        # long series with many batches per epoch gets no more chances than a short one).
        batch = 128
        steps, improved_at = 0, 0
        max_steps = min(self.max_steps, self.warm_steps) if warm else self.max_steps
        for _ in range(self.epochs):
            if steps >= max_steps or steps - improved_at >= self.patience:
                break
            order = torch.randperm(n_train, generator=generator)
            for start in range(0, n_train, batch):
                if steps >= max_steps:
                    break
                idx = order[start : start + batch]
                optimiser.zero_grad()
                loss = (net(x_w[idx], x_e[idx]) - t[idx]).abs().mean()
                loss.backward()
                optimiser.step()
                steps += 1
            loss = holdout_loss()
            if loss < best_loss:
                best_loss, self.trained, improved_at = loss, True, steps
                best_state = weights_copy(net)
        net.load_state_dict(best_state)
        net.eval()
        self.net = net
        self._weights = inference_weights(net)

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """The trained net in numpy, every origin's window through the GRU side by side."""
        assert self._weights is not None
        windows, extra = self._features(y / self.scale, origins)
        w_ih, w_hh, b_ih, b_hh, head_w, head_b = self._weights
        n = self.hidden
        if not head_w[:, :n].any():  # the untrained start: the seasonal copy, no recurrence
            return (extra @ head_w[:, n:].T + head_b) * self.scale
        inputs = windows[:, :, None] * w_ih + b_ih  # every step's input gates at once
        h = np.zeros((len(origins), n))
        for step in range(windows.shape[1]):
            gi = inputs[:, step]
            gh = h @ w_hh.T + b_hh
            gates = 1.0 / (1.0 + np.exp(-(gi[:, : 2 * n] + gh[:, : 2 * n])))
            reset, update = gates[:, :n], gates[:, n:]
            candidate = np.tanh(gi[:, 2 * n :] + reset * gh[:, 2 * n :])
            h = (1.0 - update) * candidate + update * h
        return (np.concatenate([h, extra], axis=1) @ head_w.T + head_b) * self.scale
