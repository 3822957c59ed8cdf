"""`dtrain run` of an elastic job: a node stopped for good (its launcher killed) leaves a smaller gang that
trains on, with the same global batch, from the last checkpoint, and without a restart counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .dtrain_process import DtrainRun, records, tiny_job, torchrun_of_node, wait_for_record, write_job

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 240


def test_an_elastic_job_trains_on_without_a_node_stopped_for_good(tmp_path: Path) -> None:
    job = write_job(tmp_path, tiny_job(
        "tiny-elastic",
        data={"initArgs": {"num_samples": 512}},  # 16 steps of 32 samples (16 on each of 2 nodes)
        elastic={"minNodes": 1},
        runPolicy={"backoffLimit": 0},  # a restart counted would fail the run
        export={"onnx": {"enabled": False}},
        engine={"enabled": False},
    ))
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(job), "--workdir", str(workdir))
    checkpoint = wait_for_record(run, workdir, lambda r: r.get("event") == "checkpoint", timeout=RUN_TIMEOUT)
    # Node 1 is gone as a machine goes: its launcher is killed outright, and nothing starts it again.
    node = torchrun_of_node(run, 1)
    assert node is not None, run.output
    node.kill()
    assert run.wait(RUN_TIMEOUT) == 0, run.output
    assert run.leftovers() == []
    summary = json.loads((workdir / "summary.json").read_text())
    assert (summary["phase"], summary["restarts"], summary["restarts_ignoring_backoff"]) == ("Succeeded", 0, 1)
    assert summary["steps"] == 16
    assert (
        "node(s) 1 stopped for good: training goes on from the last checkpoint on 1 of 2 nodes; batchSize 16 per "
        "process and accumulateGradBatches 2 keep the global batch of 32"
    ) in run.output
    starts = [r for r in records(workdir) if r.get("event") == "start"]
    assert [(r["nodes"], r["worldSize"]) for r in starts] == [(2, 2), (1, 1)]
    assert starts[1]["resumeFrom"] is not None and checkpoint["step"] >= 1
