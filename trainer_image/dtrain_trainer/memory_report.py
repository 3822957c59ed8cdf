"""`dtrain validate --estimate`: build the job's model and data as the trainer does, estimate
per-GPU memory (memory.py) and print it as a table with a verdict."""

from __future__ import annotations

import sys

import torch

from dtrain_operator import api
from dtrain_trainer.config import ConfigError
from dtrain_trainer.export import resolve_example
from dtrain_trainer.loading import instantiate, instantiate_data, job_classes
from dtrain_trainer.memory import MEASURED_BATCHES, JobEstimate, describe, estimate_job, gpu_memory_of


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
        print("  (give --gpu-memory 32Gi, or select nodes by the nvidia.com/gpu.memory label, for a verdict)")
    return 3 if result.fit is not None and not result.fit.fits else 0
