"""`spec.scheduling`: where the worker pods go, and whose PodGroup gang-schedules them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from dtrain_operator.api.common import (
    MAX_MAP_ENTRIES,
    MAX_TIMEOUT_SECONDS,
    ApiModel,
    DnsSubdomain,
    LabelKey,
    LabelValue,
)
from dtrain_operator.api.kube_objects import KubeObject

GangProvider = Literal["kubernetes", "volcano", "scheduler-plugins"]
VOLCANO_SCHEDULER = "volcano"
"""The schedulerName that, without gang.provider, picks Volcano's PodGroup."""
GANG_NEEDS_SCHEDULER = (
    "gang.enabled needs gang.provider: kubernetes (the default scheduler, Kubernetes 1.36+), or schedulerName: "
    "volcano, or the name of your scheduler-plugins scheduler"
)


class GangScheduling(ApiModel):
    """All-or-nothing scheduling of the worker pods through a PodGroup."""

    enabled: bool = False
    """Create a PodGroup so that the scheduler places all workers or none (needs Kubernetes 1.36+ with its gang scheduling on, Volcano, or the scheduler-plugins coscheduling plugin: see provider)."""
    provider: GangProvider | None = None
    """Whose PodGroup: kubernetes (scheduling.k8s.io/v1alpha2: the default scheduler gang-schedules by itself, no schedulerName needed; Kubernetes 1.36+ with the feature gates GenericWorkload and GangScheduling and --runtime-config=scheduling.k8s.io/v1alpha2=true), volcano (scheduling.volcano.sh/v1beta1) or scheduler-plugins (scheduling.x-k8s.io/v1alpha1, the coscheduling plugin), which need schedulerName. Default: volcano when schedulerName is volcano, scheduler-plugins for any other name."""
    min_available: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Workers that must be schedulable together (default: nodes)."""
    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 300
    """Report pods still Pending after this long, with their reason, in a condition."""


class TopologySettings(ApiModel):
    """Where the whole gang must land, by a label of the nodes."""

    required: LabelKey | None = None
    """A node label whose value names a topology domain (a rack, a zone, an NVLink or InfiniBand island), e.g. topology.kubernetes.io/zone: every worker of a gang is placed in one domain (required pod affinity), the one of the first worker placed. With gang scheduling the gang waits, whole, until one domain can hold it."""


class SchedulingSettings(ApiModel):
    """Where and how the worker pods are scheduled."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.gang) || !has(self.gang.enabled) || !self.gang.enabled || has(self.schedulerName) || (has(self.gang.provider) && self.gang.provider == 'kubernetes')", "message": GANG_NEEDS_SCHEDULER},
    ]})

    scheduler_name: DnsSubdomain | None = None
    """Scheduler of the worker pods, e.g. volcano or scheduler-plugins-scheduler (default: the default scheduler). Without gang.provider, gang scheduling picks the PodGroup kind from it."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the worker pods."""
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Node labels the worker pods must match, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}."""
    tolerations: Annotated[list[KubeObject], Field(max_length=64)] = Field(default_factory=list)
    """Tolerations of the worker pods (core/v1 Toleration)."""
    affinity: KubeObject | None = None
    """Affinity of the worker pods (core/v1 Affinity)."""
    gang: GangScheduling = Field(default_factory=GangScheduling)
    """Gang scheduling."""
    topology: TopologySettings = Field(default_factory=TopologySettings)
    """The topology domain the gang must share."""

    @model_validator(mode="after")
    def _gang_needs_scheduler(self) -> SchedulingSettings:
        # Volcano's and scheduler-plugins' PodGroups mean nothing to the default scheduler: their pods
        # must name their scheduler. Kubernetes' own needs none. Any name goes with any provider (Volcano
        # and scheduler-plugins run under names of their own choosing, and so can a second profile of
        # kube-scheduler, whose default plugins include GangScheduling): the provider says whose PodGroup.
        if self.gang.enabled and not self.scheduler_name and self.gang.provider != "kubernetes":
            raise ValueError(GANG_NEEDS_SCHEDULER)
        return self

    @property
    def gang_provider(self) -> GangProvider | None:
        """Whose PodGroup gang-schedules the workers (None: no gang). The one place that decides it."""
        if not self.gang.enabled:
            return None
        if self.gang.provider is not None:
            return self.gang.provider
        return "volcano" if self.scheduler_name == VOLCANO_SCHEDULER else "scheduler-plugins"
