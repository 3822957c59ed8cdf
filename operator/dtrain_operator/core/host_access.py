"""Host access for a job's pods, refused unless the namespace opted in (`--refuse-host-access`).

A DistributedTraining creates pods, so whoever may create one could ask for the node's
network or a `hostPath` of the node's disk. Pod Security Admission (`restricted`) stops
that at the pod; this policy stops it one step earlier, at the job, with a condition that
names the field, for clusters that run the operator hardened.
"""

from __future__ import annotations

from collections.abc import Mapping

from dtrain_operator.api import DistributedTrainingSpec, contract


def host_access_fields(spec: DistributedTrainingSpec) -> list[str]:
    """The spec fields that give the pods access to the node."""
    fields = ["spec.hostNetwork"] if spec.host_network else []
    fields += [f"spec.volumes[{i}].hostPath" for i, volume in enumerate(spec.volumes) if "hostPath" in volume]
    return fields


def host_access_refusals(spec: DistributedTrainingSpec, namespace: str, labels: Mapping[str, str]) -> list[str]:
    """One error line per host-access field, unless the namespace carries the opt-in label."""
    if labels.get(contract.LABEL_ALLOW_HOST_ACCESS) == "true":
        return []
    return [
        f"{field}: host access is refused in namespace {namespace}; remove it, or have an administrator run "
        f"`kubectl label namespace {namespace} {contract.LABEL_ALLOW_HOST_ACCESS}=true`"
        for field in host_access_fields(spec)
    ]
