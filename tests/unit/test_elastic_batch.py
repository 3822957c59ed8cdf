"""The batch an elastic gang trains with at each size: the global batch kept exactly, no process's batch larger."""

from __future__ import annotations

import pytest

from dtrain_operator.api.elastic import BatchLayout, layout_at, sizes_that_cannot, wanted_layout


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
