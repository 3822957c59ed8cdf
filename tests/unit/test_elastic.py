"""An elastic gang's sizes: the batch each trains with (the global batch kept exactly, no process's batch larger),
when it shrinks and grows, and the specs whose sizes cannot keep the batch."""

from __future__ import annotations

import re

import pytest

from dtrain_operator.api import DistributedTrainingSpec
from dtrain_operator.api.elastic import BatchLayout, layout_at, sizes_that_cannot, wanted_layout
from dtrain_operator.core.elastic import REASON_CAPACITY_BACK, REASON_NODES_LOST, Resize, after_lost_nodes, grown_back
from tests.work_bound import at_most_lines

# A job the spec's limits allow whose sizes the divisor search once took tens of seconds over (in `dtrain validate`
# and in every reconcile): global batch 12 x 87359 x 65521 x 4093, primes but for 12, on up to 4093 nodes.
HUGE_BATCH_SIZE, HUGE_ACCUMULATE, HUGE_NODES = 12 * 87359, 65521, 4093


@pytest.mark.parametrize(
    ("batch_size", "accumulate", "devices", "wanted", "nodes", "expected"),
    [
        # Raising the accumulation is enough: the per-process batch stays.
        (32, 1, 1, 4, 2, BatchLayout(32, 2, 2)),
        (32, 1, 1, 4, 1, BatchLayout(32, 4, 1)),
        (16, 3, 2, 4, 2, BatchLayout(16, 6, 4)),
        # It is not: the per-process batch shrinks to the largest divisor of the process's share that fits.
        (8, 1, 1, 3, 2, BatchLayout(6, 2, 2)),  # 24 samples a step: 12 per process, in 2 of 6
        (10, 1, 1, 3, 2, BatchLayout(5, 3, 2)),  # 30: 15 per process; 15 in 2 cannot be even, 3 of 5 can
        (7, 1, 1, 2, 1, BatchLayout(7, 2, 1)),
        # The wanted size itself: the settings as written.
        (32, 2, 8, 4, 4, BatchLayout(32, 2, 32)),
    ],
)
def test_a_smaller_gang_keeps_the_global_batch_with_no_process_batch_above_batch_size(
    batch_size: int, accumulate: int, devices: int, wanted: int, nodes: int, expected: BatchLayout
) -> None:
    settings = wanted_layout(batch_size, accumulate, devices, wanted)
    layout = layout_at(settings, devices, nodes)
    assert layout == expected
    assert layout.global_batch == settings.global_batch
    assert layout.batch_size <= batch_size


def test_a_size_whose_process_count_does_not_divide_the_global_batch_cannot_keep_it() -> None:
    settings = wanted_layout(batch_size=4, accumulate_grad_batches=1, devices_per_node=1, nodes=4)  # 16 a step
    assert layout_at(settings, 1, 3) is None
    assert sizes_that_cannot(settings, 1, min_nodes=1, nodes=4) == [3]
    assert sizes_that_cannot(wanted_layout(4, 1, 1, 6), 1, min_nodes=2, nodes=6) == [5]
    assert sizes_that_cannot(wanted_layout(4, 1, 2, 4), 2, min_nodes=1, nodes=4) == [3]


def test_every_size_down_to_one_node_keeps_any_global_batch_a_node_count_divides() -> None:
    for batch_size in range(1, 13):
        for accumulate in (1, 2, 3):
            settings = wanted_layout(batch_size, accumulate, 2, 6)
            for nodes in range(1, 7):
                layout = layout_at(settings, 2, nodes)
                if settings.global_batch % (2 * nodes):
                    assert layout is None
                    continue
                assert layout is not None and layout.global_batch == settings.global_batch
                assert layout.batch_size <= batch_size and layout.world_size == 2 * nodes
                # The fewest micro-batches that fit: one fewer would need a batch above batchSize, or split unevenly.
                fewer = layout.accumulate_grad_batches - 1
                share = settings.global_batch // (2 * nodes)
                assert fewer == 0 or share % fewer or share // fewer > batch_size


