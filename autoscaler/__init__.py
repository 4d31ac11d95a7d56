"""GPUAutoscaler: the HPA algorithm plus a predictive candidate, a controller and a simulator."""
