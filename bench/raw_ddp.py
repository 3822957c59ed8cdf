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


def train(config: TrainerConfig) -> None:
    settings = config.trainer
    model_args = config.model.init_args
    data_args = config.data.init_args
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
    torch.manual_seed(settings.seed)

    model = torchvision.models.get_model(model_args["arch"], weights=None, num_classes=model_args["num_classes"])
    model = model.to(device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[local_rank] if device.type == "cuda" else None,
        find_unused_parameters=settings.find_unused_parameters,
        # As dtrain's DDPStrategy: gradients live in the all-reduce buckets, saving a copy.
        gradient_as_bucket_view=True,
    )
    optimizer = make_optimizer(model_args.get("optimizer", "adam"), ddp.parameters(), model_args)
    scaler = torch.amp.GradScaler(device.type, enabled=settings.precision == "16-mixed")

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

    label_smoothing = model_args.get("label_smoothing", 0.0)
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

    clock.save(settings.batch_size)
    if dist.get_rank() == 0:
        directory = Path(config.checkpoint.dir)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": steps},
            directory / "last.ckpt",
        )
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
