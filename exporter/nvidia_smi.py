"""Does the exporter agree with nvidia-smi? The fields both report, their tolerances, and the
comparison of readings taken side by side.

A tolerance allows for the two tools sampling a moving value at different instants (and averaging
power and utilization over different windows); totals, limits and memory clock must agree almost
exactly. ``bench/exporter_gpu.py`` runs the check on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Check:
    """One field compared: nvidia-smi's query name, the exporter's DCGM name, the tolerance."""

    smi: str
    dcgm: str
    absolute: float
    relative: float = 0.0  # of nvidia-smi's value, added to the absolute allowance

    def allowed(self, reference: float) -> float:
        return self.absolute + self.relative * abs(reference)


CHECKS = (
    Check("memory.total", "DCGM_FI_DEV_FB_TOTAL", 1),
    Check("memory.used", "DCGM_FI_DEV_FB_USED", 64, 0.01),
    Check("temperature.gpu", "DCGM_FI_DEV_GPU_TEMP", 2),
    Check("temperature.memory", "DCGM_FI_DEV_MEMORY_TEMP", 2),
    Check("power.draw", "DCGM_FI_DEV_POWER_USAGE", 10, 0.10),
    Check("power.limit", "DCGM_FI_DEV_POWER_MGMT_LIMIT", 1),
    Check("clocks.sm", "DCGM_FI_DEV_SM_CLOCK", 30, 0.10),
    Check("clocks.mem", "DCGM_FI_DEV_MEM_CLOCK", 1, 0.01),
    Check("utilization.gpu", "DCGM_FI_DEV_GPU_UTIL", 15),
)
SMI_FIELDS = ("uuid", *(c.smi for c in CHECKS))


def parse_nvidia_smi(text: str) -> dict[str, dict[str, float]]:
    """``--format=csv,noheader,nounits`` rows of SMI_FIELDS -> {uuid: {field: value}}.

    ``[N/A]`` and ``[Not Supported]`` leave the field out (nothing to compare).
    """
    readings: dict[str, dict[str, float]] = {}
    for line in text.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi row has {len(cells)} cells, expected {len(SMI_FIELDS)}")
        uuid, values = cells[0], {}
        for name, cell in zip(SMI_FIELDS[1:], cells[1:], strict=True):
            try:
                values[name] = float(cell)
            except ValueError:
                continue
        readings[uuid] = values
    return readings


def parse_exporter(text: str) -> dict[str, dict[str, float]]:
    """Whole-GPU series of /metrics (dcgm naming) -> {UUID: {DCGM field: value}}."""
    wanted = {c.dcgm for c in CHECKS}
    readings: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if "GPU_I_ID" in sample.labels:  # a MIG instance: nvidia-smi rows are whole GPUs
                continue
            readings.setdefault(sample.labels["UUID"], {})[family.name] = sample.value
    return readings


@dataclass
class FieldResult:
    """One field of one GPU over the samples: its worst difference and whether all were within."""

    field: str
    gpu: str
    samples: int = 0
    worst_difference: float = 0.0
    allowed_at_worst: float = 0.0
    within: bool = True


def compare(
    pairs: list[tuple[Mapping[str, Mapping[str, float]], Mapping[str, Mapping[str, float]]]],
) -> list[FieldResult]:
    """Worst difference per (field, GPU) over (nvidia-smi, exporter) sample pairs."""
    results: dict[tuple[str, str], FieldResult] = {}
    for smi, exported in pairs:
        for uuid, smi_values in smi.items():
            ours = exported.get(uuid, {})
            for check in CHECKS:
                if check.smi not in smi_values:
                    continue
                result = results.setdefault((check.dcgm, uuid), FieldResult(check.dcgm, uuid))
                reference = smi_values[check.smi]
                if check.dcgm not in ours:
                    result.within = False  # nvidia-smi has it, the exporter does not
                    continue
                difference = abs(ours[check.dcgm] - reference)
                result.samples += 1
                if difference >= result.worst_difference:
                    result.worst_difference = difference
                    result.allowed_at_worst = check.allowed(reference)
                result.within &= difference <= check.allowed(reference)
    return list(results.values())
