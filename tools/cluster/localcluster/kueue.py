"""Kueue (`make cluster KUEUE=1`): its manager built from its Go module and installed as its docs install it.

The manager is built unmodified from tools/cluster/kueue (go.mod and go.sum pin the release) into an image of
its own in this machine's image store: the static binary and a non-root user, as upstream's distroless image
holds it (controllers.py). Everything else is the module's own `config/default`. Changed only where this
cluster needs it:
- the Deployment runs the image built here;
- its Configuration enables the plain-pod integration ("pod": Kueue has no integration for a
  DistributedTraining, so dtrain's worker pods are queued as one pod group) beside "batch/job", and exempts
  the operator's namespace as it exempts its own;
- the visibility API is off (an aggregated API server: this cluster's API server has no front proxy for it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import controllers, controlplane, layout

MODULE = layout.REPO / "tools" / "cluster" / "kueue"
PACKAGE = "sigs.k8s.io/kueue"
BINARY = layout.BIN / "kueue"
NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
CONFIG_MAP = "kueue-manager-config"
CONFIG_FILE_KEY = "controller_manager_config.yaml"
# The namespaces Kueue leaves alone: the system's, its own, and the operator's.
EXEMPT_NAMESPACES = ["kube-system", NAMESPACE, "dtrain-system"]
FRAMEWORKS = ["batch/job", "pod"]
FEATURE_GATES = "VisibilityOnDemand=false"


def version() -> str:
    """The Kueue release go.mod pins."""
    return controlplane.required_version(MODULE, PACKAGE)


def image() -> str:
    return f"localhost/kueue/kueue:{version()}"


def module_dir() -> Path:
    """The pinned release's files (Go's module cache): config/default and what it includes."""
    path = controlplane.module_dir(MODULE, PACKAGE)
    if not (path / "config" / "default").is_dir():
        raise RuntimeError(f"no config/default in {PACKAGE}'s module ({path})")
    return path


def build() -> None:
    """The manager from its module, static (CGO off, as upstream's Makefile builds it for its distroless image)."""
    release = version()
    controlplane.build_from_module(
        MODULE, f"{PACKAGE}/cmd/kueue", BINARY,
        ["-trimpath", f"-ldflags=-s -w -X {PACKAGE}/pkg/version.GitVersion={release}"],
        f"cluster: building Kueue {release} from its Go module (first time ~6-8 min on 2 cores; Go's caches make "
        "the next one fast)",
        env={"CGO_ENABLED": "0"},
    )


def build_image() -> None:
    controllers.manager_image(BINARY, image())


def manager_config(upstream: str) -> str:
    """Upstream's Configuration with the plain-pod integration on and the operator's namespace exempt."""
    config = yaml.safe_load(upstream)
    config.setdefault("integrations", {})["frameworks"] = list(FRAMEWORKS)
    config["managedJobsNamespaceSelector"] = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": EXEMPT_NAMESPACES}]
    }
    return yaml.safe_dump(config, sort_keys=False)


def _exempt(webhook: dict[str, Any]) -> None:
    selector = webhook.setdefault("namespaceSelector", {})
    expressions = selector.setdefault("matchExpressions", [])
    for expression in expressions:
        if expression.get("key") == "kubernetes.io/metadata.name" and expression.get("operator") == "NotIn":
            expression["values"] = sorted(set(expression.get("values") or []) | set(EXEMPT_NAMESPACES))
            return
    expressions.append({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": EXEMPT_NAMESPACES})


def manifests(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kubectl kustomize config/default`'s objects, changed as the module docstring says."""
    objects: list[dict[str, Any]] = []
    for obj in rendered:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "APIService":
            continue  # the visibility API (VisibilityOnDemand=false)
        if kind == "ConfigMap" and name == CONFIG_MAP:
            obj["data"][CONFIG_FILE_KEY] = manager_config(obj["data"][CONFIG_FILE_KEY])
        if kind == "Deployment" and name == DEPLOYMENT:
            controllers.run_local_image(obj, image())
            container = obj["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [*container.get("args", []), f"--feature-gates={FEATURE_GATES}"]
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for webhook in obj.get("webhooks") or []:
                _exempt(webhook)
        objects.append(obj)
    return objects


def render() -> list[dict[str, Any]]:
    return manifests(controllers.kustomize(module_dir() / "config" / "default", "Kueue's config/default"))


def install(kubectl: controllers.Kubectl, timeout: float = 300) -> None:
    """Apply Kueue's objects and return once its webhooks answer (a server-side dry run of a ResourceFlavor
    goes through them)."""
    probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "localcluster-probe"}}
    controllers.install(kubectl, render(), probe, "Kueue", f"kubectl -n {NAMESPACE} logs deploy/{DEPLOYMENT}", timeout)
