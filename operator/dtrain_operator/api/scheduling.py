"""`spec.scheduling`: where the worker pods go, and whose PodGroup gang-schedules them."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from dtrain_operator.api.common import (
    MAX_MAP_ENTRIES,
    MAX_TIMEOUT_SECONDS,
    ApiModel,
    DnsSubdomain,
    LabelKey,
    LabelValue,
)
from dtrain_operator.api.kube_objects import Affinity, Toleration


class GangScheduling(ApiModel):
    """All-or-nothing scheduling of the worker pods through a PodGroup."""

    enabled: bool = False
    """Create a PodGroup so that the scheduler places all workers or none (needs Volcano or the scheduler-plugins coscheduling plugin)."""
    min_available: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Workers that must be schedulable together (default: nodes)."""
    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 300
    """Report pods still Pending after this long, with their reason, in a condition."""


class SchedulingSettings(ApiModel):
    """Where and how the worker pods are scheduled."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": '!has(self.gang) || !self.gang.enabled || has(self.schedulerName)', "message": 'gang.enabled needs schedulerName: volcano, or the name of your scheduler-plugins scheduler'},
    ]})

    scheduler_name: DnsSubdomain | None = None
    """Scheduler of the worker pods, e.g. volcano or scheduler-plugins-scheduler. Gang scheduling picks the PodGroup kind from it."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the worker pods."""
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Node labels the worker pods must match, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}."""
    tolerations: Annotated[list[Toleration], Field(max_length=64)] = Field(default_factory=list)
    """Tolerations of the worker pods (core/v1 Toleration)."""
    affinity: Affinity | None = None
    """Affinity of the worker pods (core/v1 Affinity)."""
    gang: GangScheduling = Field(default_factory=GangScheduling)
    """Gang scheduling."""

    @model_validator(mode="after")
    def _gang_needs_scheduler(self) -> SchedulingSettings:
        if self.gang.enabled and not self.scheduler_name:
            raise ValueError(
                "gang.enabled needs schedulerName: volcano, or the name of your scheduler-plugins scheduler"
            )
        return self
