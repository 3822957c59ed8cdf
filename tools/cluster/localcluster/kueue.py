"""Kueue (`make cluster KUEUE=1`): its manager built from its Go module and installed as its docs install it.

The manager is built unmodified from tools/cluster/kueue (go.mod and go.sum pin the release) into an image of
its own in this machine's image store: the static binary and a non-root user, as upstream's distroless image
holds it. Everything else is the module's own `config/default` (`kubectl kustomize`): its CRDs, RBAC,
Deployment, webhook Service and configurations, and the Secret its internal certificate management fills.
Changed only where this cluster needs it:
- the Deployment runs the image built here (imagePullPolicy Never: there is no registry);
- its Configuration enables the plain-pod integration ("pod": Kueue has no integration for a
  DistributedTraining, so dtrain's worker pods are queued as one pod group) beside "batch/job", and exempts
  the operator's namespace as it exempts its own;
- the visibility API is off (an aggregated API server: this cluster's API server has no front proxy for it).
With no kube-proxy here, the API server reaches the webhooks through the Service's endpoints
(--enable-aggregator-routing); the certificate is Kueue's own, which the kubelet's volume sync brings to the
manager once Kueue has written it into its Secret.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import controlplane, images, layout

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
NONROOT = 65532  # the user of upstream's distroless image


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


def _buildah(*args: str) -> str:
    result = images.buildah(*args)
    if result.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def build_image() -> None:
    """The manager's image, when the store lacks one of this binary (a label records which)."""
    stamp = BINARY.with_name(f"{BINARY.name}.stamp").read_text()  # what build() built the binary from
    built_from = images.buildah("inspect", "--type", "image", "--format",
                                '{{index .OCIv1.Config.Labels "dev.dtrain.built-from"}}', image())
    if built_from.returncode == 0 and built_from.stdout.strip() == stamp:
        return
    container = _buildah("from", "scratch")
    try:
        root = Path(_buildah("mount", container))
        for folder in ("etc", "tmp", "proc", "dev", "sys"):
            (root / folder).mkdir(exist_ok=True)
        (root / "tmp").chmod(0o1777)
        (root / "etc" / "passwd").write_text(f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}::/home/nonroot:/sbin/nologin\n")
        (root / "etc" / "group").write_text(f"root:x:0:\nnonroot:x:{NONROOT}:\n")
        _buildah("copy", "--chmod", "0755", container, str(BINARY), "/manager")
        _buildah("config", "--entrypoint", '["/manager"]', "--user", f"{NONROOT}:{NONROOT}",
                 "--label", f"dev.dtrain.built-from={stamp}", container)
        _buildah("commit", "--rm", container, image())
    except BaseException:
        images.buildah("rm", container)
        raise


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


def manifests(rendered: str) -> list[dict[str, Any]]:
    """`kubectl kustomize config/default`'s objects, changed as the module docstring says."""
    objects: list[dict[str, Any]] = []
    for obj in yaml.safe_load_all(rendered):
        if not obj:
            continue
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "APIService":
            continue  # the visibility API (VisibilityOnDemand=false)
        if kind == "ConfigMap" and name == CONFIG_MAP:
            obj["data"][CONFIG_FILE_KEY] = manager_config(obj["data"][CONFIG_FILE_KEY])
        if kind == "Deployment" and name == DEPLOYMENT:
            container = obj["spec"]["template"]["spec"]["containers"][0]
            container["image"] = image()
            container["imagePullPolicy"] = "Never"
            container["args"] = [*container.get("args", []), f"--feature-gates={FEATURE_GATES}"]
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for webhook in obj.get("webhooks") or []:
                _exempt(webhook)
        objects.append(obj)
    return objects


def render() -> list[dict[str, Any]]:
    kubectl = str(layout.REPO / ".tools" / "bin" / "kubectl")
    rendered = subprocess.run([kubectl, "kustomize", str(module_dir() / "config" / "default")],
                              capture_output=True, text=True, check=False, timeout=120)
    if rendered.returncode != 0:
        raise RuntimeError(f"kubectl kustomize of Kueue's config/default: {rendered.stderr.strip()}")
    return manifests(rendered.stdout)


def install(kubectl: Callable[..., subprocess.CompletedProcess[str]], timeout: float = 300) -> None:
    """Apply Kueue's objects and return once its webhooks answer (a server-side dry run of a ResourceFlavor
    goes through them)."""
    objects = render()
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    for batch in (crds, rest):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": batch}))
        if batch is crds:
            kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c['metadata']['name']}" for c in crds))
    probe = yaml.safe_dump({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                            "metadata": {"name": "localcluster-probe"}})
    deadline = time.monotonic() + timeout
    while True:
        answered = kubectl("create", "--dry-run=server", "-f", "-", stdin=probe, check=False)
        if answered.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kueue's webhooks did not answer within {timeout:.0f} s: {answered.stderr.strip()} "
                               f"(kubectl -n {NAMESPACE} logs deploy/{DEPLOYMENT})")
        time.sleep(3)
