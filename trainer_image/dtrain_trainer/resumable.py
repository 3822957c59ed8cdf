"""Training data that resumes exactly where a mid-epoch checkpoint left it.

Step checkpoints fall mid-epoch by nature, so every gang restart resumes mid-epoch. A plain
DataLoader starts its epoch again: the head of the epoch is trained twice and its tail
never. torchdata's StatefulDataLoader has a state (how far its sampler got, its random
generator, its workers' progress) that Lightning saves in each checkpoint and restores
on resume, and that continues the same order.

`resumable(datamodule)` makes the training loader of any data module stateful: the
built-ins build them themselves, and a user's DataLoader over a map-style
dataset is rebuilt as one with the same settings (Lightning then swaps in its
DistributedSampler, which a StatefulDataLoader fast-forwards on resume). An iterable-style
dataset has no order to skip into; it is left as it is, with a warning.

The order must be a function of the seed and the epoch alone, or the fast-forward lands
elsewhere: torch's RandomSampler is kept, because Lightning swaps it for a
DistributedSampler (seeded, set_epoch'd); StatefulDataLoader's own shuffle=True sampler
draws a random seed and Lightning would wrap, not replace, it. And the epoch must be the
checkpoint's when the fast-forward runs: Lightning creates the restored loader's iterator
(which fast-forwards at once) before it sets its sampler's epoch, so a resume in any epoch
but the first would skip into the first epoch's order. EpochStatefulDataLoader keeps the
sampler's epoch in its state and sets it back first. A checkpoint of an epoch's last step
holds a loader that yielded its whole epoch: resumed as it is, it would give the next epoch
no batch at all (an epoch skipped), so it starts the next epoch whole instead.

And the position must reach the loader at all. Lightning keeps a checkpoint's loader
states aside and gives them to the training loader when it builds it, after the
restore. A model whose configure_optimizers asks `trainer.estimated_stepping_batches`
(a cosine or one-cycle schedule, the built-in model's `lr_schedule: cosine`) makes
Lightning build the loader, and its first iterator, earlier, before the restore; the
build after it is then skipped, and the states kept aside were never given
(Lightning-AI/pytorch-lightning#20550): the resumed epoch started over. `LoaderPosition`
gives them at train start and starts the epoch's iterator again from them.

And the epoch after a restored epoch's end must count as begun. Lightning takes it for the
restarted epoch and never counts it started, so a second restart, from within it, trained it
again from its start (an epoch trained twice when step checkpoints fall at epoch ends):
`EpochAfterRestart` starts it as any other epoch.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import lightning as L
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.sampler import BatchSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader import stateful_dataloader as torchdata_loader
from torchdata.stateful_dataloader.sampler import BatchSampler as StatefulBatchSampler
from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

from dtrain_common.errors import ConfigError
from dtrain_trainer import flavor
from dtrain_trainer.elastic_data import (
    ACCUMULATE,
    LAYOUT_KEY,
    ElasticOrder,
    GlobalOrderSampler,
    check_same_global_batch,
    elastic_resume_class,
    loader_layout,
    rescaled_micro_batches,
)

log = logging.getLogger("dtrain_trainer")
SAMPLER_EPOCH_KEY = "dtrain_sampler_epoch"
START_KEY = "startMicroBatch"


class EpochStatefulDataLoader(StatefulDataLoader):
    """A StatefulDataLoader whose state holds its sampler's epoch too, set back before its order is resumed
    (and, for an elastic gang's GlobalOrderSampler, the layout its position counts in)."""

    def _epoch_sampler(self) -> Any:
        """The sampler with an epoch: the loader's, or its batch sampler's (where Lightning puts its own)."""
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(getattr(sampler, "epoch", None), int) and callable(getattr(sampler, "set_epoch", None)):
                return sampler
        return None

    def state_dict(self) -> dict[str, Any]:
        state = dict(super().state_dict())
        sampler = self._epoch_sampler()
        if sampler is not None:
            state[SAMPLER_EPOCH_KEY] = sampler.epoch
        if isinstance(sampler, GlobalOrderSampler):
            state[LAYOUT_KEY] = {**loader_layout(sampler), START_KEY: sampler.start}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        epoch, sampler = state.pop(SAMPLER_EPOCH_KEY, None), self._epoch_sampler()
        saved_layout = state.pop(LAYOUT_KEY, None)
        elastic = isinstance(sampler, GlobalOrderSampler) and saved_layout is not None
        if elastic:
            check_same_global_batch(saved_layout, sampler.layout)
        position = self._position(state, saved_layout if elastic else None, sampler)
        if state.get(torchdata_loader._ITERATOR_FINISHED) or self._past_the_end(position):
            # A checkpoint of an epoch's last step: its loader had yielded every batch, and not been asked for
            # one more, so torchdata would resume that epoch, exhausted. Lightning counts the epoch as done, and
            # its next one would end at once (an epoch skipped). Nothing to resume: the next epoch starts whole,
            # in its own order (Lightning creates the iterator before it sets the epoch, as on any resume).
            if epoch is not None and sampler is not None:
                sampler.set_epoch(epoch + 1)
            return
        if epoch is not None and sampler is not None:
            sampler.set_epoch(epoch)
        if elastic:
            if saved_layout[ACCUMULATE] != sampler.layout.accumulate_grad_batches:
                # Resized: torchdata's position counts the old micro-batches; a new iterator starts at the step.
                sampler.start = position
                return
            sampler.start = saved_layout[START_KEY]
        super().load_state_dict(state)

    @staticmethod
    def _position(state: dict[str, Any], saved_layout: dict[str, int] | None, sampler: Any) -> int | None:
        """The micro-batches of the epoch the state had yielded, in this loader's layout (None when unknown)."""
        # The state's keys are torchdata's own names for them: a release that renames one fails here, at import,
        # not by resuming an exhausted epoch again.
        workers = torchdata_loader._StatefulMultiProcessingDataLoaderIter
        if workers._SNAPSHOT in state:  # a loader with worker processes
            yielded = state[workers._SNAPSHOT][workers._SNAPSHOT_STEP] + state.get(workers._STEPS_SINCE_SNAPSHOT, 0)
        else:
            yielded = state.get(torchdata_loader._StatefulSingleProcessDataLoaderIter._NUM_YIELDED)
        if not isinstance(yielded, int) or saved_layout is None:
            return yielded if isinstance(yielded, int) else None
        return rescaled_micro_batches(
            saved_layout[START_KEY] + yielded, saved_layout[ACCUMULATE], sampler.layout.accumulate_grad_batches
        )

    def _past_the_end(self, position: int | None) -> bool:
        try:
            return position is not None and position >= len(self)
        except TypeError:  # no length (an iterable-style dataset): no end to know of
            return False


def elastic_sampler(loader: DataLoader[Any], order: ElasticOrder) -> GlobalOrderSampler:
    """The global order for `loader`'s dataset, shuffled when its sampler is a random one."""
    sampler = loader.sampler
    random = isinstance(sampler, (RandomSampler, StatefulRandomSampler))
    if loader.batch_size is None or type(loader.batch_sampler) not in (BatchSampler, StatefulBatchSampler) or not (
        random or isinstance(sampler, SequentialSampler)
    ):
        raise ConfigError(
            f"data: the training loader uses its own sampler or batch sampler ({type(sampler).__name__}, "
            f"{type(loader.batch_sampler).__name__}); an elastic job cuts each epoch into global batches itself, so "
            "give the DataLoader a batch_size and shuffle=True or False, without sampler or batch_sampler"
        )
    return GlobalOrderSampler(loader.dataset, order, shuffle=random)


def stateful(loader: Any, order: ElasticOrder | None = None) -> Any:
    """`loader` as a StatefulDataLoader with the same settings, when that is possible; else `loader`.

    With `order` (an elastic gang), its order is the global one: the loader is rebuilt on a
    GlobalOrderSampler with this size's per-process batch."""
    if not isinstance(loader, DataLoader) or (order is None and isinstance(loader, StatefulDataLoader)):
        return loader
    if isinstance(loader.dataset, IterableDataset):
        if order is not None:
            raise ConfigError(
                f"data: the training data is an iterable-style dataset ({type(loader.dataset).__name__}), which an "
                "elastic job cannot re-shard over a new gang size; use a map-style dataset (with __getitem__ and __len__)"
            )
        log.warning(
            "the training data is an iterable-style dataset (%s): a restart resumes its epoch from the start; "
            "give it state_dict/load_state_dict, or use a map-style dataset, for an exact resume",
            type(loader.dataset).__name__,
        )
        return loader
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    batch_sampler = loader.batch_sampler
    if order is not None:
        kwargs.update(batch_size=order.layout.batch_size, drop_last=True, sampler=elastic_sampler(loader, order))
    elif loader.batch_size is not None and type(batch_sampler) is BatchSampler:
        sampler = loader.sampler
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        if type(sampler) is not SequentialSampler:
            # torch's RandomSampler stays: Lightning swaps it for a DistributedSampler, whose order is a
            # function of the seed and the epoch, so that the fast-forward on resume lands on the same batch.
            # (StatefulDataLoader's own shuffle=True sampler would be wrapped instead, and reshuffled.)
            kwargs["sampler"] = sampler
    else:
        kwargs["batch_sampler"] = batch_sampler
    return EpochStatefulDataLoader(loader.dataset, **kwargs)


def resumable(datamodule: Any, order: ElasticOrder | None = None) -> Any:
    """`datamodule`, its train_dataloader() returning stateful loaders (in place; returns it); with `order`,
    in an elastic gang's global order."""
    original = datamodule.train_dataloader

    @functools.wraps(original)
    def train_dataloader() -> Any:
        loaders = original()
        if isinstance(loaders, dict):
            return {name: stateful(loader, order) for name, loader in loaders.items()}
        if isinstance(loaders, (list, tuple)):
            return type(loaders)(stateful(loader, order) for loader in loaders)
        return stateful(loaders, order)

    datamodule.train_dataloader = train_dataloader
    return datamodule


class _LoaderPositionBehaviour:
    """Give the training loader the position a checkpoint saved, when Lightning built the loader before its restore.

    Train start is the first hook after the restore and before the first batch. The
    iterator started again is created as Lightning's own resume creates it (states loaded,
    then `iter`), with the random-number generators left as they were: creating an iterator
    draws its workers' base seed from torch's generator, and the first iterator drew it
    already; a second draw would shift every random draw of the run after it (dropout).
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_loop = trainer.fit_loop
        # Only left when the build after the restore was skipped: Lightning's own load clears them.
        if not fit_loop._combined_loader_states_to_load or fit_loop._data_fetcher is None:
            return
        fit_loop._load_combined_loader_states()
        with isolate_rng():
            iter(fit_loop._data_fetcher)


class LoaderPosition(_LoaderPositionBehaviour, L.Callback):
    __doc__ = _LoaderPositionBehaviour.__doc__


def loader_position_class(package: str) -> type:
    """LoaderPosition on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _LoaderPositionBehaviour, LoaderPosition)


