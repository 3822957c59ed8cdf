"""Standby pods: each holds the place of a node an elastic gang lacks now (core.elastic), placed as its worker
would be, running nothing."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core.child_names import standby_pod_name
from dtrain_operator.core.render import render_worker_pod

# What a standby pod runs: nothing, until it is deleted (python is in every trainer image).
STANDBY_COMMAND = ["python", "-c", "import signal; signal.pause()"]


STANDBY_GRACE_SECONDS = 1


def render_standby_pod(job: DistributedTraining, rank: int) -> dict[str, Any]:
    """Standby pod `<name>-standby-<rank>`: holds the place of node `rank`, which an elastic gang lacks now
    (core.elastic). Placed as rank's worker would be (image, resources, volumes, scheduling); it runs nothing,
    is no member of the Service, and holds no token."""
    pod = render_worker_pod(job, rank)
    pod["metadata"]["name"] = standby_pod_name(job, rank)
    pod["metadata"]["labels"][contract.LABEL_ROLE] = contract.ROLE_STANDBY
    pod_spec = pod["spec"]
    for name in ("hostname", "subdomain"):
        pod_spec.pop(name, None)
    pod_spec["terminationGracePeriodSeconds"] = STANDBY_GRACE_SECONDS
    container = pod_spec["containers"][0]
    container.update(command=list(STANDBY_COMMAND), env=[])
    container.pop("ports", None)
    return pod
