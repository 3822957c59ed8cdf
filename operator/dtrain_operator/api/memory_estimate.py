"""The memory estimate `dtrain submit` records on the object (the `dtrain.dev/memory-estimate` annotation),
and the arithmetic of memory sizes that the estimate (dtrain_trainer.memory) and the operator share.

The estimate needs torch and the job's model, which the operator image does not have: `dtrain submit`
computes it where torch is installed, and the operator compares the recorded peak with what it knows
of the GPU at creation (core.status.gpu_memory). The annotation is user input (anyone who may
edit the object may write it), so it is read strictly: a bounded size, exact keys and types, and a
spec hash that must match the spec being accepted, so that an estimate of another spec is not believed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dtrain_operator.api import contract
from dtrain_operator.api.common import MEMORY_SIZE_PATTERN
from dtrain_operator.api.job import immutable_spec, spec_hash
from dtrain_operator.api.spec import DistributedTrainingSpec

ANNOTATION = contract.ANNOTATION_MEMORY_ESTIMATE
# Not available to tensors: the CUDA context, cuDNN/cuBLAS handles and workspaces.
RESERVED_BYTES = 1024**3
# Headroom for the caching allocator's fragmentation.
FRAGMENTATION_MARGIN = 0.05

# Bounds on the annotation: a real record is about 300 bytes; no GPU has an exbibyte.
MAX_ANNOTATION_BYTES = 2048
MAX_BYTES = 2**60
MAX_SUGGESTION_CHARS = 300
_SPEC_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_KEYS = {"peakBytes", "gpuMemoryBytes", "fits", "suggestion", "specHash"}
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_memory(text: str) -> int:
    """Bytes of a memory size written as a Kubernetes quantity with its unit: 32Gi, 80G, 40960Mi."""
    text = str(text).strip()
    match = re.match(MEMORY_SIZE_PATTERN, text)
    if not match:
        raise ValueError(f"{text!r} is not a memory size; write it like 32Gi or 80G")
    number = text[: -len(match.group(2))]
    whole, _, fraction = number.partition(".")
    unit = _UNITS[match.group(2)]
    # Exact integer arithmetic: 1.5Gi is 3 x 2^29 bytes, not a float's rounding of it.
    return int(whole) * unit + (int(fraction) * unit // 10 ** len(fraction) if fraction else 0)


def usable_bytes(gpu_memory: int) -> int:
    """What tensors can use of a GPU: less the CUDA context and workspaces, less fragmentation."""
    return max(0, int((gpu_memory - RESERVED_BYTES) * (1 - FRAGMENTATION_MARGIN)))


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def spec_gpu_memory(spec: DistributedTrainingSpec) -> int | None:
    """One GPU's memory as the spec says it: gpuMemory, else the GPU-memory label its nodeSelector names
    (MiB). None when neither says, or for a CPU job."""
    if spec.accelerator != "gpu":
        return None
    if spec.gpu_memory is not None:
        return parse_memory(spec.gpu_memory)
    label = spec.scheduling.node_selector.get(contract.LABEL_GPU_MEMORY)
    return int(label) * 2**20 if label and label.isdigit() and len(label) <= 9 else None


def estimated_spec_hash(spec: DistributedTrainingSpec) -> str:
    """The hash an estimate of `spec` carries: the hash of the spec's immutable fields, as the operator accepts it."""
    return spec_hash(immutable_spec(spec))


@dataclass(frozen=True)
class EstimateRecord:
    """The estimate `dtrain submit` writes on the object: the peak of one training process, and the
    client's verdict (for people reading the object; the operator makes its own)."""

    peak_bytes: int
    spec_hash: str
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    suggestion: str | None = None
    """The change that fits (from the estimate), when it does not."""

    def encode(self) -> str:
        record: dict[str, Any] = {"peakBytes": self.peak_bytes, "specHash": self.spec_hash}
        optional = {"gpuMemoryBytes": self.gpu_memory_bytes, "fits": self.fits, "suggestion": self.suggestion}
        record.update({k: v for k, v in optional.items() if v is not None})
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


class UnreadableEstimate(ValueError):
    """The annotation is there but is not a record this operator can believe."""


def _byte_count(record: Mapping[str, Any], key: str) -> int | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BYTES:
        raise UnreadableEstimate(f"{key} must be a whole number of bytes from 0 to 2^60")
    return value


def decode(text: Any) -> EstimateRecord:
    """The record in the annotation's text. Raises UnreadableEstimate naming what is wrong."""
    if not isinstance(text, str):
        raise UnreadableEstimate("it is not a string")
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise UnreadableEstimate(f"{len(text.encode())} bytes, more than the {MAX_ANNOTATION_BYTES} read")
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise UnreadableEstimate(f"not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise UnreadableEstimate("not a JSON object")
    unknown = sorted(set(record) - _KEYS)
    if unknown:
        raise UnreadableEstimate(f"unknown key(s) {', '.join(unknown)[:100]} (written by a newer dtrain?)")
    peak = _byte_count(record, "peakBytes")
    if peak is None:
        raise UnreadableEstimate("peakBytes is missing")
    recorded_hash = record.get("specHash")
    if not isinstance(recorded_hash, str) or not _SPEC_HASH.match(recorded_hash):
        raise UnreadableEstimate("specHash must be sha256: and 64 hex digits")
    fits = record.get("fits")
    if fits is not None and not isinstance(fits, bool):
        raise UnreadableEstimate("fits must be true or false")
    suggestion = record.get("suggestion")
    if suggestion is not None and (
        not isinstance(suggestion, str) or len(suggestion) > MAX_SUGGESTION_CHARS or not suggestion.isprintable()
    ):
        raise UnreadableEstimate(f"suggestion must be one printable line of at most {MAX_SUGGESTION_CHARS} characters")
    return EstimateRecord(peak, recorded_hash, _byte_count(record, "gpuMemoryBytes"), fits, suggestion)
