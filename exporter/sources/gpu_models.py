"""Specifications of the GPU models the simulated source can pretend to be.

Figures are the typical values of the SXM/PCIe board as ``nvidia-smi -q`` and NVIDIA's datasheets
report them (usable framebuffer, default power limit, maximum clocks, slowdown/shutdown
thresholds). Idle power and full-load temperature are typical of air-cooled servers. They only
need to be realistic enough that dashboards, alerts and autoscaling behave as they would on the
real part; VBIOS versions differ in the last digits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUModel:
    """What the simulator needs to know about a GPU model."""

    name: str  # as NVML reports it: the ``modelName`` label
    aliases: tuple[str, ...]
    memory_mib: int  # framebuffer total (NVML v2 ``total``)
    reserved_mib: int  # held by driver and firmware (NVML v2 ``reserved``)
    power_limit_w: float  # default power management limit
    idle_power_w: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    max_mem_clock_mhz: int
    idle_mem_clock_mhz: int  # equal to max for HBM, whose clock does not drop at idle
    slowdown_temp_c: float
    shutdown_temp_c: float
    load_temp_c: float  # steady GPU temperature at the power limit in a well-cooled server
    hbm: bool  # HBM parts report a memory temperature; GDDR parts do not
    nvlink: bool
    gpm: bool  # NVML GPM (profiling fields) exists on Hopper and newer


MODELS: tuple[GPUModel, ...] = (
    GPUModel(
        "NVIDIA H100 80GB HBM3", ("h100", "h100-sxm", "h100-80gb"), 81559, 527, 700.0, 72.0,
        1980, 345, 2619, 2619, 89.0, 92.0, 71.0, hbm=True, nvlink=True, gpm=True,
    ),
    GPUModel(
        "NVIDIA H200", ("h200", "h200-sxm"), 143771, 527, 700.0, 75.0,
        1980, 345, 3201, 3201, 89.0, 92.0, 70.0, hbm=True, nvlink=True, gpm=True,
    ),
    GPUModel(
        "NVIDIA A100-SXM4-80GB", ("a100", "a100-80gb", "a100-sxm4-80gb"), 81920, 0, 400.0, 60.0,
        1410, 210, 1593, 1593, 89.0, 92.0, 68.0, hbm=True, nvlink=True, gpm=False,
    ),
    GPUModel(
        "NVIDIA A10G", ("a10g",), 23028, 0, 300.0, 25.0,
        1710, 210, 6251, 405, 95.0, 98.0, 72.0, hbm=False, nvlink=False, gpm=False,
    ),
    GPUModel(
        "NVIDIA L4", ("l4",), 23034, 0, 72.0, 16.0,
        2040, 210, 6251, 405, 93.0, 96.0, 75.0, hbm=False, nvlink=False, gpm=False,
    ),
    GPUModel(
        "NVIDIA L40S", ("l40s",), 46068, 0, 350.0, 35.0,
        2520, 210, 9001, 405, 92.0, 95.0, 74.0, hbm=False, nvlink=False, gpm=False,
    ),
    GPUModel(
        "Tesla T4", ("t4",), 15360, 0, 70.0, 10.0,
        1590, 300, 5001, 405, 93.0, 96.0, 70.0, hbm=False, nvlink=False, gpm=False,
    ),
)  # fmt: skip


def find_model(name: str) -> GPUModel:
    """The model named ``name`` (its NVML name or a short alias, any case).

    Raises ``ValueError`` naming the known models, so a typo on the command line says what to type.
    """
    wanted = name.strip().lower()
    for model in MODELS:
        if wanted == model.name.lower() or wanted in model.aliases:
            return model
    known = ", ".join(f'"{m.name}" ({m.aliases[0]})' for m in MODELS)
    raise ValueError(f"unknown GPU model {name!r}; use one of: {known}")
