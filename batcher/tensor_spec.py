"""A model's signature, one tensor at a time, with no torch in sight.

The protocol codec (:mod:`batcher.oip`) checks requests against it, and the front worker
processes (:mod:`batcher.front_worker`) run that codec without the model, so the signature lives
apart from :mod:`batcher.model` (which imports torch) and a worker starts without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of the model's signature, per item (without the batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def metadata(self) -> dict[str, Any]:
        """KServe v2 tensor metadata: the shape includes the batch dimension as -1."""
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}
