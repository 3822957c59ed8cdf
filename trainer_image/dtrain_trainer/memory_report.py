"""`dtrain validate --estimate`: build the job's model and data as the trainer does, estimate
per-GPU memory (memory.py) and print it as a table with a verdict. `dtrain submit`: the same
estimate, recorded on the object for the operator (dtrain_operator.api.memory_estimate)."""

from __future__ import annotations

import sys

import torch

from dtrain_common.errors import ConfigError
from dtrain_common.loading import instantiate
from dtrain_operator import api
from dtrain_operator.api.contract import LABEL_GPU_MEMORY
from dtrain_operator.api.memory_estimate import ANNOTATION, MAX_SUGGESTION_CHARS, EstimateRecord, estimated_spec_hash
from dtrain_trainer.example_inputs import resolve_example
from dtrain_trainer.loading import instantiate_data, job_classes
from dtrain_trainer.memory import MEASURED_BATCHES, JobEstimate, describe, estimate_job, format_bytes, gpu_memory_of


def estimate(job: api.DistributedTraining, gpu_memory_flag: str | None) -> JobEstimate:
    """Raises ConfigError (a bad class or arguments) or ValueError (a bad --gpu-memory)."""
    spec = job.spec
    gpu_memory = gpu_memory_of(spec, gpu_memory_flag)
    torch.manual_seed(spec.trainer.seed)
    # The Lightning package the user's classes are built on, as the trainer chooses it.
    pl, model_cls, data_cls = job_classes(spec.model, spec.data)
    model = instantiate(spec.model, "model", pl.LightningModule, cls=model_cls)
    notes = []
    try:
        data = instantiate_data(spec.data, pl, data_cls, MEASURED_BATCHES[1], 0)
    except ConfigError as exc:  # the data set lives on the cluster: estimate from the input shape
        data, notes = None, [f"the data module cannot be built here ({exc})"]
    # The synthetic batch, when the data cannot be read here, is (inputs of this shape, labels).
    shape = resolve_example(spec.export.onnx.input_shape, spec.export.onnx.input_dtype, data, model).shapes[0]
    result = estimate_job(model, data, shape, spec.trainer, gpu_memory)
    result.estimate.notes.extend(notes)
    return result


def print_estimate(job: api.DistributedTraining, gpu_memory_flag: str | None) -> int:
    """The table on stdout; 0 when it fits or no GPU memory is known, 3 when it does not fit."""
    try:
        result = estimate(job, gpu_memory_flag)
    except (ConfigError, ValueError) as exc:
        print(f"{job.name}: cannot estimate: {exc}", file=sys.stderr)
        return 1
    e = result.estimate
    print(f"memory per GPU of {job.name} ({e.precision}, batch {e.batch_size} per process)")
    rows = describe(e, result.fit, result.gpu_memory)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for note in e.notes:
        print(f"  note: {note}")
    if result.gpu_memory is None:
        print(f"  (give --gpu-memory 32Gi, set spec.gpuMemory, or select nodes by the {LABEL_GPU_MEMORY} label, "
              "for a verdict)")
    return 3 if result.fit is not None and not result.fit.fits else 0


def record_of(job: api.DistributedTraining, result: JobEstimate) -> EstimateRecord:
    """What `dtrain submit` records: the peak, the verdict for the spec's GPU memory, the first fix."""
    verdict = result.fit
    suggestion = verdict.suggestions[0][:MAX_SUGGESTION_CHARS] if verdict is not None and not verdict.fits else None
    return EstimateRecord(
        peak_bytes=result.estimate.total,
        spec_hash=estimated_spec_hash(job.spec),
        gpu_memory_bytes=result.gpu_memory,
        fits=verdict.fits if verdict is not None else None,
        suggestion=suggestion,
    )


def submit_annotation(job: api.DistributedTraining) -> tuple[dict[str, str], str, bool]:
    """The annotation `dtrain submit` adds (none when the model cannot be built here), a line saying
    what it found, and whether that line is for stderr (no estimate, or the batch does not fit)."""
    try:
        result = estimate(job, None)  # the GPU memory the operator sees too: the spec's, not a flag's
    except (ConfigError, ValueError) as exc:
        return {}, f"note: no memory estimate recorded: {exc}", True
    except Exception as exc:  # noqa: BLE001 - the user's model failed on the CPU (a CUDA-only kernel?): the job is still submitted
        failed = f"{type(exc).__name__}: {exc}"
        return {}, f"note: no memory estimate recorded: building or running the model here failed ({failed})", True
    record = record_of(job, result)
    peak = f"estimated peak {format_bytes(record.peak_bytes)} per GPU"
    annotation = {ANNOTATION: record.encode()}
    if result.fit is None or result.gpu_memory is None:
        return annotation, f"memory: {peak}; set spec.gpuMemory (e.g. 32Gi) for a verdict", False
    of = f"{format_bytes(result.gpu_memory)} (usable {format_bytes(result.fit.usable)})"
    if result.fit.fits:
        return annotation, f"memory: {peak} fits in {of}", False
    return annotation, (
        f"warning: memory: {peak} does NOT fit in {of}; fits instead: {record.suggestion}. Submitted as it is "
        f"(the job gets the GPUMemoryExceeded condition); `dtrain validate --estimate` shows the whole estimate"
    ), True
