"""bench/minimal_batcher.py's model process answers with the model's own rows.

The minimal batcher is the serving bench's lower reference; with ``--model-process`` its batches
cross a pipe as raw bytes, and a reference that answered wrong rows (cut, reordered, or of another
dtype) would be cheaper than an honest server and make the batcher look worse than it is.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.batcher_serving import FEATURES
from bench.minimal_batcher import in_child, model_forward


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_model_process_answers_as_the_model_does() -> None:
    rows = np.random.default_rng(7).standard_normal((5, FEATURES), dtype=np.float32)
    in_thread, in_process = model_forward("cpu"), in_child("cpu")
    for batch in (rows[:1], rows):  # one row, then several in one batch
        got = in_process(batch)
        assert got.dtype == np.float32 and got.shape == (len(batch), FEATURES)
        np.testing.assert_allclose(got, in_thread(batch), rtol=1e-5, atol=1e-6)
