"""Per-GPU memory of a job, estimated before it is scheduled (`dtrain validate --estimate`).

What a training step holds at its peak, per process:
- weights, gradients and optimizer state: exact arithmetic from the parameter count, the
  precision and the optimizer the model's own `configure_optimizers` returns;
- activations: what autograd saves for the backward pass, measured by a forward pass of
  the real model on the CPU at two small batches (saved-tensor hooks; each storage counted
  once, since a naive count of saved tensors counts a ReLU's output and the next layer's
  input twice; parameters excluded, they are counted above), then scaled linearly to
  `batchSize`;
- the backward pass's transient: the gradient of the largest saved activation and of its
  input exist at once, two more copies of it;
- under mixed precision, autocast's cached half-precision copy of the weights.

What it cannot see: cuDNN/cuBLAS workspaces and the CUDA context (left out of the usable
memory instead), allocator fragmentation (a margin), and kernels that save differently
on a GPU than on a CPU (fused attention). `bench/memory_estimate_gpu.py` compares the
estimate with `torch.cuda.max_memory_allocated` where a GPU exists.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# The arithmetic the operator's check shares (it has no torch): one source, in the operator's package.
from dtrain_operator.api.memory_estimate import format_bytes, parse_memory, spec_gpu_memory, usable_bytes

# Bytes per element of the weights, and whether autocast keeps a half copy of them.
_WEIGHT_BYTES = {"64-true": 8, "32-true": 4, "16-true": 2, "bf16-true": 2, "16-mixed": 4, "bf16-mixed": 4}
_ACTIVATION_DTYPE = {
    "64-true": torch.float64, "32-true": torch.float32, "16-true": torch.bfloat16, "bf16-true": torch.bfloat16,
    "16-mixed": torch.bfloat16, "bf16-mixed": torch.bfloat16,
}
MIXED = ("16-mixed", "bf16-mixed")
# Batch sizes the activations are measured at (2, not 1: BatchNorm after pooling needs two samples).
MEASURED_BATCHES = (2, 4)


@dataclass(frozen=True)
class StateBytes:
    """Weights, gradients and optimizer state of one process, in bytes."""

    weights: int
    gradients: int
    optimizer: int
    optimizer_note: str


def optimizer_slots(optimizer: torch.optim.Optimizer | None) -> tuple[int, str]:
    """How many parameter-sized buffers the optimizer keeps, and their names."""
    if optimizer is None:
        return 0, "none"
    name = type(optimizer).__name__
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        amsgrad = any(group.get("amsgrad") for group in optimizer.param_groups)
        return (3, f"{name}: exp_avg, exp_avg_sq, max_exp_avg_sq") if amsgrad else (2, f"{name}: exp_avg, exp_avg_sq")
    if isinstance(optimizer, torch.optim.SGD):
        momentum = any(group.get("momentum", 0) for group in optimizer.param_groups)
        return (1, f"{name}: momentum buffer") if momentum else (0, f"{name}: no state")
    if isinstance(optimizer, (torch.optim.RMSprop, torch.optim.Adagrad)):
        return 1, f"{name}: one buffer per parameter"
    return 2, f"{name}: assumed two buffers per parameter, as Adam"


def state_bytes(trainable: int, frozen: int, precision: str, slots: int, slots_note: str) -> StateBytes:
    """Exact: weights of every parameter, gradients and optimizer state of the trainable ones.
    Mixed precision keeps fp32 weights, gradients and state; `-true` precisions keep all of
    them in that dtype."""
    size = _WEIGHT_BYTES[precision]
    return StateBytes(
        weights=(trainable + frozen) * size,
        gradients=trainable * size,
        optimizer=trainable * size * slots,
        optimizer_note=slots_note,
    )


@dataclass(frozen=True)
class SavedTensors:
    """What autograd saved during one forward pass: unique storages, and the largest one."""

    total: int
    largest: int


def saved_tensor_bytes(module: torch.nn.Module, forward: Callable[[], Any]) -> SavedTensors:
    """Bytes autograd keeps for backward while `forward()` runs, each storage once, parameters excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in parameters:
            storages[pointer] = max(storages.get(pointer, 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return SavedTensors(sum(storages.values()), max(storages.values(), default=0))


@dataclass
class MemoryEstimate:
    """The peak of one training process, part by part (bytes)."""

    precision: str
    batch_size: int
    parameters: int
    state: StateBytes
    activations: int
    backward_transient: int
    autocast_weight_copies: int
    measured_batches: tuple[int, int]
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        s = self.state
        return s.weights + s.gradients + s.optimizer + self.activations + self.backward_transient + self.autocast_weight_copies


@dataclass(frozen=True)
class ActivationModel:
    """Activations and the largest saved storage as a fixed part plus a part per sample."""

    fixed: float
    per_sample: float
    largest_per_sample: float

    def at(self, batch: int) -> tuple[int, int]:
        activations = max(0, int(self.fixed + self.per_sample * batch))
        return activations, int(2 * self.largest_per_sample * batch)


def estimate_from(
    precision: str,
    batch_size: int,
    trainable: int,
    frozen: int,
    slots: tuple[int, str],
    activation: ActivationModel,
    measured_batches: tuple[int, int],
) -> MemoryEstimate:
    state = state_bytes(trainable, frozen, precision, *slots)
    activations, transient = activation.at(batch_size)
    copies = (trainable + frozen) * 2 if precision in MIXED else 0
    return MemoryEstimate(precision, batch_size, trainable + frozen, state, activations, transient, copies, measured_batches)


@dataclass(frozen=True)
class Fit:
    """Whether the job fits, and a change that makes it fit when it does not."""

    fits: bool
    usable: int
    suggestions: list[str]


def fit(
    estimate: MemoryEstimate,
    gpu_memory: int,
    accumulate: int,
    activation: ActivationModel,
    trainable: int,
    frozen: int,
    slots: tuple[int, str],
) -> Fit:
    """Compare with the GPU; when it does not fit, the largest batch that does with the same
    global batch (more gradient accumulation), and bf16-mixed when the job runs in fp32."""
    usable = usable_bytes(gpu_memory)
    if estimate.total <= usable:
        return Fit(True, usable, [])
    suggestions = []
    global_batch = estimate.batch_size * accumulate
    for factor in range(2, estimate.batch_size + 1):
        if estimate.batch_size % factor:
            continue
        smaller = estimate.batch_size // factor
        candidate = estimate_from(estimate.precision, smaller, trainable, frozen, slots, activation, estimate.measured_batches)
        if candidate.total <= usable:
            suggestions.append(
                f"trainer.batchSize: {smaller} with trainer.accumulateGradBatches: {accumulate * factor} "
                f"(the same global batch of {global_batch} per process; {format_bytes(candidate.total)})"
            )
            break
    if estimate.precision in ("32-true", "64-true"):
        half = ActivationModel(activation.fixed / 2, activation.per_sample / 2, activation.largest_per_sample / 2)
        mixed = estimate_from("bf16-mixed", estimate.batch_size, trainable, frozen, slots, half, estimate.measured_batches)
        if mixed.total <= usable:
            suggestions.append(f"trainer.precision: bf16-mixed (about {format_bytes(mixed.total)}; activations halve)")
    if not suggestions:
        suggestions.append("no batch size fits: use more GPUs' memory per model (FSDP) or a smaller model")
    return Fit(False, usable, suggestions)


def measure_activations(
    module: torch.nn.Module, make_forward: Callable[[int], Callable[[], Any]], precision: str, batches: tuple[int, int]
) -> ActivationModel:
    """Saved-tensor bytes at two batch sizes, fitted as fixed + per-sample."""
    small, large = batches
    dtype = _ACTIVATION_DTYPE[precision]
    measured = []
    for batch in (small, large):
        forward = make_forward(batch)
        autocast = torch.autocast("cpu", dtype=dtype) if precision in MIXED else contextlib.nullcontext()
        with autocast:
            measured.append(saved_tensor_bytes(module, forward))
    per_sample = (measured[1].total - measured[0].total) / (large - small)
    fixed = measured[0].total - per_sample * small
    largest = max(measured[1].largest / large, (measured[1].largest - measured[0].largest) / (large - small))
    return ActivationModel(fixed, per_sample, largest)


def describe(estimate: MemoryEstimate, result: Fit | None, gpu_memory: int | None) -> list[tuple[str, str]]:
    """The rows of the estimate table."""
    s = estimate.state
    small, large = estimate.measured_batches
    rows = [
        ("parameters", f"{estimate.parameters / 1e6:.2f} M"),
        ("weights", format_bytes(s.weights) + (" (fp32 master weights)" if estimate.precision in MIXED else "")),
        ("gradients", format_bytes(s.gradients)),
        ("optimizer state", f"{format_bytes(s.optimizer)} ({s.optimizer_note})"),
        ("activations", (f"{format_bytes(estimate.activations)} (saved tensors at batch {small} and {large} on the CPU, "
                         f"scaled to {estimate.batch_size})")),
        ("backward transient", format_bytes(estimate.backward_transient)),
    ]
    if estimate.autocast_weight_copies:
        rows.append(("autocast weight copies", format_bytes(estimate.autocast_weight_copies)))
    rows.append(("peak per GPU", format_bytes(estimate.total)))
    if gpu_memory is not None and result is not None:
        verdict = "fits" if result.fits else "does NOT fit"
        rows.append(("GPU memory", f"{format_bytes(gpu_memory)} (usable {format_bytes(result.usable)}): {verdict}"))
        rows.extend(("fits instead", suggestion) for suggestion in result.suggestions)
    return rows


# --- A job's estimate: the real model, its optimizer and a batch of its data ------------------


@dataclass
class JobEstimate:
    estimate: MemoryEstimate
    fit: Fit | None
    gpu_memory: int | None


def gpu_memory_of(spec: Any, flag: str | None) -> int | None:
    """--gpu-memory, else what the spec says: gpuMemory, else the GPU-memory node label it selects
    (GPU feature discovery, MiB), as the operator reads them."""
    if flag:
        return parse_memory(flag)
    return spec_gpu_memory(spec)


class _TrainerStandIn:
    """What configure_optimizers may read of its Trainer before one exists: the run's length, for a
    learning-rate schedule (the built-in model's cosine schedule). A schedule keeps no per-parameter
    state, so its length does not change the estimate: where the data cannot tell the batches of an
    epoch here, one step an epoch stands in."""

    def __init__(self, settings: Any, batches_per_epoch: int | None) -> None:
        self.max_steps = getattr(settings, "max_steps", -1)
        self.max_epochs = getattr(settings, "max_epochs", None)
        accumulate = getattr(settings, "accumulate_grad_batches", 1) or 1
        steps_per_epoch = max(1, math.ceil((batches_per_epoch or 1) / accumulate))
        if self.max_steps is not None and self.max_steps > 0:
            self.estimated_stepping_batches = float(self.max_steps)
        elif self.max_epochs is not None and self.max_epochs > 0:
            self.estimated_stepping_batches = float(self.max_epochs * steps_per_epoch)
        else:
            self.estimated_stepping_batches = math.inf  # as Lightning's Trainer says of a run without an end


def _optimizer_of(model: Any, trainer: _TrainerStandIn) -> tuple[torch.optim.Optimizer | None, list[str]]:
    model.trainer = trainer
    try:
        configured = model.configure_optimizers()
    except Exception as exc:  # noqa: BLE001 - it needs what only training has: estimate Adam's state and say so
        note = (
            f"configure_optimizers() read what only a running Trainer has ({type(exc).__name__}: {exc}); "
            "estimated with Adam's state (two buffers per parameter), the built-in model's default"
        )
        return None, [note]
    finally:
        model.trainer = None  # training_step runs below as outside a Trainer: its self.log() records nothing
    if isinstance(configured, dict):
        configured = configured.get("optimizer")
    elif isinstance(configured, (list, tuple)) and configured:
        configured = configured[0][0] if isinstance(configured[0], (list, tuple)) else configured[0]
    return (configured, []) if isinstance(configured, torch.optim.Optimizer) else (None, ["no optimizer found; assumed Adam"])


def _batch_maker(
    model: Any, data: Any, sample_shape: tuple[int, ...]
) -> tuple[Callable[[int], Any], str, int | None]:
    """A function batch_size -> a training batch: from the data module when it can give one, else
    (images, labels) of the configured input shape; and the batches of one epoch, where known."""
    try:
        if data is None:
            raise LookupError("no data module")
        data.setup("fit")
        loader = data.train_dataloader()
        real = next(iter(loader))

        def from_data(batch: int) -> Any:
            return _slice(real, batch)

        _slice(real, 2)
        try:
            batches: int | None = len(loader)
        except TypeError:  # an iterable loader has no length
            batches = None
        return from_data, "a batch of the job's own data", batches
    except Exception:  # noqa: BLE001 - the job's own data cannot be sampled here: synthetic inputs of the model's shape instead
        classes = int(getattr(model, "num_classes", None) or getattr(data, "num_classes", None) or 10)

        def synthetic(batch: int) -> Any:
            return torch.randn(batch, *sample_shape), torch.randint(0, classes, (batch,))

        return synthetic, f"synthetic images of shape {list(sample_shape)} (the data is not readable here)", None


def _slice(batch: Any, size: int) -> Any:
    if isinstance(batch, torch.Tensor):
        if batch.shape[0] < size:
            raise ValueError("batch too small")
        return batch[:size]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(item, size) for item in batch)
    if isinstance(batch, dict):
        return {key: _slice(value, size) for key, value in batch.items()}
    return batch


def estimate_job(model: Any, data: Any, sample_shape: tuple[int, ...], settings: Any, gpu_memory: int | None,
                 batches: tuple[int, int] = MEASURED_BATCHES) -> JobEstimate:
    """Estimate for a model and data module already built from the job's spec."""
    precision = settings.precision
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # data loaders' own deprecation notices: nothing a user can act on here
        make_batch, source, batches_per_epoch = _batch_maker(model, data, sample_shape)
    optimizer, notes = _optimizer_of(model, _TrainerStandIn(settings, batches_per_epoch))
    slots = optimizer_slots(optimizer) if optimizer is not None else (2, "assumed Adam: exp_avg, exp_avg_sq")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    model.train()
    if precision in ("16-true", "bf16-true", "64-true"):
        model.to(_ACTIVATION_DTYPE[precision])

    def make_forward(batch: int) -> Callable[[], Any]:
        inputs = make_batch(batch)
        if precision in ("16-true", "bf16-true", "64-true"):
            inputs = _cast(inputs, _ACTIVATION_DTYPE[precision])
        return lambda: model.training_step(inputs, 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log() outside a Trainer warns; nothing is logged here
        activation = measure_activations(model, make_forward, precision, batches)
    estimate = estimate_from(precision, settings.batch_size, trainable, frozen, slots, activation, batches)
    estimate.notes.extend([f"activations measured on {source}", *notes])
    result = None
    if gpu_memory is not None:
        result = fit(estimate, gpu_memory, settings.accumulate_grad_batches, activation, trainable, frozen, slots)
    return JobEstimate(estimate, result, gpu_memory)


def _cast(batch: Any, dtype: torch.dtype) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_cast(item, dtype) for item in batch)
    if isinstance(batch, dict):
        return {key: _cast(value, dtype) for key, value in batch.items()}
    return batch
