"""NVML's failures as the exporter reports them: a stable snake_case reason per error code."""

from __future__ import annotations

import pynvml

# NVML return code -> snake_case reason, from the binding's own NVML_ERROR_* names
_REASONS: dict[int, str] = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
}


class NoDriverError(RuntimeError):
    """NVML could not be initialized: no NVIDIA driver (or no GPU) on this machine."""


def error_reason(exc: pynvml.NVMLError) -> str:
    """``NVMLError_NoPermission`` -> ``no_permission``: a stable label value for the error."""
    return _REASONS.get(exc.value, f"nvml_error_{exc.value}")


def code_reason(code: int) -> str:
    """The reason for a bare NVML return code (a per-metric result rather than a raised error)."""
    return _REASONS.get(code, "unknown")
