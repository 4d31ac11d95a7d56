"""Trace-driven fleet simulator: replays requests through a scaling policy and the real core."""
