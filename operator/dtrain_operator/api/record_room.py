"""Room for the copies a job's spec has: a bound on the spec's size and the user's annotations.

`kubectl apply` keeps a copy of the object (its spec and annotations) in one of its annotations, and the API server
keeps at most 256 KiB of annotations on an object (kubernetes.MAX_ANNOTATIONS_BYTES, keys and values in UTF-8 bytes);
once it accepts a job, the operator keeps another copy of the spec, with every default filled in, in
status.acceptedSpec. A job whose spec outgrows that room is refused at apply by the server with a message about
annotations, or has its status refused for ever with nothing created. So a job is refused first, with a line that
names the spec's size and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from dtrain_operator.api import kubernetes

if TYPE_CHECKING:
    from dtrain_operator.api.spec import DistributedTrainingSpec

# Written by `kubectl apply` (client-side): the object as the user wrote it, so the spec and the annotations again.
KUBECTL_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
# What the annotations hold besides the user's annotations and kubectl's copy of them and of the spec: kubectl's copy
# of the object's other metadata and of values written in another form than the spec's JSON; rounded up.
METADATA_ROOM_BYTES: Final = 32 * 1024
# The spec and the user's annotations together, each counted twice (the object and kubectl's copy of it): half of
# what the room leaves, 112 KiB. The spec's third copy, status.acceptedSpec, then keeps the object far below etcd's
# 1.5 MiB.
MAX_SPEC_AND_ANNOTATIONS_BYTES: Final = (kubernetes.MAX_ANNOTATIONS_BYTES - METADATA_ROOM_BYTES) // 2
_SHRINK_SPEC: Final = (
    "shrink what is largest (initArgs, env, volumes): a large value belongs in a ConfigMap or a file on the storage"
)


def spec_bytes(spec: DistributedTrainingSpec) -> int:
    """The spec's size as status.acceptedSpec holds it: compact JSON of every field, defaults filled in, in UTF-8."""
    return len(json.dumps(spec.to_wire(), separators=(",", ":"), ensure_ascii=False).encode())


def user_annotations_bytes(annotations: Mapping[str, str | None]) -> int:
    """The bytes of the annotations a user writes: not kubectl's copy of the object."""
    return kubernetes.annotations_bytes({key: value for key, value in annotations.items() if key != KUBECTL_LAST_APPLIED})


def room_problem(spec: DistributedTrainingSpec, annotations: Mapping[str, str | None]) -> str | None:
    """The one line that refuses a job whose spec and annotations outgrow their room, else None."""
    size = spec_bytes(spec)
    if size > MAX_SPEC_AND_ANNOTATIONS_BYTES:
        return (
            f"spec: is {size:,} bytes as JSON (defaults filled in), over the {MAX_SPEC_AND_ANNOTATIONS_BYTES:,} a job's "
            f"spec may be: `kubectl apply` keeps a copy of it in the job's annotations, which hold at most "
            f"{kubernetes.MAX_ANNOTATIONS_BYTES:,} bytes; {_SHRINK_SPEC}"
        )
    room = MAX_SPEC_AND_ANNOTATIONS_BYTES - size
    used = user_annotations_bytes(annotations)
    if used > room:
        return (
            f"metadata.annotations: hold {used:,} bytes; beside this spec ({size:,} bytes) at most {room:,} fit, "
            f"so that the job's annotations ({kubernetes.MAX_ANNOTATIONS_BYTES:,} bytes at most) keep room for "
            "`kubectl apply`'s copy of them and of the spec; shrink or remove annotations, or shrink the spec"
        )
    return None
