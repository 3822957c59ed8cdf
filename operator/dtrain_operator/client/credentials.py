"""Where the client's credentials come from: an explicit kubeconfig or context, else $KUBECONFIG or
~/.kube/config when present, else the pod's service account (and its namespace).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dtrain_operator.client.errors import ConnectionFailed

SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _kubeconfig_path(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG")
    if env:
        return env.split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_NAMESPACE_FILE.parent.is_dir()


def load_configuration(kubeconfig: str | None, context: str | None) -> tuple[Any, str | None, str]:
    """(kubernetes Configuration, the namespace the credentials name, where they came from)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    path = _kubeconfig_path(kubeconfig)
    if path is None and context is None and _in_cluster():
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise ConnectionFailed(f"in a pod, but its service account is unusable ({exc})") from exc
        try:
            namespace: str | None = SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or None
        except OSError:
            namespace = None
        return configuration, namespace, "the pod's service account"
    if path is None:
        raise ConnectionFailed(
            "no Kubernetes credentials: no kubeconfig ($KUBECONFIG or ~/.kube/config) and not in a pod; "
            "point KUBECONFIG at your cluster's kubeconfig or pass kubeconfig=/--kubeconfig"
        )
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        contexts, current = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = f"context {context!r} of " if context else ""
        raise ConnectionFailed(f"cannot use {where}the kubeconfig {path}: {exc}") from exc
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return configuration, namespace, f"kubeconfig {path}, context {(chosen or {}).get('name')}"
