"""Room in a job's annotations for the operator's record of it: a bound on the spec's size and the user's annotations.

The API server keeps at most 256 KiB of annotations on an object (kubernetes.MAX_ANNOTATIONS_BYTES, keys and values
in UTF-8 bytes). Once it accepts a job, the operator writes its record there (contract.ANNOTATION_STATE: a copy of
the spec with every default filled in); a job that leaves no room for it has that patch refused, and the reconcile
retries for ever with nothing created. So a job is refused first when its spec and annotations would not leave it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from dtrain_operator.api import contract, kubernetes

if TYPE_CHECKING:
    from dtrain_operator.api.spec import DistributedTrainingSpec

# Written by `kubectl apply` (client-side): the object as the user wrote it, so the spec and the annotations again.
KUBECTL_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
# What the annotations hold besides the user's annotations and two copies of the spec (the record's and kubectl's):
# the record's other fields, at most 20 KiB (succeededRanks of 4096 ranks is 19,371 bytes of JSON; the counts, times
# and signature under 1 KiB), the placeholder the record writes for each env value (13 bytes, up to 256 of them),
# and kubectl's copy of the object's metadata; rounded up.
RECORD_ROOM_BYTES: Final = 32 * 1024
# The spec and the user's annotations together, each counted twice (the object and kubectl's copy of it; the record
# copies the spec): half of what the record's room leaves, 112 KiB.
MAX_SPEC_AND_ANNOTATIONS_BYTES: Final = (kubernetes.MAX_ANNOTATIONS_BYTES - RECORD_ROOM_BYTES) // 2
_SHRINK_SPEC: Final = (
    "shrink what is largest (initArgs, env, volumes): a large value belongs in a ConfigMap or a file on the storage"
)


def spec_bytes(spec: DistributedTrainingSpec) -> int:
    """The spec's size as the record holds it: compact JSON of every field, defaults filled in, in UTF-8."""
    return len(json.dumps(spec.to_wire(), separators=(",", ":"), ensure_ascii=False).encode())


def user_annotations_bytes(annotations: Mapping[str, str | None]) -> int:
    """The bytes of the annotations a user writes: not the operator's own, nor kubectl's copy of the object."""
    return kubernetes.annotations_bytes({
        key: value for key, value in annotations.items()
        if not contract.is_operator_annotation(key) and key != KUBECTL_LAST_APPLIED
    })


def room_problem(spec: DistributedTrainingSpec, annotations: Mapping[str, str | None]) -> str | None:
    """The one line that refuses a job whose spec and annotations leave no room for the operator's record, else None."""
    size = spec_bytes(spec)
    if size > MAX_SPEC_AND_ANNOTATIONS_BYTES:
        return (
            f"spec: is {size:,} bytes as JSON (defaults filled in), over the {MAX_SPEC_AND_ANNOTATIONS_BYTES:,} a job's "
            f"spec may be: the operator keeps a copy of it in the job's annotations, which hold at most "
            f"{kubernetes.MAX_ANNOTATIONS_BYTES:,} bytes; {_SHRINK_SPEC}"
        )
    room = MAX_SPEC_AND_ANNOTATIONS_BYTES - size
    used = user_annotations_bytes(annotations)
    if used > room:
        return (
            f"metadata.annotations: hold {used:,} bytes; beside this spec ({size:,} bytes) at most {room:,} fit, "
            f"so that the job's annotations ({kubernetes.MAX_ANNOTATIONS_BYTES:,} bytes at most) keep room for the "
            "operator's record of the job, a copy of its spec; shrink or remove annotations, or shrink the spec"
        )
    return None
