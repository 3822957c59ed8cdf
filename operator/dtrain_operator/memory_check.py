"""Will the batch fit? The operator's side of the memory pre-flight, and the arithmetic both sides share.

The estimate itself needs torch and the job's model (dtrain_trainer.memory), which the operator
image does not have. `dtrain submit` computes it where torch is installed and records it on the
object in the `dtrain.dev/memory-estimate` annotation (`EstimateRecord`); at creation the operator
compares the recorded peak with what it knows of the GPU, the spec's `gpuMemory` or the
`nvidia.com/gpu.memory` label its nodeSelector names, and sets the GPUMemoryExceeded condition
(with a Warning Event when True). It refuses and restarts nothing: the estimate is an estimate.

The annotation is user input (anyone who may edit the object may write it), so it is read
strictly: a bounded size, exact keys and types, and a spec hash that must match the spec being
accepted, so that an estimate of another spec is not believed. The GPU memory it carries is only
the client's; the operator's verdict uses the GPU memory it reads from the spec itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from . import contract, trusted
from .api import MEMORY_SIZE_PATTERN, DistributedTrainingSpec, immutable_spec

ANNOTATION = contract.ANNOTATION_MEMORY_ESTIMATE
# Not available to tensors: the CUDA context, cuDNN/cuBLAS handles and workspaces.
RESERVED_BYTES = 1024**3
# Headroom for the caching allocator's fragmentation.
FRAGMENTATION_MARGIN = 0.05

CONDITION = "GPUMemoryExceeded"
REASON_EXCEEDS = "EstimateExceedsGPUMemory"
REASON_FITS = "EstimateFits"
REASON_UNREADABLE = "EstimateUnreadable"
REASON_STALE = "EstimateStale"
REASON_NO_ESTIMATE = "NoEstimate"
REASON_GPU_MEMORY_UNKNOWN = "GPUMemoryUnknown"

# Bounds on the annotation: a real record is about 300 bytes; no GPU has an exbibyte.
MAX_ANNOTATION_BYTES = 2048
MAX_BYTES = 2**60
MAX_SUGGESTION_CHARS = 300
_SPEC_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_KEYS = {"peakBytes", "gpuMemoryBytes", "fits", "suggestion", "specHash"}
_HOW_TO_ESTIMATE = (
    f"`dtrain submit` records one in the {ANNOTATION} annotation where torch and dtrain's trainer extra are "
    "installed (the operator cannot build the model); `dtrain validate --estimate` prints it"
)

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


def spec_gpu_memory(spec: DistributedTrainingSpec) -> Optional[int]:
    """One GPU's memory as the spec says it: gpuMemory, else the GPU-memory label its nodeSelector names
    (MiB). None when neither says, or for a CPU job."""
    if spec.accelerator != "gpu":
        return None
    if spec.gpu_memory is not None:
        return parse_memory(spec.gpu_memory)
    label = spec.scheduling.node_selector.get(contract.LABEL_GPU_MEMORY)
    return int(label) * 2**20 if label and label.isdigit() and len(label) <= 9 else None


def estimated_spec_hash(spec: DistributedTrainingSpec) -> str:
    """The hash an estimate of `spec` carries: the operator's hash of the spec it accepts (trusted.py)."""
    return trusted.spec_hash(immutable_spec(spec))


@dataclass(frozen=True)
class EstimateRecord:
    """The estimate `dtrain submit` writes on the object: the peak of one training process, and the
    client's verdict (for people reading the object; the operator makes its own)."""

    peak_bytes: int
    spec_hash: str
    gpu_memory_bytes: Optional[int] = None
    fits: Optional[bool] = None
    suggestion: Optional[str] = None
    """The change that fits (from the estimate), when it does not."""

    def encode(self) -> str:
        record: dict[str, Any] = {"peakBytes": self.peak_bytes, "specHash": self.spec_hash}
        optional = {"gpuMemoryBytes": self.gpu_memory_bytes, "fits": self.fits, "suggestion": self.suggestion}
        record.update({k: v for k, v in optional.items() if v is not None})
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


class UnreadableEstimate(ValueError):
    """The annotation is there but is not a record this operator can believe."""


def _byte_count(record: Mapping[str, Any], key: str) -> Optional[int]:
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
    spec_hash = record.get("specHash")
    if not isinstance(spec_hash, str) or not _SPEC_HASH.match(spec_hash):
        raise UnreadableEstimate("specHash must be sha256: and 64 hex digits")
    fits = record.get("fits")
    if fits is not None and not isinstance(fits, bool):
        raise UnreadableEstimate("fits must be true or false")
    suggestion = record.get("suggestion")
    if suggestion is not None and (
        not isinstance(suggestion, str) or len(suggestion) > MAX_SUGGESTION_CHARS or not suggestion.isprintable()
    ):
        raise UnreadableEstimate(f"suggestion must be one printable line of at most {MAX_SUGGESTION_CHARS} characters")
    return EstimateRecord(peak, spec_hash, _byte_count(record, "gpuMemoryBytes"), fits, suggestion)


@dataclass(frozen=True)
class Verdict:
    """What the GPUMemoryExceeded condition says."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def verdict(annotations: Any, spec: DistributedTrainingSpec) -> Optional[Verdict]:
    """The memory condition of a job being accepted with `spec`, from its annotations; None: no condition.

    No condition for a CPU job, nor for a GPU job with neither an estimate nor a gpuMemory (most jobs:
    nothing to say). A job that states its gpuMemory asked for a check, so it hears how to get one.
    """
    if spec.accelerator != "gpu":
        return None
    text = annotations.get(ANNOTATION) if isinstance(annotations, Mapping) else None
    gpu_memory = spec_gpu_memory(spec)
    if text is None:
        if spec.gpu_memory is None:
            return None
        return Verdict("Unknown", REASON_NO_ESTIMATE, f"no memory estimate to compare with gpuMemory: {_HOW_TO_ESTIMATE}")
    try:
        record = decode(text)
    except UnreadableEstimate as exc:
        return Verdict("Unknown", REASON_UNREADABLE, f"annotation {ANNOTATION} is not a memory estimate: {exc}. "
                       f"Remove it, or submit again: {_HOW_TO_ESTIMATE}")
    if record.spec_hash != estimated_spec_hash(spec):
        return Verdict("Unknown", REASON_STALE, f"annotation {ANNOTATION} estimates another spec (its specHash is not "
                       f"this spec's): submit the job again with `dtrain submit` for an estimate of this one")
    peak = f"estimated peak {format_bytes(record.peak_bytes)} per GPU"
    if gpu_memory is None:
        return Verdict("Unknown", REASON_GPU_MEMORY_UNKNOWN, f"{peak}; set gpuMemory (e.g. 32Gi), or select nodes by "
                       f"the {contract.LABEL_GPU_MEMORY} label in scheduling.nodeSelector, for a verdict")
    usable = usable_bytes(gpu_memory)
    of = f"{format_bytes(gpu_memory)} per GPU (usable {format_bytes(usable)})"
    if record.peak_bytes <= usable:
        return Verdict("False", REASON_FITS, f"{peak} fits in {of}")
    # The client's suggestion was worked out for its GPU memory: shown only when that is this one.
    fix = (
        f"fits instead: {record.suggestion}"
        if record.suggestion and record.gpu_memory_bytes == gpu_memory
        else "run `dtrain validate --estimate` for a batch size or precision that fits"
    )
    return Verdict("True", REASON_EXCEEDS, f"{peak} exceeds {of}: the first training step will likely run out of "
                   f"memory; {fix}. The job runs as it is")
