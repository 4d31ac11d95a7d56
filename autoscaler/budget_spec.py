"""The GPUBudget spec as written: one schema for the controller's parser and the CRD.

:func:`autoscaler.controller.budget.parse_budget` validates a GPUBudget's ``spec`` with
:class:`GPUBudgetSpecModel` and ``python -m autoscaler.crd.generate`` writes the CRD's spec
schema from it, so the API server and the controller take the same budgets. A policy field left
unset (None) is inherited: a tenant's from the budget's ``default``, the default's from the
built-in policy; that is why these fields have no schema defaults.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from autoscaler.spec import NonEmpty, Quantity, WrittenSpec


def _not_negative(value: float) -> float:
    if value < 0:
        raise PydanticCustomError("negative", f"must be >= 0, got {value:g}")
    return value


GPUs = Annotated[Quantity, AfterValidator(_not_negative)]
# Extended resource name (nvidia.com/gpu, nvidia.com/mig-1g.10gb) to GPUs.
ResourceGPUs = dict[str, GPUs]


class BudgetPolicyModel(WrittenSpec):
    priority: int | None = Field(
        None, description="Higher first; best-effort (backfill) work takes the lowest."
    )
    weight: float | None = Field(
        None, gt=0, description="Share of its priority level under contention (max-min fair)."
    )
    guaranteed: ResourceGPUs | None = Field(
        None, description="GPUs per resource allocated before any priority is served."
    )
    cap: ResourceGPUs | None = Field(None, description="Most GPUs per resource, whatever is free.")
    preempt: bool | None = Field(
        None,
        description="Reclaim GPUs from lower priorities at once, down to their guaranteed "
        "share, instead of waiting for their scale-down behavior.",
    )


class TenantModel(BudgetPolicyModel):
    autoscaler: NonEmpty = Field(description="A GPUAutoscaler in this namespace.")


class SelectorModel(WrittenSpec):
    match_labels: dict[str, str] | None = None


class GPUBudgetSpecModel(WrittenSpec):
    """A GPUBudget's ``spec`` as written."""

    resources: ResourceGPUs = Field(
        min_length=1,
        description="GPUs in the pool per extended resource name (nvidia.com/gpu, a MIG "
        "profile such as nvidia.com/mig-1g.10gb); each is allocated on its own.",
    )
    selector: SelectorModel | None = Field(
        None,
        description="GPUAutoscalers governed by label. Also governed: those named in tenants "
        "and those labelled autoscaling.autoglm.io/gpu-budget=<this budget's name>.",
    )
    default: BudgetPolicyModel | None = Field(
        None, description="The policy of a governed autoscaler not named in tenants."
    )
    tenants: list[TenantModel] | None = None
