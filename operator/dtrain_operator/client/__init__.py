"""A Python client for DistributedTrainings on a cluster: what `dtrain submit/get/watch/logs/delete` use.

    from dtrain_operator.client import Client

    dtr = Client(namespace="team-a")                  # kubeconfig (current context) or in-cluster
    job = dtr.submit("examples/quickstart.yaml")      # validated first, as `dtrain validate` does
    for update in dtr.progress(job.name):             # each change of status.progress, until it ends
        print(update.line())
    job = dtr.wait(job.name, timeout=3600)            # Succeeded or Failed (raises WaitTimeout)
    print(dtr.logs(job.name, rank=0, tail_lines=20))

Jobs come back as the typed API model (`api.DistributedTraining`, status included). Credentials:
an explicit kubeconfig or context, else $KUBECONFIG or ~/.kube/config when present, else the pod's
service account. Every failure is a `DtrainError` whose message says what to do: `NoCrdError` (the
operator is not installed), `PermissionDenied` (which verb on what, and the `kubectl auth can-i`
line to check it), `NotFound`, `AlreadyExists`, `InvalidJob` (the `dtrain validate` lines),
`WaitTimeout`, `ConnectionFailed`.

Requests use the official client's REST layer (its kubeconfig loading, auth plugins and TLS)
with plain JSON in and out. Progress is read by polling the job (every `interval` seconds):
the trainer reports at most every 15 s, so a watch would buy nothing but reconnect logic.
"""

from dtrain_operator.client.client import Client, JobSource
from dtrain_operator.client.errors import (
    AlreadyExists,
    ApiRequestError,
    ConnectionFailed,
    DtrainError,
    InvalidJob,
    NoCrdError,
    NotFound,
    PermissionDenied,
    WaitTimeout,
)
from dtrain_operator.client.progress_updates import ProgressUpdate

__all__ = [
    "AlreadyExists",
    "ApiRequestError",
    "Client",
    "ConnectionFailed",
    "DtrainError",
    "InvalidJob",
    "JobSource",
    "NoCrdError",
    "NotFound",
    "PermissionDenied",
    "ProgressUpdate",
    "WaitTimeout",
]
