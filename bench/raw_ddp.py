"""The baseline: a plain PyTorch DDP training loop, written by hand as a user would without dtrain.

Run under torchrun (`torchrun -m bench.raw_ddp`); it reads the same trainer config
(DTRAIN_CONFIG) that dtrain's trainer reads and does the same work: the same
torchvision model, synthetic data, batch size, optimizer, precision, gradient
clipping, gradient accumulation (with DDP's no_sync between optimizer steps, as
Lightning does), number of optimizer steps and a final checkpoint. What it leaves
out is everything dtrain adds: Lightning's loop, callbacks, logging, progress reports.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from dtrain_operator.api import TrainerConfig, contract
from dtrain_trainer.data import SyntheticImages

from .step_clock import StepClock


def make_optimizer(name: str, params: Iterator[torch.nn.Parameter], args: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizers of dtrain's ImageClassifier, with its defaults."""
    lr, weight_decay = args.get("lr", 1e-3), args.get("weight_decay", 0.0)
    if name == "sgd":
        momentum = args.get("momentum", 0.9)
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    if precision == "32-true":
        return contextlib.nullcontext()
    raise SystemExit(f"raw_ddp: precision {precision} is not part of the benchmark (use 32-true, bf16-mixed, 16-mixed)")


def batches(
    loader: DataLoader, sampler: DistributedSampler, max_epochs: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    epoch = 0
    while max_epochs is None or epoch < max_epochs:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def init_process_group(config: TrainerConfig) -> tuple[torch.device, int]:
    """This rank's device and local rank, and the process group: NCCL on a GPU, gloo on the CPU."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if config.accelerator == "gpu":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        # The same GPU settings as dtrain's trainer: cuDNN autotuning and TF32 matmuls.
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=config.nccl.timeout_seconds))
    return device, local_rank


def wrap_model(
    config: TrainerConfig, device: torch.device, local_rank: int
) -> tuple[torch.nn.Module, DistributedDataParallel]:
    """The torchvision model on the device, and its DDP wrapper as dtrain's strategy configures it."""
    model_args = config.model.init_args
    model = torchvision.models.get_model(model_args["arch"], weights=None, num_classes=model_args["num_classes"])
    model = model.to(device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[local_rank] if device.type == "cuda" else None,
        find_unused_parameters=config.trainer.find_unused_parameters,
        # As dtrain's DDPStrategy: gradients live in the all-reduce buckets, saving a copy.
        gradient_as_bucket_view=True,
    )
    return model, ddp


def data_loader(
    config: TrainerConfig, device: torch.device
) -> tuple[DataLoader, DistributedSampler[tuple[torch.Tensor, torch.Tensor]]]:
    """The synthetic images, this rank's share of them and their loader."""
    settings = config.trainer
    data_args = config.data.init_args
    size = data_args["image_size"]
    dataset = SyntheticImages(
        data_args["num_samples"],
        (data_args.get("channels", 3), size, size),
        data_args["num_classes"],
        data_args["pool_size"],
        data_args["seed"],
    )
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] = DistributedSampler(
        dataset, shuffle=True, seed=settings.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=sampler,
        num_workers=settings.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=settings.num_workers > 0,
        drop_last=True,
    )
    return loader, sampler


def optimize(
    config: TrainerConfig,
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loader: DataLoader,
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
) -> tuple[int, StepClock]:
    """The training loop, to maxSteps optimizer steps; the optimizer steps taken and each batch's end time."""
    settings = config.trainer
    label_smoothing = config.model.init_args.get("label_smoothing", 0.0)
    clock = StepClock()
    accumulate = settings.accumulate_grad_batches
    steps = 0
    ddp.train()
    for index, (images, labels) in enumerate(batches(loader, sampler, settings.max_epochs)):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        last_of_step = (index + 1) % accumulate == 0
        # Gradients are all-reduced only on the batch that ends an optimizer step.
        with contextlib.nullcontext() if last_of_step else ddp.no_sync():
            with autocast(settings.precision, device):
                loss = F.cross_entropy(ddp(images), labels, label_smoothing=label_smoothing) / accumulate
            scaler.scale(loss).backward()
        if last_of_step:
            if settings.gradient_clip_val is not None:
                scaler.unscale_(optimizer)
                if settings.gradient_clip_algorithm == "norm":
                    torch.nn.utils.clip_grad_norm_(ddp.parameters(), settings.gradient_clip_val)
                else:
                    torch.nn.utils.clip_grad_value_(ddp.parameters(), settings.gradient_clip_val)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        clock.tick()
        if steps == settings.max_steps:
            break
    return steps, clock


def save_checkpoint(
    config: TrainerConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int
) -> None:
    """Rank 0 writes the final checkpoint, as dtrain's trainer does at its end."""
    if dist.get_rank() == 0:
        directory = Path(config.checkpoint.dir)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": steps},
            directory / "last.ckpt",
        )


def train(config: TrainerConfig) -> None:
    """The run in its steps, in the order a hand-written DDP script takes them."""
    settings = config.trainer
    device, local_rank = init_process_group(config)
    torch.manual_seed(settings.seed)
    model, ddp = wrap_model(config, device, local_rank)
    model_args = config.model.init_args
    optimizer = make_optimizer(model_args.get("optimizer", "adam"), ddp.parameters(), model_args)
    scaler = torch.amp.GradScaler(device.type, enabled=settings.precision == "16-mixed")
    loader, sampler = data_loader(config, device)
    steps, clock = optimize(config, ddp, optimizer, scaler, loader, sampler, device)
    clock.save(settings.batch_size)
    save_checkpoint(config, model, optimizer, steps)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    config = TrainerConfig.model_validate(yaml.safe_load(Path(os.environ[contract.ENV_CONFIG]).read_text()))
    if config.trainer.max_steps < 1:
        raise SystemExit("raw_ddp: the benchmark config must set trainer.maxSteps")
    if config.model.init_args.get("lr_schedule", "constant") != "constant":
        raise SystemExit("raw_ddp: only the constant learning rate is part of the benchmark")
    train(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
