"""Adaptive dynamic batching runtime for torch models, speaking the Open Inference Protocol."""
