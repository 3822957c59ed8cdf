"""The API server's verdict on a job's children before any is created: which children to send as a
server-side dry run (`dryRun=All`: admitted and validated as a create, never stored), and what an answer
says about the job.

The API server is the judge of what Kubernetes accepts (its validation, its defaulting, the cluster's
admission policies): a child it refuses would fail the job at its first pod, or, for the engine Job, only
after all of its training. `dtrain validate --server` and `dtrain submit` send
one of each kind of child, with the user's own credentials: the Service, the PodGroup, the NetworkPolicy, the
last rank's pod (ranks differ only in their index, and the last's name is the longest), a
standby pod for an elastic gang, and the engine Job. The operator, when it accepts a job, sends the pods and the engine Job: the others it
creates first, for real, so their own creates are the verdict (refusals.py) before anything runs.

Only a refusal of the object itself is a verdict on the job: 422 (invalid) and 400 (malformed). A 403
(Pod Security, a ResourceQuota, RBAC), a 404 (a PodGroup API not served) or a 409 (a name taken) is about
the cluster now: the real create meets it and says so (refusals.py). A webhook that cannot take a dry run
answers 400 too; that is no verdict either.
"""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core import engine_job, pod_groups, render, standby
from dtrain_operator.core.launch_env import ReportEndpoint
from dtrain_operator.core.network_policy import render_network_policy

# The longest piece of the server's message quoted into the job's status (the whole of a Pod's refusal
# names each invalid field; the status message itself is bounded by the condition).
MAX_QUOTED_CHARS = 2048
# What the API server says when an admission webhook has side effects and cannot be called on a dry run.
_NO_DRY_RUN = "does not support dry run"


def shared_children(job: DistributedTraining, network_policy: bool = False) -> list[dict[str, Any]]:
    """The children a gang's pods need, created before any pod (without owner references): the Service, the
    PodGroup and the NetworkPolicy."""
    children = [render.render_service(job)]
    pod_group = pod_groups.render_pod_group(job)
    if pod_group is not None:
        children.append(pod_group)
    if network_policy:
        children.append(render_network_policy(job))
    return children


def run_children(job: DistributedTraining, report: ReportEndpoint | None = None) -> list[dict[str, Any]]:
    """One of each child created once the shared ones are (without owner references): the operator's own dry run
    sends these alone, since a refusal of a shared child is met by its real create first, before anything runs."""
    last = job.spec.nodes - 1
    children = [render.render_worker_pod(job, last, 0, report)]
    if job.spec.elastic is not None:
        children.append(standby.render_standby_pod(job, last))
    if job.spec.engine.enabled:
        children.append(engine_job.render_engine_job(job))
    return children


def children_to_check(job: DistributedTraining) -> list[dict[str, Any]]:
    """One of each child the job can get, as `dtrain validate --server` and `dtrain submit` send them."""
    return shared_children(job) + run_children(job)


def describe(child: dict[str, Any]) -> str:
    """How a refusal names the child: its kind and name, and for a worker pod its rank."""
    meta = child["metadata"]
    rank = (meta.get("labels") or {}).get(contract.LABEL_NODE_RANK)
    role = (meta.get("labels") or {}).get(contract.LABEL_ROLE)
    what = f"{child['kind']} {meta['name']}"
    if child["kind"] == "Pod" and rank is not None:
        what += f" (the {'standby' if role == contract.ROLE_STANDBY else 'worker'} pod of node {rank})"
    elif child["kind"] == "Job":
        what += " (the engine Job)"
    return what


def dry_run_refusal(child: dict[str, Any], status: int, message: str) -> str | None:
    """The line that fails the job for the server's answer `status`/`message` to `child`'s dry run, or
    None when the answer is no verdict on the job."""
    if status not in (400, 422) or _NO_DRY_RUN in message:
        return None
    quoted = message if len(message) <= MAX_QUOTED_CHARS else message[: MAX_QUOTED_CHARS - 3] + "..."
    return (f"spec: the API server refuses the job's {describe(child)}, so the job could never run: {quoted}; "
            "fix the field of the spec it comes from (dtrain validate --server checks a file before it is applied)")
