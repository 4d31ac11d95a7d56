"""``autoglm up``: the exporter, batcher workers, predictor and autoscaler on one machine."""
