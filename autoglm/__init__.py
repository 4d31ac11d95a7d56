"""Open-AutoGLM: GPU monitoring and autoscaling for inference fleets."""

__version__ = "0.1.0"
