"""GPU exporter: NVML (or simulated GPUs) to Prometheus, with dcgm-exporter's metric names."""
