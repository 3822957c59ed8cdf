"""What a container runs when its spec names no `command`: the image's ENTRYPOINT and CMD.

Pods run from this machine's environment here, not from their images (there is no container
runtime), so the image's configuration is read from the project's own Dockerfile that builds it
(`dtrain-operator`, `dtrain-trainer`, `dtrain-engine`, whatever the registry and tag): the same
ENTRYPOINT and CMD the built image carries. Kubernetes' rule applies: `command` replaces the
ENTRYPOINT, `args` replaces the CMD.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import layout

DOCKERFILES = {
    "dtrain-operator": layout.REPO / "operator" / "Dockerfile",
    "dtrain-trainer": layout.REPO / "trainer_image" / "Dockerfile",
    "dtrain-engine": layout.REPO / "trainer_image" / "engine.Dockerfile",
}


def _repository(image: str) -> str:
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


def image_command(image: str) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the image's Dockerfile, in their exec (JSON) forms; empty when unknown."""
    dockerfile = DOCKERFILES.get(_repository(image))
    if dockerfile is None or not dockerfile.exists():
        return [], []
    found: dict[str, list[str]] = {}
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^\s*(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
        if match:
            found[match.group(1)] = json.loads(match.group(2))
    return found.get("ENTRYPOINT", []), found.get("CMD", [])


def argv(container: dict[str, Any]) -> list[str]:
    entrypoint, cmd = image_command(container.get("image", ""))
    command = container.get("command") or entrypoint
    args = container.get("args") if container.get("args") is not None else ([] if container.get("command") else cmd)
    return list(command) + list(args or [])