def fewest_micro_batches_by_search(share: int, batch_size: int) -> int:
    """The rule as first written, one candidate at a time: the fewest micro-batches that split `share` evenly
    into batches of at most `batch_size`."""
    accumulate = -(-share // batch_size)
    while share % accumulate:
        accumulate += 1
    return accumulate


def test_the_layout_is_the_one_the_search_finds() -> None:
    for batch_size in (1, 5, 7, 12, 30, 64):
        for accumulate in (1, 2, 3, 5):
            for devices in (1, 3):
                settings = wanted_layout(batch_size, accumulate, devices, 6)
                for nodes in range(1, 7):
                    layout = layout_at(settings, devices, nodes)
                    share, remainder = divmod(settings.global_batch, devices * nodes)
                    assert (layout is None) == bool(remainder)
                    if layout is not None:
                        assert layout.accumulate_grad_batches == fewest_micro_batches_by_search(share, batch_size)


def test_every_size_of_the_largest_gang_is_decided_in_bounded_work() -> None:
    settings = wanted_layout(HUGE_BATCH_SIZE, HUGE_ACCUMULATE, 1, HUGE_NODES)
    with at_most_lines(200_000):
        cannot = sizes_that_cannot(settings, 1, min_nodes=1, nodes=HUGE_NODES)
        layouts = [layout_at(settings, 1, nodes) for nodes in (1, 2, 3, 4, 6, 12, HUGE_NODES)]
    assert len(cannot) == HUGE_NODES - 7
    assert [layout.global_batch if layout else None for layout in layouts] == [settings.global_batch] * 7
    # On 12 nodes each process trains 87359 x 65521 x 4093 samples a step: of its divisors, 87359 is the
    # largest no larger than batchSize.
    assert layouts[5] == BatchLayout(87359, 65521 * 4093, 12)


def elastic_spec(**elastic: int) -> DistributedTrainingSpec:
    return DistributedTrainingSpec.model_validate({
        "nodes": 3, "accelerator": "cpu", "storage": {"claimName": "shared"}, "trainer": {"batchSize": 8},
        **({"elastic": elastic} if elastic else {}),
    })


def test_lost_nodes_shrink_an_elastic_gang_down_to_min_nodes_and_no_further() -> None:
    spec = elastic_spec(minNodes=2)
    resize = after_lost_nodes(spec, nodes=3, lost=1, why="pod w-2 cannot be placed")
    assert resize == Resize(2, REASON_NODES_LOST, (
        "pod w-2 cannot be placed: training goes on from the last checkpoint on 2 of 3 nodes; batchSize 6 per process "
        "and accumulateGradBatches 2 keep the global batch of 24"
    ))
    assert after_lost_nodes(spec, nodes=3, lost=2, why="") is None  # 1 left, below minNodes
    assert after_lost_nodes(spec, nodes=2, lost=1, why="") is None
    assert after_lost_nodes(elastic_spec(), nodes=3, lost=1, why="") is None  # not elastic: the usual restart


def test_a_smaller_gang_grows_back_to_nodes() -> None:
    spec = elastic_spec(minNodes=1)
    resize = grown_back(spec, nodes=1, why="capacity is back")
    assert resize is not None and (resize.nodes, resize.reason) == (3, REASON_CAPACITY_BACK)
    assert resize.message.endswith("batchSize 8 per process and accumulateGradBatches 1 keep the global batch of 24")
    assert grown_back(spec, nodes=3, why="") is None
    assert grown_back(elastic_spec(), nodes=2, why="") is None


def test_an_elastic_spec_with_gang_scheduling_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape(".scheduling.gang.enabled: elastic cannot be combined")):
        DistributedTrainingSpec.model_validate({
            "nodes": 3, "accelerator": "cpu", "storage": {"claimName": "shared"}, "elastic": {"minNodes": 2},
            "scheduling": {"gang": {"enabled": True, "provider": "kubernetes"}},
        })


@pytest.mark.parametrize(
    ("elastic", "trainer", "message"),
    [
        ({"minNodes": 4}, {}, ".elastic.minNodes: 4 cannot exceed nodes (3)"),
        ({"minNodes": 1}, {"batchSize": 5}, ".elastic.minNodes: on 2 node(s) the global batch of 15"),
        ({"minNodes": 2}, {"limitTrainBatches": 10}, ".trainer.limitTrainBatches: trainer.limitTrainBatches counts"),
        ({"minNodes": 0}, {}, "greater than or equal to 1"),
    ],
)
def test_an_elastic_spec_whose_sizes_cannot_keep_the_batch_is_refused_by_field(
    elastic: dict[str, int], trainer: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DistributedTrainingSpec.model_validate({
            "nodes": 3, "accelerator": "cpu", "storage": {"claimName": "shared"}, "trainer": trainer, "elastic": elastic,
        })


def test_the_refusal_of_the_largest_gang_names_its_first_sizes_and_counts_the_rest() -> None:
    with at_most_lines(200_000), pytest.raises(ValueError) as refused:
        DistributedTrainingSpec.model_validate({
            "nodes": HUGE_NODES, "accelerator": "cpu", "storage": {"claimName": "shared"},
            "trainer": {"batchSize": HUGE_BATCH_SIZE, "accumulateGradBatches": HUGE_ACCUMULATE}, "elastic": {"minNodes": 1},
        })
    message = str(refused.value)
    assert ".elastic.minNodes: on 5, 7, 8, 9, 10 and 4,081 more node(s) the global batch" in message
    assert "raise minNodes above 4092" in message
    assert len(message) < 1000
