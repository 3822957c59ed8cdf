"""An elastic gang's data order: each optimizer step trains the next global batch of the epoch, at any gang size.

A fixed gang shards each epoch by rank (Lightning's DistributedSampler): which samples a step
trains depends on the world size, and a loader's saved position counts its own rank's batches.
Neither survives a resize. Here the epoch is one order of every sample (a permutation of the
seed and the epoch, as DistributedSampler draws it) cut into global batches; optimizer step `s`
trains positions [s x G, (s + 1) x G) of it, whatever the size, and each of its micro-batches
is a slice of that, rank by rank. So every step sees the same samples as at the wanted size (the
same gradient, but for the order of its sums and for per-micro-batch statistics such as batch
norm's), and a resize carries on from the step it stopped at: within an epoch no sample is seen
twice and none is skipped. The epoch's last N mod G samples of the order (fewer than one global
batch) are not trained, at any size, as a drop_last loader drops them; the next epoch's order
differs.

A resumed position is a count of optimizer steps: the loader's own position (`resumable`) and
Lightning's micro-batch counters (`ElasticResume`) are both rescaled from the accumulation the
checkpoint was saved with to the one the gang runs with now. A checkpoint saved between the
micro-batches of a step resumes at that step's start on another size (the gradients
accumulated so far were never saved), and exactly where it stopped on the same size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DistributedSampler

from dtrain_common.errors import ConfigError
from dtrain_operator.api import TrainerConfig
from dtrain_operator.api.elastic import BatchLayout, layout_at, wanted_layout
from dtrain_operator.api.spec import ELASTIC_LIMIT_MESSAGE
from dtrain_trainer import flavor
from dtrain_trainer.config import Topology, global_rank, launch_topology

# Where a checkpoint, and a training loader's state in it, keep the layout they were saved with.
LAYOUT_KEY = "dtrain_batch_layout"
GLOBAL_BATCH = "globalBatch"
ACCUMULATE = "accumulateGradBatches"


@dataclass(frozen=True)
class ElasticOrder:
    """What an elastic gang's training loader needs: the layout at this size, this process's rank, the seed."""

    layout: BatchLayout
    rank: int
    seed: int


def at_gang_size(config: TrainerConfig, topology: Topology) -> TrainerConfig:
    """`config` with the batch settings an elastic job trains with at this gang size (a fixed gang's as it is)."""
    if config.elastic_nodes is None:
        return config
    layout = batch_layout(config, topology.nodes, topology.devices_per_node)
    trainer = config.trainer.model_copy(
        update={"batch_size": layout.batch_size, "accumulate_grad_batches": layout.accumulate_grad_batches}
    )
    return config.model_copy(update={"trainer": trainer})


def elastic_order(config: TrainerConfig, env: Mapping[str, str]) -> ElasticOrder | None:
    """An elastic job's order for this process, from its settings at this gang size (`at_gang_size`)."""
    if config.elastic_nodes is None:
        return None
    settings = config.trainer
    layout = BatchLayout(settings.batch_size, settings.accumulate_grad_batches, launch_topology(env).world_size)
    return ElasticOrder(layout, global_rank(env), settings.seed)


def batch_layout(config: TrainerConfig, nodes: int, devices_per_node: int) -> BatchLayout:
    """The layout an elastic job trains with on `nodes` nodes, or a ConfigError naming why it cannot."""
    assert config.elastic_nodes is not None
    settings = config.trainer
    if settings.limit_train_batches is not None:
        raise ConfigError(ELASTIC_LIMIT_MESSAGE)
    wanted = wanted_layout(settings.batch_size, settings.accumulate_grad_batches, devices_per_node, config.elastic_nodes)
    layout = layout_at(wanted, devices_per_node, nodes)
    if layout is None:
        raise ConfigError(
            f"the gang has {nodes} node(s) of {devices_per_node} process(es), which cannot share the global batch of "
            f"{wanted.global_batch} (trainer.batchSize x devicesPerNode x nodes x accumulateGradBatches) evenly; "
            "choose a batch that every allowed size divides, or raise elastic.minNodes"
        )
    return layout


def rescaled_micro_batches(micro_batches: int, saved_accumulate: int, accumulate: int) -> int:
    """A position of `micro_batches` in an epoch saved with `saved_accumulate`, in micro-batches of `accumulate`.

    The same accumulation keeps it exactly; another one resumes at the start of the step it was in."""
    if saved_accumulate == accumulate:
        return micro_batches
    return micro_batches // saved_accumulate * accumulate


class GlobalOrderSampler(DistributedSampler[int]):
    """This rank's samples of each step's global batch, in micro-batches of `layout.batch_size` (see the module).

    A DistributedSampler, so that Lightning keeps it (it swaps any other training sampler for its
    own), with its epoch set by Lightning as that one's; `start` is the micro-batch of the epoch
    that iteration starts from (a resumed position), back to 0 for each new epoch.
    """

    def __init__(self, dataset: Any, order: ElasticOrder, shuffle: bool) -> None:
        super().__init__(
            dataset, num_replicas=order.layout.world_size, rank=order.rank, shuffle=shuffle, seed=order.seed,
            drop_last=True,
        )
        self.layout = order.layout
        self.start = 0

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.layout.global_batch  # type: ignore[arg-type]

    @property
    def micro_batches_per_epoch(self) -> int:
        return self.steps_per_epoch * self.layout.accumulate_grad_batches

    def __len__(self) -> int:
        return self.micro_batches_per_epoch * self.layout.batch_size

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        layout, count = self.layout, len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(count)
        for micro_batch in range(self.start, self.micro_batches_per_epoch):
            step, within = divmod(micro_batch, layout.accumulate_grad_batches)
            first = step * layout.global_batch + within * layout.micro_batch + self.rank * layout.batch_size
            yield from order[first:first + layout.batch_size].tolist()


def loader_layout(sampler: GlobalOrderSampler) -> dict[str, int]:
    """What a loader's saved state records of its layout, to be rescaled on another size."""
    return {GLOBAL_BATCH: sampler.layout.global_batch, ACCUMULATE: sampler.layout.accumulate_grad_batches}


def check_same_global_batch(saved: Mapping[str, Any], layout: BatchLayout) -> None:
    if saved.get(GLOBAL_BATCH, layout.global_batch) != layout.global_batch:
        raise ConfigError(
            f"the checkpoint was trained with a global batch of {saved[GLOBAL_BATCH]} and this run's is "
            f"{layout.global_batch}: an elastic job keeps its global batch; restore trainer.batchSize, "
            "accumulateGradBatches and nodes, or start from a new checkpoint.dir"
        )


PROGRESS_STAGES = ("ready", "started", "processed", "completed")


def rescale_batch_progress(progress: dict[str, Any], saved_accumulate: int, accumulate: int) -> None:
    """Lightning's count of the epoch's micro-batches (its saved `batch_progress`), in micro-batches of `accumulate`.

    The count decides where Lightning's accumulation ends a step, where validation runs and where the
    epoch ends. A checkpoint is saved with the micro-batch under way processed and not yet completed (in
    on_train_batch_end), which Lightning completes on restore: at a step's end the counts move together
    and keep that; within a step, the step starts again (rescaled_micro_batches), every count at its start.
    """
    current, total = progress["current"], progress["total"]
    processed = current["processed"]
    position = rescaled_micro_batches(processed, saved_accumulate, accumulate)
    at_step_end = processed % saved_accumulate == 0
    for stage in PROGRESS_STAGES:
        moved = current[stage] + position - processed if at_step_end else position
        total[stage] += moved - current[stage]
        current[stage] = moved


class _ElasticResumeBehaviour:
    """Lightning's count of the epoch's micro-batches, saved with the layout and rescaled to this size's on resume
    (rescale_batch_progress), in the checkpoint before Lightning restores its loops (callbacks load first)."""

    def __init__(self, layout: BatchLayout) -> None:
        self.layout = layout

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[LAYOUT_KEY] = {
            GLOBAL_BATCH: self.layout.global_batch, ACCUMULATE: self.layout.accumulate_grad_batches,
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(LAYOUT_KEY)
        if saved is None:  # a fixed gang's checkpoint: its counts are of this layout's settings
            return
        check_same_global_batch(saved, self.layout)
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        if progress is None or saved[ACCUMULATE] == self.layout.accumulate_grad_batches:
            return
        rescale_batch_progress(progress, saved[ACCUMULATE], self.layout.accumulate_grad_batches)


class ElasticResume(_ElasticResumeBehaviour, L.Callback):
    __doc__ = _ElasticResumeBehaviour.__doc__


def elastic_resume_class(package: str) -> type:
    """ElasticResume on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _ElasticResumeBehaviour, ElasticResume)
