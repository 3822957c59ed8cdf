"""The GPUMemoryExceeded condition: will the batch fit? The operator's side of the memory pre-flight.

At creation the operator compares the peak that `dtrain submit` recorded (api.memory_estimate) with
what it knows of the GPU, the spec's `gpuMemory` or the `nvidia.com/gpu.memory` label its nodeSelector
names, and sets the condition (with a Warning Event when True). It refuses and restarts nothing: the
estimate is an estimate. The GPU memory the annotation carries is only the client's; the verdict uses
the GPU memory read from the spec itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dtrain_operator.api import DistributedTrainingSpec, contract
from dtrain_operator.api.memory_estimate import (
    ANNOTATION,
    UnreadableEstimate,
    decode,
    estimated_spec_hash,
    format_bytes,
    spec_gpu_memory,
    usable_bytes,
)
from dtrain_operator.api.reasons import condition_type, reason

CONDITION = condition_type(
    "GPUMemoryExceeded", "the memory estimate `dtrain submit` recorded exceeds the GPU's memory: the first step will "
    "likely run out of memory (the job runs as it is); Unknown when it cannot be compared",
    "`dtrain validate --estimate` for a batch size or precision that fits",
)
REASON_EXCEEDS = reason("EstimateExceedsGPUMemory", "the estimated peak per GPU exceeds the GPU's usable memory",
                        "a smaller batchSize or a lower precision (`dtrain validate --estimate`)")
REASON_FITS = reason("EstimateFits", "the estimated peak per GPU fits (GPUMemoryExceeded False)")
REASON_UNREADABLE = reason("EstimateUnreadable", "the memory estimate annotation cannot be read",
                           "remove the annotation, or submit the job again with `dtrain submit`")
REASON_STALE = reason("EstimateStale", "the memory estimate annotation is for another spec",
                      "submit the job again with `dtrain submit`")
REASON_NO_ESTIMATE = reason("NoEstimate", "gpuMemory is set but no estimate was recorded to compare it with",
                            "submit with `dtrain submit` where torch and the trainer extra are installed")
REASON_GPU_MEMORY_UNKNOWN = reason("GPUMemoryUnknown", "an estimate is recorded but the GPU's memory is not known",
                                   "set gpuMemory, or select nodes by their GPU memory label")

_HOW_TO_ESTIMATE = (
    f"`dtrain submit` records one in the {ANNOTATION} annotation where torch and dtrain's trainer extra are "
    "installed (the operator cannot build the model); `dtrain validate --estimate` prints it"
)


@dataclass(frozen=True)
class Verdict:
    """What the GPUMemoryExceeded condition says."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def verdict(annotations: Any, spec: DistributedTrainingSpec) -> Verdict | None:
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
