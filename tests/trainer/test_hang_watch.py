"""The hang watch in one process: when rank 0 collects, what a stack holds, and what the summary keeps.
(Every rank of a real gang answering through torchrun's store: tests/local/test_hang_diagnosis.py.)"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api import TrainerConfig, contract
from dtrain_operator.api.stacks import MAX_GROUPS
from dtrain_trainer import hang_watch
from dtrain_trainer.progress import ProgressReporter

from .conftest import ListSink


@pytest.mark.parametrize(
    ("deadline", "interval", "after"),
    [(600, 15, 580), (30, 15, 10), (10, 2, 10 / 3), (0, 15, None)],
)
def test_rank_0_collects_before_the_deadline_can_run_out_but_never_at_a_slow_step(
    deadline: int, interval: float, after: float | None
) -> None:
    assert hang_watch.collect_after_seconds(deadline, interval) == (pytest.approx(after) if after else None)


def _parked_in_a_wait(ready: threading.Event, release: threading.Event) -> None:
    api_token = "s3cr3t-value"  # a local: it must not reach a dump
    ready.set()
    release.wait(30)
    del api_token


def test_every_thread_is_listed_by_name_with_file_line_and_function_and_no_local() -> None:
    ready, release = threading.Event(), threading.Event()
    parked = threading.Thread(target=_parked_in_a_wait, args=(ready, release), name="parked")
    parked.start()
    ready.wait(10)
    try:
        threads = hang_watch.thread_stacks()
    finally:
        release.set()
        parked.join(10)
    assert threads[0]["training"] and threads[0]["name"] == "MainThread"
    mine = next(t for t in threads if t["name"] == "parked")
    functions = [f[1] for f in mine["frames"]]
    assert functions.index("Event.wait") < functions.index("_parked_in_a_wait")  # innermost first
    answer = {"rank": 1, "pod": "job-1", "node": "n1", "time": "t", "threads": threads}
    text = hang_watch.stacks_text(answer)
    assert text.startswith("rank 1 (pod job-1 on node n1):") and "Thread parked, most recent call first:" in text
    assert 'test_hang_watch.py", line' in text and "in _parked_in_a_wait" in text
    assert "s3cr3t" not in text and "s3cr3t" not in json.dumps(answer)


def answer(*frames: tuple[str, str, int], threads: int = 1) -> dict[str, Any]:
    training = [[module, function, f"/site/{module.replace('.', '/')}.py", line] for module, function, line in frames]
    return {"threads": [{"name": "MainThread", "training": True, "frames": training}] + [
        {"name": f"t{i}", "training": False, "frames": []} for i in range(threads - 1)]}


BACKWARD = answer(("torch.autograd.graph", "_engine_run_backward", 9), ("dtrain_trainer.runner", "_fit", 3), threads=2)
SLEEPING = answer(("my_models", "Net.training_step", 52), ("lightning.pytorch.loops", "run", 1))


def test_the_summary_groups_ranks_by_their_training_threads_frames_and_names_the_silent() -> None:
    groups, silent = hang_watch.summarize({0: BACKWARD, 2: BACKWARD, 3: SLEEPING}, world_size=5)
    assert silent == [1, 4]
    assert [g["ranks"] for g in groups] == ["0,2", "3"]
    assert groups[0]["threads"] == 2
    assert groups[0]["frames"][0] == {"module": "torch.autograd.graph", "function": "_engine_run_backward",
                                      "file": "graph.py", "line": 9}
    assert [f["function"] for f in groups[0]["code"]] == ["_fit"]
    assert [f["function"] for f in groups[1]["code"]] == ["Net.training_step"]


def test_the_summary_stays_bounded_however_many_places_and_frames() -> None:
    answers = {rank: answer(*[("my_models", f"f{rank}_{i}", i) for i in range(40)]) for rank in range(MAX_GROUPS + 4)}
    groups, _ = hang_watch.summarize(answers, world_size=len(answers))
    assert len(groups) == MAX_GROUPS and groups[-1]["ranks"] == f"{MAX_GROUPS - 1}-{MAX_GROUPS + 3}"
    assert groups[-1]["frames"] == []
    small = hang_watch.bounded(groups, limit=3000)
    assert len(json.dumps(small)) <= 3000 and all(len(g["frames"]) >= 1 for g in small[:-1])


def test_rank_0_collects_once_per_stall_sends_the_record_and_keeps_the_full_stacks(tmp_path: Path) -> None:
    config = TrainerConfig(job_name="j", accelerator="cpu", artifacts={"dir": str(tmp_path / "art")})
    sink = ListSink()
    state = {"batches": 3, "holding": False}
    watch = hang_watch.HangWatch(
        config, {"RANK": "0", "WORLD_SIZE": "1", contract.ENV_POD_NAME: "j-0"}, ProgressReporter(sink, 0.0),
        lambda: (state["batches"], state["holding"], 6), after=1.0,
    )
    try:
        deadline = time.monotonic() + 20
        while not sink.records and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # still stalled: no second collection
    finally:
        watch.close()
    assert len(sink.records) == 1, sink.records
    record = sink.records[0]
    assert (record["event"], record["step"], record["batches"], record["worldSize"]) == ("hang", 6, 3, 1)
    assert record["silent"] is None and record["groups"][0]["ranks"] == "0"
    assert record["stalledSeconds"] >= 1.0
    directory = Path(record["dumps"])
    assert directory.parent == tmp_path / "art" / "hangs" and directory.name.endswith("-step-6")
    stacks = (directory / "stacks.txt").read_text()
    assert stacks.startswith("rank 0 (pod j-0):") and "(the training thread)" in stacks
    assert "test_rank_0_collects_once_per_stall" in stacks  # where this test's own thread waited
    assert json.loads((directory / "hang.json").read_text())["dumps"] == record["dumps"]


def test_a_checkpoint_write_holds_the_watchs_clock(tmp_path: Path) -> None:
    config = TrainerConfig(job_name="j", accelerator="cpu", artifacts={"dir": str(tmp_path / "art")})
    sink = ListSink()
    watch = hang_watch.HangWatch(
        config, {"RANK": "0", "WORLD_SIZE": "1"}, ProgressReporter(sink, 0.0), lambda: (3, True, 6), after=0.5
    )
    time.sleep(2.0)
    watch.close()
    assert sink.records == []
