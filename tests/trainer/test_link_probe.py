"""The straggler link probe on real process groups: two and three processes on gloo, each a rank."""

from __future__ import annotations

import math
import multiprocessing
import queue
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dtrain_trainer.stragglers import link_seconds, probe_links

from ..ports import free_port
from .conftest import RUN_TIMEOUT_SECONDS


def probe_rank(rank: int, world: int, port: int, results: multiprocessing.Queue[tuple[int, float, float]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=RUN_TIMEOUT_SECONDS))
    try:
        for _ in range(2):  # twice: the exchanges of one probe leave nothing behind for the next
            from_left, from_right = probe_links(rank, world, torch.device("cpu"))
        results.put((rank, from_left, from_right))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_a_link_time_from_its_neighbours(world: int) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=probe_rank, args=(rank, world, port, results)) for rank in range(world)]
    for process in processes:
        process.start()
    measured: dict[int, tuple[float, float]] = {}
    try:
        for _ in range(world):
            rank, from_left, from_right = results.get(timeout=RUN_TIMEOUT_SECONDS)
            measured[rank] = (from_left, from_right)
    except queue.Empty:
        pytest.fail(f"the link probe of {world} ranks did not finish (a deadlock?): got {sorted(measured)}")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in processes] == [0] * world
    from_left = [measured[r][0] for r in range(world)]
    from_right = [measured[r][1] for r in range(world)]
    if world == 2:  # one pair: rank 0 fetches from its right, rank 1 from its left
        assert math.isnan(from_left[0]) and math.isnan(from_right[1])
        assert from_right[0] > 0 and from_left[1] > 0
    else:
        assert all(t > 0 for t in from_left + from_right)
    times = link_seconds(from_left, from_right)
    assert len(times) == world and all(t > 0 and math.isfinite(t) for t in times)
