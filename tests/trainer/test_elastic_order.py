"""An elastic gang's data order, without training: the samples of each step at every size, and a loader's saved
position carried to another size (mid-step, at an epoch's end, with loader workers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dtrain_common.errors import ConfigError
from dtrain_operator.api.elastic import BatchLayout, layout_at, wanted_layout
from dtrain_trainer.elastic_data import ElasticOrder, ElasticResume, GlobalOrderSampler
from dtrain_trainer.resumable import EpochStatefulDataLoader, stateful

# 100 samples, a global batch of 24 (8 per process on 3 nodes): epochs of 4 steps, 4 samples left over.
SAMPLES, WANTED = 100, wanted_layout(batch_size=8, accumulate_grad_batches=1, devices_per_node=1, nodes=3)


def at(nodes: int) -> BatchLayout:
    layout = layout_at(WANTED, 1, nodes)
    assert layout is not None
    return layout


def loaders(nodes: int, num_workers: int = 0) -> list[EpochStatefulDataLoader]:
    """One rank's training loader per node, as `stateful` rebuilds a user's shuffled DataLoader for an elastic gang."""
    dataset = TensorDataset(torch.arange(SAMPLES))
    user_loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=num_workers)
    return [stateful(user_loader, ElasticOrder(at(nodes), rank, seed=7)) for rank in range(nodes)]


def steps(nodes: int, epoch: int = 0) -> list[list[int]]:
    """The samples of each optimizer step of `epoch` on `nodes` nodes, over every rank."""
    layout, per_rank = at(nodes), []
    for loader in loaders(nodes):
        loader.sampler.set_epoch(epoch)
        per_rank.append([batch[0].tolist() for batch in loader])
    accumulate = layout.accumulate_grad_batches
    return [
        sorted(i for rank in per_rank for batch in rank[step * accumulate:(step + 1) * accumulate] for i in batch)
        for step in range(len(per_rank[0]) // accumulate)
    ]


def take(loader: Any, count: int) -> list[int]:
    iterator = iter(loader)
    return [i for _ in range(count) for i in next(iterator)[0].tolist()]


def test_each_step_trains_the_same_samples_at_every_size_and_each_sample_once_an_epoch() -> None:
    assert [at(n) for n in (3, 2, 1)] == [BatchLayout(8, 1, 3), BatchLayout(6, 2, 2), BatchLayout(8, 3, 1)]
    for epoch in (0, 1):
        wanted = steps(3, epoch)
        assert len(wanted) == SAMPLES // 24 and all(len(step) == 24 for step in wanted)
        trained = [i for step in wanted for i in step]
        assert len(set(trained)) == len(trained) == 96  # the 4 left over are not trained, at any size
        assert steps(2, epoch) == steps(1, epoch) == wanted
    assert steps(3, 0) != steps(3, 1)  # each epoch has its own order


@pytest.mark.parametrize(
    ("saved_at", "micro_batches", "resumed_at", "resumed_step"),
    [
        (3, 2, 2, 2),  # two whole steps on 3 nodes, resumed on 2 (twice the accumulation) at step 2
        (2, 3, 3, 1),  # mid-step on 2 nodes (1 1/2 steps): on 3, the interrupted step starts again
        (1, 7, 2, 2),  # 2 1/3 steps on 1 node (three micro-batches a step), resumed on 2 at step 2
    ],
)
def test_a_position_saved_at_one_size_resumes_at_its_step_on_another(
    saved_at: int, micro_batches: int, resumed_at: int, resumed_step: int
) -> None:
    saved = loaders(saved_at)[0]
    take(saved, micro_batches)
    state = saved.state_dict()
    rest = []
    for loader in loaders(resumed_at):
        loader.load_state_dict(state)
        rest.extend(i for batch in loader for i in batch[0].tolist())
    assert sorted(rest) == sorted(i for step in steps(3)[resumed_step:] for i in step)


def test_a_position_resumed_at_the_same_size_continues_mid_step_exactly() -> None:
    saved, fresh = loaders(2)[0], loaders(2)[0]
    take(saved, 3)
    fresh.load_state_dict(saved.state_dict())
    assert [batch[0].tolist() for batch in fresh] == [batch[0].tolist() for batch in loaders(2)[0]][3:]


def test_a_position_at_an_epochs_end_resumes_the_next_epoch_whole_on_another_size() -> None:
    saved = loaders(2)[0]
    take(saved, len(saved))
    resumed = loaders(3)
    for loader in resumed:
        loader.load_state_dict(saved.state_dict())
    assert [loader.sampler.epoch for loader in resumed] == [1, 1, 1]
    assert sorted(i for loader in resumed for batch in loader for i in batch[0].tolist()) == sorted(
        i for step in steps(3, epoch=1) for i in step
    )


def test_a_loader_with_workers_resumes_at_its_step_on_another_size() -> None:
    saved = loaders(3, num_workers=1)[0]
    take(saved, 2)
    rest = []
    for loader in loaders(1, num_workers=1):
        loader.load_state_dict(saved.state_dict())
        rest.extend(i for batch in loader for i in batch[0].tolist())
    assert sorted(rest) == sorted(i for step in steps(3)[2:] for i in step)


def test_a_checkpoint_of_another_global_batch_is_refused_by_name() -> None:
    saved = loaders(3)[0]
    take(saved, 1)
    other = stateful(
        DataLoader(TensorDataset(torch.arange(SAMPLES)), batch_size=8, shuffle=True),
        ElasticOrder(BatchLayout(4, 1, 3), rank=0, seed=7),
    )
    with pytest.raises(ConfigError, match="global batch of 24 and this run's is 12"):
        other.load_state_dict(saved.state_dict())


def test_a_loader_with_its_own_sampler_cannot_be_resharded() -> None:
    dataset = TensorDataset(torch.arange(SAMPLES))
    own = DataLoader(dataset, batch_size=8, sampler=torch.utils.data.WeightedRandomSampler([1.0] * SAMPLES, SAMPLES))
    with pytest.raises(ConfigError, match="WeightedRandomSampler.*shuffle=True or False"):
        stateful(own, ElasticOrder(at(3), rank=0, seed=7))
    assert isinstance(stateful(DataLoader(dataset, batch_size=8), ElasticOrder(at(3), 0, 7)).sampler, GlobalOrderSampler)


def progress(micro_batches: int, total: int, completing: bool = False) -> dict[str, Any]:
    """Lightning's batch_progress after `micro_batches` of the epoch; `completing`: saved in on_train_batch_end,
    the last one processed and not yet completed."""
    def counts(n: int) -> dict[str, int]:
        return {"ready": n, "started": n, "processed": n, "completed": n - completing}
    return {"current": counts(micro_batches), "total": counts(total)}


@pytest.mark.parametrize(
    ("saved", "resumed"),
    [
        # Saved in on_train_batch_end of micro-batch 4, two a step (the end of step 2): on 1 node (three a
        # step), micro-batch 6 ends step 2, saved alike, for Lightning to complete on restore.
        (progress(4, 20, completing=True), progress(6, 22, completing=True)),
        # 5 micro-batches of 2 a step, step 3 under way: on 1 node it starts again, from micro-batch 6.
        (progress(5, 21), progress(6, 22)),
        (progress(5, 21, completing=True), progress(6, 22)),
    ],
)
def test_lightnings_count_of_the_epochs_micro_batches_is_rescaled_to_the_step_it_was_in(
    saved: dict[str, Any], resumed: dict[str, Any]
) -> None:
    checkpoint: dict[str, Any] = {"loops": {"fit_loop": {"epoch_loop.batch_progress": saved}}}
    ElasticResume(at(2)).on_save_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    ElasticResume(at(1)).on_load_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"] == resumed
