"""Controllers built from their Go modules and installed from their modules' own manifests (Kueue, the anchors).

Each is a controller-runtime manager: one static binary, which upstream ships in a distroless image as
/manager run by a non-root user, installed by `kubectl kustomize` of the module's own config (CRDs, RBAC,
Deployment, webhook Service and configurations, and the Secret its internal certificate management fills).
Here the binary is built from the module and put in an image of this machine's store as upstream's holds it;
the Deployment runs that image (imagePullPolicy Never: there is no registry). With no kube-proxy here, the
API server reaches their webhooks at the Service's endpoints (--enable-aggregator-routing), with the
controller's own certificate, which the kubelet's volume sync brings to the manager once written.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import images, layout

NONROOT = 65532  # the user of upstream's distroless images
ENTRYPOINT = "/manager"  # where upstream's Dockerfiles put the binary, and their Deployments' command

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _buildah(*args: str) -> str:
    result = images.buildah(*args)
    if result.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def manager_image(binary: Path, image: str) -> None:
    """`binary` as /manager, run by the non-root user, in the image `image`; nothing when the store holds one
    built from this binary already (a label records the stamp the Go build left beside it)."""
    stamp = binary.with_name(f"{binary.name}.stamp").read_text()
    built_from = images.buildah("inspect", "--type", "image", "--format",
                                '{{index .OCIv1.Config.Labels "dev.dtrain.built-from"}}', image)
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
        _buildah("copy", "--chmod", "0755", container, str(binary), ENTRYPOINT)
        _buildah("config", "--entrypoint", f'["{ENTRYPOINT}"]', "--user", f"{NONROOT}:{NONROOT}",
                 "--label", f"dev.dtrain.built-from={stamp}", container)
        _buildah("commit", "--rm", container, image)
    except BaseException:
        images.buildah("rm", container)
        raise


def kustomize(directory: Path, what: str, *flags: str) -> list[dict[str, Any]]:
    """`kubectl kustomize directory`'s objects."""
    kubectl = str(layout.REPO / ".tools" / "bin" / "kubectl")
    rendered = subprocess.run([kubectl, "kustomize", *flags, str(directory)], capture_output=True, text=True,
                              check=False, timeout=120)
    if rendered.returncode != 0:
        raise RuntimeError(f"kubectl kustomize of {what}: {rendered.stderr.strip()}")
    return [obj for obj in yaml.safe_load_all(rendered.stdout) if obj]


def run_local_image(deployment: dict[str, Any], image: str) -> None:
    """The Deployment's manager container runs `image` from this machine's store."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"] = image
    container["imagePullPolicy"] = "Never"


def install(kubectl: Kubectl, objects: list[dict[str, Any]], probe: dict[str, Any], what: str, hint: str,
            timeout: float = 300) -> None:
    """Apply the CRDs, wait until they are served, apply the rest; return once a server-side dry run of
    `probe` (an object their webhooks admit) goes through, i.e. the webhooks answer."""
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    deadline = time.monotonic() + timeout
    for batch in (crds, rest):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": batch}))
        while batch is crds and crds:
            # kubectl wait fails at once on a CRD whose status has no conditions yet: asked again until then.
            established = kubectl("wait", "--for=condition=Established", "--timeout=30s",
                                  *(f"crd/{c['metadata']['name']}" for c in crds), check=False)
            if established.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}'s CRDs are not served: {established.stderr.strip()}")
            time.sleep(1)
    wait_for_webhooks(kubectl, probe, what, hint, deadline - time.monotonic())


def wait_for_webhooks(kubectl: Kubectl, probe: dict[str, Any], what: str, hint: str, timeout: float) -> None:
    """Return once a server-side dry run of `probe` goes through: the controller's webhooks answer."""
    deadline = time.monotonic() + timeout
    while True:
        answered = kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        if answered.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}'s webhooks did not answer within {timeout:.0f} s: {answered.stderr.strip()} ({hint})")
        time.sleep(3)
