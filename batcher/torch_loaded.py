"""torch, only where this process has imported it already.

Why: the batcher serves any batch callable, not only torch modules, and importing torch costs
seconds of CPU and a few hundred MB at start (docs/batcher.md, "Models that are not torch
modules"). A model that is a torch module has imported torch before the batcher looks at it, so
"is this a tensor", "did CUDA run out of memory" and "what does the caching allocator hold" can be
answered without importing it: where torch is not loaded, nothing of the model's is a tensor and
no CUDA context exists.
"""

from __future__ import annotations

import sys
from types import ModuleType


def loaded_torch() -> ModuleType | None:
    """The torch module if something in this process imported it, else None."""
    return sys.modules.get("torch")


def initialised_cuda() -> ModuleType | None:
    """``torch.cuda`` once this process has initialised CUDA, else None."""
    torch = loaded_torch()
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def set_torch_threads(threads: int) -> None:
    """``--torch-threads`` (0: torch's default), once a model is loaded: where no model is a
    torch module torch stays unloaded and there is nothing to set, and a model that runs in a
    child process (``--model-process``) sets its own. Call it on the thread that builds the
    model's executor, which reads the count to pass on to the thread that runs the batches."""
    torch = loaded_torch()
    if threads and torch is not None:
        torch.set_num_threads(threads)
