"""`dtrain validate --server` and `dtrain submit`: the API server's verdict on a job before it is created,
with the user's own credentials. The DistributedTraining itself (its CRD's schema and rules, the cluster's
admission policies) and one of each child the operator would create for it (core.server_check) go to the
server as dry runs: nothing is stored. The operator asks the same of the children when it accepts the
job, with its own rights; a child the user may not create (pods, often) is left to it, and said so.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from dtrain_operator import api
from dtrain_operator.api.validation import DocumentResult
from dtrain_operator.client import Client, DtrainError
from dtrain_operator.core import server_check

# How RBAC words a 403 ('User "u" cannot create resource "pods" ...'), as against an admission's.
_RBAC_REFUSAL = "cannot create resource"


@dataclass
class ServerVerdict:
    refusals: list[str] = field(default_factory=list)  # each a line that names what the server refused and why
    # Refusals about the cluster now (Pod Security, a ResourceQuota, a webhook's 403): the operator retries them.
    warnings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # the kinds the user may not create, left to the operator

    def note(self, namespace: str) -> str:
        """The line that says what was not checked, or ''."""
        if not self.unchecked:
            return ""
        kinds = ", ".join(sorted(set(self.unchecked)))
        return (f"not checked by the API server: {kinds} (you may not create them in namespace {namespace}); the "
                "operator checks them when it accepts the job")


def in_namespace(job: api.DistributedTraining, document: dict[str, Any], namespace: str) -> tuple[
    api.DistributedTraining, dict[str, Any]
]:
    """The job and its document in `namespace` where they name none (as `kubectl apply -n` sends them)."""
    namespace = job.metadata.namespace or namespace
    document = {**document, "metadata": {**(document.get("metadata") or {}), "namespace": namespace}}
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})}), document


def server_verdict(client: Client, job: api.DistributedTraining, document: dict[str, Any] | None = None) -> ServerVerdict:
    """The server's refusals of `job`'s children (and of `document`, the job as it would be sent, if given);
    `job.namespace` is where they would be created."""
    verdict = ServerVerdict()
    if document is not None:
        status, message = client.dry_run(document)
        if status in (400, 422):
            verdict.refusals.append(f"the API server refuses the DistributedTraining: {message}")
        elif status == 401 or (status == 403 and _RBAC_REFUSAL in message):
            verdict.unchecked.append("DistributedTraining")
        elif status == 403:  # an admission's (a policy, a webhook): the create would be refused as well
            verdict.refusals.append(f"the API server refuses the DistributedTraining: {message}")
        elif status == 404:
            client.check_installed()
    for child in server_check.children_to_check(job):
        status, message = client.dry_run(child)
        refusal = server_check.dry_run_refusal(child, status, message)
        if refusal is not None:
            verdict.refusals.append(refusal)
        elif status == 401 or (status == 403 and _RBAC_REFUSAL in message):
            verdict.unchecked.append(child["kind"])
        elif status == 403:
            verdict.warnings.append(f"the API server would refuse the job's {server_check.describe(child)} now: {message}; "
                                    "the operator retries it until this changes")
    return verdict


def client_for(args: argparse.Namespace) -> Client:
    """`dtrain validate --server`'s client: the kubeconfig's (or --context's, --kubeconfig's) credentials."""
    try:
        return Client(namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig)
    except DtrainError as error:
        print(f"dtrain validate --server: {error}", file=sys.stderr)
        raise SystemExit(1) from error


def refusals_on_server(client: Client, result: DocumentResult, namespace: str) -> list[str]:
    """`dtrain validate --server`: the API server's refusals of a valid job file's job and children; its
    warnings and what it could not check are printed."""
    assert result.job is not None
    job, document = in_namespace(result.job, result.document, namespace)
    try:
        verdict = server_verdict(client, job, document)
    except DtrainError as error:
        return [f"cannot ask the API server: {error}"]
    for line in [*verdict.warnings, verdict.note(job.namespace)]:
        if line:
            print(f"{result.source}: warning: {line}", file=sys.stderr)
    return verdict.refusals
