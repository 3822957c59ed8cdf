"""The NetworkPolicy of a job (`dtrain operator --network-policy`): ingress to its pods only from its own pods."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core.child_names import child_metadata, job_labels


def render_network_policy(job: DistributedTraining) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods (`dtrain operator --network-policy`):
    torchrun's rendezvous port, and the ports NCCL and gloo open between ranks, admit no one else."""
    own = {contract.LABEL_JOB_NAME: job.name}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job, job.name, job_labels(job, contract.ROLE_WORKER)),
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]}],
        },
    }
