"""The reference MLP as an MLServer custom runtime, for bench/batcher_serving.py's MLServer column.

Loaded by MLServer 1.7.1 from the separate venv ``bash bench/mlserver-venv`` makes; nothing in the
project imports it. It serves the very module the batcher serves (same class, seed and torch build,
one torch thread), and MLServer's adaptive batching (``max_batch_size``/``max_batch_time`` in the
model settings the bench writes) merges requests along the first dimension before ``predict``.
"""

from __future__ import annotations

import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from bench.reference_mlp import reference_mlp


class ReferenceMLP(MLModel):
    """``input`` FP32 [-1, 512] -> ``logits`` FP32 [-1, 512], as the batcher serves it."""

    async def load(self) -> bool:
        torch.set_num_threads(1)
        self._module = reference_mlp().eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with torch.inference_mode():
            logits = self._module(torch.from_numpy(rows)).numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("logits", logits)]
        )
