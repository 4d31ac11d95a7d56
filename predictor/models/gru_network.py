"""The torch half of :class:`~predictor.models.sequence.SequenceModel`: its network and the
copies of its weights that training keeps.

A module of its own so that torch, seconds of CPU to import, is loaded only by a process that
trains a GRU (offered on request), not by every process that imports the model catalog.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class GRUNetwork(nn.Module):
    """A GRU over the recent window; a linear head over its last state and the extra features
    maps them to every horizon at once."""

    gru: nn.GRU
    head: nn.Linear

    def __init__(self, hidden: int, extra: int, horizons: int) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size=1, hidden_size=hidden, batch_first=True)
        self.head = nn.Linear(hidden + extra, horizons)

    def forward(self, window: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(window.unsqueeze(-1))
        return self.head(torch.cat([h[-1], extra], dim=1))


def inference_weights(net: GRUNetwork) -> tuple[np.ndarray, ...]:
    """The GRU's and head's weights as float64 arrays (gates in torch's order: reset, update,
    candidate). One forecast per update runs them in numpy: a torch call per step costs
    several times the arithmetic of so small a net."""
    gru = net.gru
    return tuple(
        t.detach().numpy().astype(float)
        for t in (
            gru.get_parameter("weight_ih_l0")[:, 0],
            gru.get_parameter("weight_hh_l0"),
            gru.get_parameter("bias_ih_l0"),
            gru.get_parameter("bias_hh_l0"),
            net.head.weight,
            net.head.bias,
        )
    )


def weights_copy(net: nn.Module) -> dict[str, torch.Tensor]:
    """A snapshot of the weights, to return to after later epochs do worse on the holdout."""
    return {k: v.clone() for k, v in net.state_dict().items()}


def same_shape(old: nn.Module, new: nn.Module) -> bool:
    """Whether ``old``'s weights can start ``new``'s training (the features still match)."""
    old_state, new_state = old.state_dict(), new.state_dict()
    return all(old_state[k].shape == v.shape for k, v in new_state.items())
