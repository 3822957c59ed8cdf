"""Images for the kubelet: what a container runs and from which root filesystem.

`images` (the default): a container's `image` is looked up in this machine's containers-storage,
which `make images` fills (buildah). Its configuration (ENTRYPOINT, CMD, ENV, WORKDIR, USER) is the
image's own, and its root filesystem is a buildah working container of the image: the image's
layers with a copy-on-write layer of the container's own, mounted by overlayfs and removed with
the pod. An image that is not in the store cannot be pulled here (no registry): the kubelet reports
ErrImagePull, then ImagePullBackOff, as one whose registry is unreachable; with `imagePullPolicy:
Never`, ErrImageNeverPull.

`host` (`PODS_FROM=host`, for quick local loops): containers run this machine's Python environment,
and the image's ENTRYPOINT and CMD are read from the project's own Dockerfile that builds it.

Either way Kubernetes' rule merges the two: `command` replaces the ENTRYPOINT, `args` the CMD, and
`env` adds to and overrides the image's ENV.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import layout

DOCKERFILES = {
    "dtrain-operator": layout.REPO / "operator" / "Dockerfile",
    "dtrain-trainer": layout.REPO / "trainer_image" / "Dockerfile",
    "dtrain-engine": layout.REPO / "trainer_image" / "engine.Dockerfile",
}


class ImageNotPresent(Exception):
    """The image is not in the local store."""


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""


def argv(container: dict[str, Any], config: ImageConfig) -> list[str]:
    command = container.get("command") or config.entrypoint
    args = container.get("args") if container.get("args") is not None else ([] if container.get("command") else config.cmd)
    return list(command) + list(args or [])


def _repository(image: str) -> str:
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def is_project_image(image: str) -> bool:
    """One of the images this project's Dockerfiles build (which host mode runs from this machine's environment)."""
    return _repository(image) in DOCKERFILES


def dockerfile_config(image: str) -> ImageConfig:
    """ENTRYPOINT and CMD of the project's Dockerfile that builds `image` (host mode); empty when unknown."""
    dockerfile = DOCKERFILES.get(_repository(image))
    if dockerfile is None or not dockerfile.exists():
        return ImageConfig()
    found: dict[str, list[str]] = {}
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^\s*(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
        if match:
            found[match.group(1)] = json.loads(match.group(2))
    return ImageConfig(found.get("ENTRYPOINT", []), found.get("CMD", []))


def buildah(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=False, timeout=300)


def store_config(image: str) -> ImageConfig:
    """The image's configuration in containers-storage; ImageNotPresent when it is not there."""
    result = buildah("inspect", "--type", "image", image)
    if result.returncode != 0:
        raise ImageNotPresent(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else image)
    config = (json.loads(result.stdout).get("OCIv1") or {}).get("config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return ImageConfig(config.get("Entrypoint") or [], config.get("Cmd") or [], env,
                       config.get("WorkingDir") or "", config.get("User") or "")


def mount_root(image: str, name: str) -> str:
    """A working container of `image` named `name` (the image's layers and a writable layer of its own),
    mounted: its root filesystem's path."""
    buildah("rm", name)  # one a killed kubelet left under this name
    created = buildah("from", "--pull-never", "--name", name, image)
    if created.returncode != 0:
        raise ImageNotPresent(created.stderr.strip())
    mounted = buildah("mount", name)
    if mounted.returncode != 0:
        buildah("rm", name)
        raise RuntimeError(f"buildah mount {name}: {mounted.stderr.strip()}")
    return mounted.stdout.strip()


def remove_root(name: str) -> None:
    """The container's writable layer goes with the pod."""
    buildah("umount", name)
    buildah("rm", name)


def _table(root: str, name: str) -> list[list[str]]:
    """The rows of the image's /etc/passwd or /etc/group (its users and groups by name)."""
    try:
        return [line.rstrip("\n").split(":") for line in Path(root, "etc", name).read_text().splitlines()]
    except OSError:
        return []


def resolve_user(root: str, user: str) -> tuple[int | None, int | None]:
    """The image's USER (`name`, `uid`, `name:group`, `uid:gid`) as numbers, from the root's /etc/passwd
    and /etc/group; None for what cannot be found."""
    if not user:
        return None, None
    name, _, group = user.partition(":")
    passwd = {row[0]: row for row in _table(root, "passwd") if len(row) > 3}
    groups = {row[0]: row for row in _table(root, "group") if len(row) > 2}
    uid = int(name) if name.isdigit() else (int(passwd[name][2]) if name in passwd else None)
    if group:
        gid = int(group) if group.isdigit() else (int(groups[group][2]) if group in groups else None)
    else:
        gid = int(passwd[name][3]) if name in passwd else None
    return uid, gid
