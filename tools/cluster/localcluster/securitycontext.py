"""Who a container runs as, as a kubelet and a runtime decide it: the container's securityContext over
the pod's, over the image's USER; and the kubelet's own refusals of runAsNonRoot (its messages)."""

from __future__ import annotations

from typing import Any

from . import images


def container_user(
    pod: dict[str, Any], container: dict[str, Any], image_user: str, root: str
) -> tuple[dict[str, Any] | None, str | None]:
    """(the uid, gid and supplementary groups podinit takes; or the CreateContainerConfigError message)."""
    pod_context = pod["spec"].get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    image_uid, image_gid = images.resolve_user(root, image_user)
    uid = context.get("runAsUser", image_uid if image_uid is not None else 0)
    gid = context.get("runAsGroup", image_gid if image_gid is not None else 0)
    meta = pod["metadata"]
    pod_ref = f'pod: "{meta["name"]}_{meta["namespace"]}({meta.get("uid", "")})", container: {container["name"]}'
    if context.get("runAsNonRoot"):
        # The kubelet checks a numeric user only: a name could be anyone in the image's /etc/passwd.
        named = image_user and not image_user.split(":", 1)[0].isdigit()
        if "runAsUser" not in context and named:
            return None, (f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                          f"cannot verify user is non-root ({pod_ref})")
        if uid == 0:
            return None, f"container has runAsNonRoot and image will run as root ({pod_ref})"
    groups = [g for g in [pod_context.get("fsGroup"), *(pod_context.get("supplementalGroups") or [])] if g is not None]
    return {"uid": uid, "gid": gid, "groups": groups}, None
