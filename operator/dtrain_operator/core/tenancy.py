"""Who a job's pods may be: jobs run in their users' namespaces, as an identity the namespace allows.

A DistributedTraining creates pods, so whoever may create one could otherwise run a pod as any
service account of its namespace, or, in the operator's own namespace, as the operator itself
with its Secrets mounted. The operator refuses, before anything is created:
- any job in its own namespace (it holds the operator, its Secrets, and nothing a user runs);
- the operator's own service account, in any namespace;
- a service account other than the trainer's, unless an administrator allowed that account in
  that namespace (the chart's `tenancy.allowedServiceAccounts`, `namespace/name` pairs);
- a projected token for the Kubernetes API (no audience, or one of the API server's) except under
  an allowed account: the trainer's account holds no permission, and no job needs one for it;
- any reference to one of the operator's own Secrets by name.
The chart's admission policy (templates/operator/tenancy-policy.yaml) says the same at `kubectl apply`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dtrain_operator.api import DistributedTrainingSpec, contract

# What a serviceAccountToken source without an audience is issued for, and the names the API server's own
# audience takes (its issuer, https://kubernetes.default.svc.<domain>), whatever else a cluster adds.
API_SERVER_AUDIENCE_MARK = "kubernetes.default.svc"


@dataclass(frozen=True)
class Tenancy:
    """The operator's identity and what a cluster administrator allowed (the chart's values)."""

    operator_namespace: str
    operator_service_account: str = "dtrain-operator"
    trainer_service_account: str = contract.DEFAULT_WORKER_SERVICE_ACCOUNT
    allowed_service_accounts: frozenset[str] = frozenset()
    """`namespace/name` pairs an administrator allowed as a job's spec.serviceAccountName."""
    operator_secrets: frozenset[str] = frozenset()
    """The names of the operator's own Secrets, which no job may name."""
    api_audiences: frozenset[str] = field(default_factory=frozenset)
    """The audiences the API server accepts, where the operator knows them (its own token's)."""

    def allowed(self, namespace: str, account: str) -> bool:
        return f"{namespace}/{account}" in self.allowed_service_accounts


def _secret_references(spec: DistributedTrainingSpec) -> Iterator[tuple[str, Any]]:
    """(field, Secret name) for every Secret the job's pods would read."""
    if spec.storage is not None and spec.storage.credentials_secret:
        yield "spec.storage.credentialsSecret", spec.storage.credentials_secret
    for index, secret in enumerate(spec.image_pull_secrets):
        yield f"spec.imagePullSecrets[{index}].name", secret.name
    for index, volume in enumerate(spec.volumes):
        if isinstance(volume.get("secret"), Mapping):
            yield f"spec.volumes[{index}].secret.secretName", volume["secret"].get("secretName")
        for source_index, source in enumerate(_projected_sources(volume)):
            if isinstance(source.get("secret"), Mapping):
                yield f"spec.volumes[{index}].projected.sources[{source_index}].secret.name", source["secret"].get("name")
    for index, var in enumerate(spec.env):
        reference = (var.value_from or {}).get("secretKeyRef")
        if isinstance(reference, Mapping):
            yield f"spec.env[{index}].valueFrom.secretKeyRef.name", reference.get("name")


def _projected_sources(volume: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    projected = volume.get("projected")
    sources = projected.get("sources") if isinstance(projected, Mapping) else None
    return [s for s in sources if isinstance(s, Mapping)] if isinstance(sources, list) else []


def api_token_fields(spec: DistributedTrainingSpec, api_audiences: frozenset[str]) -> list[str]:
    """The projected serviceAccountToken sources whose token the Kubernetes API would accept."""
    found = []
    for index, volume in enumerate(spec.volumes):
        for source_index, source in enumerate(_projected_sources(volume)):
            token = source.get("serviceAccountToken")
            if not isinstance(token, Mapping):
                continue
            audience = str(token.get("audience") or "")
            if not audience or API_SERVER_AUDIENCE_MARK in audience or audience in api_audiences:
                found.append(f"spec.volumes[{index}].projected.sources[{source_index}].serviceAccountToken")
    return found


def tenancy_refusals(spec: DistributedTrainingSpec, namespace: str, tenancy: Tenancy) -> list[str]:
    """One error line per way the job would run as more than its namespace allows (empty: it may run)."""
    if namespace == tenancy.operator_namespace:
        return [
            (f"metadata.namespace: {namespace} is the dtrain operator's own namespace, where no job runs; apply the "
            f"job in a user namespace (kubectl -n team-a apply -f JOB.yaml, with the namespace your administrator "
            f"prepared for jobs)")
        ]
    refused = []
    account = spec.service_account_name
    trainer = tenancy.trainer_service_account
    allowed = tenancy.allowed(namespace, account)
    if account == tenancy.operator_service_account:
        refused.append(
            f"spec.serviceAccountName: {account} is the dtrain operator's own account, which no job runs as; "
            f"remove spec.serviceAccountName (jobs run as {trainer})"
        )
    elif account != trainer and not allowed:
        refused.append(
            f"spec.serviceAccountName: {account} is not allowed in namespace {namespace}; remove it (jobs run as "
            f"{trainer}), or have a cluster administrator add {namespace}/{account} to the chart's "
            f"tenancy.allowedServiceAccounts"
        )
    if not allowed:
        refused.extend(
            # Not "field: ...": text after a name ending in Token reads as a credential, and logs mask it.
            f"{where} (a token for the Kubernetes API) is allowed only under a service account a cluster "
            f"administrator allowed (the chart's tenancy.allowedServiceAccounts); set its audience to the service "
            f"that reads it, or remove it"
            for where in api_token_fields(spec, tenancy.api_audiences)
        )
    refused.extend(
        f"{where}: {name} is a Secret of the dtrain operator's, which no job may name; remove it"
        for where, name in _secret_references(spec)
        if name in tenancy.operator_secrets
    )
    return refused