class _EpochAfterRestartBehaviour:
    """Start the epoch after a restored epoch-end checkpoint as Lightning starts any epoch.

    A checkpoint of an epoch's last step saved in on_train_batch_end (a step checkpoint at an
    epoch's end) is restored by Lightning as a restart mid-epoch whose epoch is over: its reset
    counts that epoch processed and completed, and the loader starts the next one whole. But the
    restart's stage is kept through the next epoch, which Lightning then neither counts as ready
    and started nor opens with on_train_epoch_start. A checkpoint saved in that epoch holds an
    epoch count saying it never started; restored, Lightning reads that epoch as over and trains
    it again from its start (two epoch-end restarts in a row: an epoch trained twice). The stage
    is cleared at train start, after the reset that closed the saved epoch and before the next
    epoch starts.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_loop = trainer.fit_loop
        epoch_loop = fit_loop.epoch_loop
        # Exactly where the fit loop's reset closed the saved epoch.
        if (
            fit_loop.restarted_mid_epoch
            and epoch_loop.restarted_on_train_batch_end
            and epoch_loop.batch_progress.is_last_batch
        ):
            fit_loop.reset_restart_stage()


class EpochAfterRestart(_EpochAfterRestartBehaviour, L.Callback):
    __doc__ = _EpochAfterRestartBehaviour.__doc__


def epoch_after_restart_class(package: str) -> type:
    """EpochAfterRestart on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _EpochAfterRestartBehaviour, EpochAfterRestart)


def exact_resume_callbacks(package: str, order: ElasticOrder | None = None) -> list[Any]:
    """What a resume restores beyond Lightning's own: the loader's position and the epoch after an epoch-end
    checkpoint in every case, and an elastic gang's micro-batch count at this size's layout."""
    elastic = [elastic_resume_class(package)(order.layout)] if order is not None else []
    return [loader_position_class(package)(), epoch_after_restart_class(package)(), *elastic]
