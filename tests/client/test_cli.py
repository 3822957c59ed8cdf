"""`dtrain submit/get/watch/logs/delete` as a user runs them: the command as a process, KUBECONFIG set,
against the test API server. The status a running job would have is written by the test."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from dtrain_operator.api import DistributedTraining, crd, memory_estimate
from dtrain_operator.cli.cluster import GET_COLUMNS, age, detail_lines, table
from dtrain_operator.core.status import gpu_memory
from tests.builders import a_cpu_job

from ..operator.cluster import Cluster
from .jobs import cluster_quickstart

NS = "default"
ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = cluster_quickstart()


@dataclass
class Result:
    code: int
    out: str
    err: str


async def dtrain(cluster: Cluster, *args: str, timeout: float = 60) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=str(cluster.kubeconfig), COLUMNS="200")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dtrain_operator.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return Result(process.returncode, out.decode(), err.decode())


async def test_submit_validates_then_creates(cluster: Cluster):
    result = await dtrain(cluster, "submit", str(QUICKSTART))
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == (
        "distributedtraining.dtrain.dev/quickstart created in namespace default: "
        "2 node(s) x 1 cpu process(es), global batch 64"
    )
    created = cluster.job(NS, "quickstart")
    assert created is not None
    # A CPU job has no GPU memory to estimate: nothing is built, nothing recorded.
    assert memory_estimate.ANNOTATION not in (created["metadata"].get("annotations") or {})
    assert "memory" not in result.out + result.err

    again = await dtrain(cluster, "submit", str(QUICKSTART))
    assert again.code == 1 and "already exists in namespace default" in again.err

    bad = cluster.tmp / "bad.yaml"
    bad.write_text(yaml.safe_dump(a_cpu_job("bad").with_spec(nodes=0).as_dict()))
    refused, validated = await asyncio.gather(dtrain(cluster, "submit", str(bad)), dtrain(cluster, "validate", str(bad)))
    assert refused.code == 2
    assert refused.err == "error: " + validated.err  # the lines of `dtrain validate`
    assert cluster.job(NS, "bad") is None

    other = await dtrain(cluster, "submit", str(QUICKSTART), "-n", "team-a", "-o", "json")
    assert other.code == 0, other.err
    assert json.loads(other.out)["metadata"]["namespace"] == "team-a"


async def test_validate_server_and_submit_ask_the_api_server_about_every_child(cluster: Cluster):
    """A pod the API server refuses (a field only it checks): `dtrain validate --server` says so in the
    server's words, `dtrain submit` creates nothing; both send every child as a dry run, so nothing is stored."""
    cluster.refusals.invalid("pods", "spec.volumes[3].emptyDir.sizeLimit", "Invalid value: \"-1Gi\": must be greater than or equal to 0")
    offline = await dtrain(cluster, "validate", str(QUICKSTART))
    assert offline.code == 0, offline.err
    checked = await dtrain(cluster, "validate", "--server", str(QUICKSTART))
    assert checked.code == 2
    assert "the API server refuses the job's Pod quickstart-1 (the worker pod of node 1)" in checked.err
    assert 'Pod "quickstart-1" is invalid: spec.volumes[3].emptyDir.sizeLimit: Invalid value: "-1Gi"' in checked.err
    submitted = await dtrain(cluster, "submit", str(QUICKSTART))
    assert submitted.code == 2 and "the API server refuses the job's Pod quickstart-1" in submitted.err
    assert cluster.job(NS, "quickstart") is None and cluster.pods(NS, "quickstart") == []
    cluster.refusals.clear()
    assert (await dtrain(cluster, "validate", "--server", str(QUICKSTART))).code == 0
    assert cluster.objects("v1/services", NS) == [] and cluster.objects("v1/configmaps", NS) == []


def gpu_quickstart(cluster: Cluster, name: str, gpu_memory: str, batch_size: int) -> Path:
    job = yaml.safe_load(QUICKSTART.read_text())
    job["metadata"]["name"] = name
    job["spec"].update(accelerator="gpu", gpuMemory=gpu_memory)
    job["spec"]["trainer"]["batchSize"] = batch_size
    path = cluster.tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


async def test_submit_records_the_memory_estimate_the_operator_reads(cluster: Cluster):
    # The quick start's ResNet-18 at batch 4096 on a 2 GiB GPU: submitted all the same, with a warning.
    big = await dtrain(cluster, "submit", str(gpu_quickstart(cluster, "big", "2Gi", 4096)), timeout=300)
    assert big.code == 0, big.err
    assert "does NOT fit in 2.00 GiB (usable 972.80 MiB); fits instead: trainer.batchSize: " in big.err
    assert "Submitted as it is (the job gets the GPUMemoryExceeded condition)" in big.err
    stored = cluster.job(NS, "big")
    assert stored is not None
    annotations = stored["metadata"]["annotations"]
    record = memory_estimate.decode(annotations[memory_estimate.ANNOTATION])
    assert (record.fits, record.gpu_memory_bytes) == (False, 2 * 2**30) and record.peak_bytes > 2 * 2**30
    assert record.suggestion and record.suggestion.startswith("trainer.batchSize: ")
    # The object as the API server holds it (defaults filled in) is the spec the estimate is of.
    verdict = gpu_memory.verdict(annotations, DistributedTraining.model_validate(stored).spec)
    assert verdict is not None and (verdict.status, verdict.reason) == ("True", gpu_memory.REASON_EXCEEDS)
    assert record.suggestion in verdict.message

    fits = await dtrain(cluster, "submit", str(gpu_quickstart(cluster, "small", "16Gi", 32)), timeout=300)
    assert fits.code == 0, fits.err
    assert fits.out.splitlines()[1].startswith("memory: estimated peak ") and "fits in 16.00 GiB" in fits.out
    small = cluster.job(NS, "small")
    assert small is not None and memory_estimate.decode(small["metadata"]["annotations"][memory_estimate.ANNOTATION]).fits

    skipped = await dtrain(cluster, "submit", "--no-estimate", str(gpu_quickstart(cluster, "skipped", "16Gi", 32)))
    assert skipped.code == 0 and "memory" not in skipped.out + skipped.err
    unestimated = cluster.job(NS, "skipped")
    assert unestimated is not None and memory_estimate.ANNOTATION not in (unestimated["metadata"].get("annotations") or {})


async def test_get_prints_the_printer_columns_plus_loss_and_eta(cluster: Cluster):
    none = await dtrain(cluster, "get")
    assert none.code == 0 and none.err == "No resources found in default namespace.\n"
    await cluster.apply(a_cpu_job("alpha").as_dict())
    await cluster.apply(a_cpu_job("beta").as_dict())
    # 60 steps left at 128 images a step (batch 32 x 2 nodes x accumulation 2), 256 img/s: 30 s.
    await cluster.patch_job(NS, "beta", {"spec": {"trainer": {"accumulateGradBatches": 2}}})
    await cluster.patch_job_status(NS, "beta", {"phase": "Running", "nodesReady": "2/2", "restarts": 1, "progress": {
        "epoch": 1, "step": 40, "totalSteps": 100, "loss": 0.123456, "imagesPerSecond": 256.0,
        "validation": "val_loss=0.412"}, "goodput": {"ratio": 0.875, "seconds": {"productive": 35.0, "starting": 5.0}}})

    result = await dtrain(cluster, "get")
    assert result.code == 0, result.err
    header, alpha, beta = (line.split() for line in result.out.splitlines())
    assert header == list(GET_COLUMNS)
    # The CRD's printer columns, as `kubectl get dtr` prints them, then LOSS and ETA.
    printer = [c["name"].upper() for c in crd.crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert header == ["NAME", *printer, "LOSS", "ETA"]
    assert header[:9] == ["NAME", "PHASE", "NODES", "EPOCH", "IMG/S", "VAL", "RESTARTS", "GOODPUT", "AGE"]
    assert alpha[:2] == ["alpha", "0"] and alpha[2].endswith("s")  # nothing reported yet: empty, as kubectl
    assert beta[:8] == ["beta", "Running", "2/2", "1", "256", "val_loss=0.412", "1", "88%"]
    assert beta[9:] == ["0.1235", "00:30"]

    # One job: where its latest hang sat (status.lastHang), below its row; a list keeps to the rows.
    where = "Where it hangs: rank 1 (pod beta-1 on node n1) is in its own code at my_models.py:52 in Net.training_step"
    await cluster.patch_job_status(NS, "beta", {"lastHang": {"time": "2026-01-10T00:00:00Z", "step": 40, "ranks": "1",
                                                            "message": where, "dumps": "/ws/hangs/t"}})
    hung = await dtrain(cluster, "get", "beta")
    assert hung.out.splitlines()[1].split()[0] == "beta"
    assert hung.out.splitlines()[2:] == ["", f"Last hang (2026-01-10T00:00:00Z, step 40): {where}"]
    assert "Last hang" not in (await dtrain(cluster, "get")).out
    # And what limits its steps (status.progress.stepBreakdown), above it.
    line = "rank 1: 41 % of its step waits on the data loader; trainer.numWorkers 0"
    await cluster.patch_job_status(NS, "beta", {"progress": {"stepBreakdown": {"step": 50, "bottleneck": line}}})
    limited = await dtrain(cluster, "get", "beta")
    assert limited.out.splitlines()[2:] == ["", f"Bottleneck (step 50): {line}", f"Last hang (2026-01-10T00:00:00Z, step 40): {where}"]

    one = await dtrain(cluster, "get", "beta", "-o", "yaml")
    obj = yaml.safe_load(one.out)
    assert obj["metadata"]["name"] == "beta" and obj["status"]["progress"]["step"] == 40
    assert "checkpoint" not in obj["spec"]  # the stored object, not the defaults
    listed = json.loads((await dtrain(cluster, "get", "-o", "json")).out)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["alpha", "beta"]

    await cluster.apply(a_cpu_job("gamma").in_namespace("team-a").as_dict())
    everywhere = await dtrain(cluster, "get", "-A")
    assert [line.split()[:2] for line in everywhere.out.splitlines()] == [
        ["NAMESPACE", "NAME"], ["default", "alpha"], ["default", "beta"], ["team-a", "gamma"]]
    only = await dtrain(cluster, "get", "-n", "team-a")
    assert [line.split()[0] for line in only.out.splitlines()[1:]] == ["gamma"]
    missing = await dtrain(cluster, "get", "nope")
    assert missing.code == 1 and "DistributedTraining nope not found in namespace default" in missing.err


def test_what_a_job_reported_cannot_drive_the_terminal():
    """A status written from a job's reports (or by anyone who may write it) reaches `dtrain get -A` escaped: no
    escape sequence reaches the administrator's terminal."""
    rows = table([["NAME", "VAL"], ["evil", "val_loss=\x1b]0;owned\x07\x1b[2J0.4"]])
    assert "\x1b" not in rows and "\\x1b]0;owned" in rows
    job = DistributedTraining.model_validate({"metadata": {"name": "evil"}, "spec": {}, "status": {"lastHang": {
        "step": 1, "message": "rank 1\n\x1b[31mforged line"}}})
    assert "\x1b" not in detail_lines(job) and detail_lines(job).count("\n") == 2


def test_age_as_kubectl_prints_it():
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 10, tzinfo=timezone.utc)
    ago = lambda **kw: (now - timedelta(**kw)).isoformat().replace("+00:00", "Z")
    assert [age(ago(seconds=45), now), age(ago(minutes=5, seconds=3), now), age(ago(minutes=42), now),
            age(ago(hours=3, minutes=20), now), age(ago(days=2, hours=4), now)] == ["45s", "5m3s", "42m", "3h20m", "2d4h"]


async def test_watch_draws_progress_from_the_status_and_ends_with_the_summary(cluster: Cluster):
    await cluster.apply(a_cpu_job("watched").as_dict())

    async def run() -> None:
        # Once `dtrain watch` reads the job (its start-up takes a while on a busy machine).
        await cluster.eventually(
            lambda: cluster.api.count_calls(["dtrain-client/"], verb="get", resource="distributedtrainings"),
            "dtrain watch reading the job", timeout=60,
        )
        await cluster.patch_job_status(NS, "watched", {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
        for step in (10, 20):
            await asyncio.sleep(1.0)
            await cluster.patch_job_status(NS, "watched", {"progress": {
                "epoch": 0, "step": step, "totalSteps": 20, "loss": 1.0 / step, "imagesPerSecond": 150.0}})
        await asyncio.sleep(1.0)
        await cluster.patch_job_status(NS, "watched", {
            "phase": "Succeeded", "completionTime": "2026-01-01T00:01:05Z",
            "progress": {"metrics": {"val_acc": 0.975}, "stepBreakdown": {
                "step": 20, "worldSize": 2, "bottleneck": "rank 1: 41 % of its step waits on the data loader",
                "ranks": [{"rank": 1, "dataWait": 0.041, "forward": 0.02, "backward": 0.03, "allReduce": 0.005,
                           "optimizer": 0.004}]}},
            "lastCheckpoint": {"step": 20, "path": "/workspace/checkpoints/last.ckpt"},
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "TrainingSucceeded", "message": "done"}],
            "artifacts": {"onnx": "/workspace/artifacts/model.onnx", "parityError": 1.5e-6, "loss": 0.05,
                          "imagesPerSecond": 151.0}})

    feeder = asyncio.ensure_future(run())
    result = await dtrain(cluster, "watch", "watched", "--interval", "0.1")
    await feeder
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("watched in default: 2 node(s) x 1 cpu process(es)")
    assert "phase Running" in lines
    assert any(line.startswith("epoch 1  step 10/20  loss 0.1  150 img/s") for line in lines)
    assert "phase Succeeded" in lines
    table = result.out[result.out.index("dtrain watch watched"):]
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in table.splitlines() if line.count("│") == 3}
    assert rows["phase"] == "Succeeded"
    assert rows["steps"] == "20" and rows["final loss"] == "0.05" and rows["throughput"] == "151.0 images/s"
    assert rows["val_acc"] == "0.975"
    assert rows["bottleneck"] == "rank 1: 41 % of its step waits on the data loader"  # as dtrain run's summary
    assert "rank 1: data wait 0.041, forward 0.02" in table
    assert rows["wall time"] == "01:05"
    assert rows["checkpoint"] == "/workspace/checkpoints/last.ckpt"
    assert rows["model.onnx"].startswith("/workspace/artifacts/model.onnx  (parity with PyTorch: max relative error 1.50e-06)")
    assert "workdir" not in rows

    await cluster.apply(a_cpu_job("doomed").as_dict())
    await cluster.patch_job_status(NS, "doomed", {"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "worker 1 exited 1"}]})
    failed = await dtrain(cluster, "watch", "doomed")
    assert failed.code == 1
    assert "Failed (BackoffLimitExceeded)" in failed.out and "worker 1 exited 1" in failed.out


async def test_logs_by_rank_follow_and_delete(cluster: Cluster):
    await cluster.start_operator()
    await cluster.apply(a_cpu_job("logged").with_nodes(2).as_dict())
    await cluster.run_all(NS, "logged", 2)
    cluster.api.pod_logs.write(NS, "logged-0", "zero\n")
    cluster.api.pod_logs.write(NS, "logged-1", "one a\none b\n")
    assert (await dtrain(cluster, "logs", "logged")).out == "zero\n"
    assert (await dtrain(cluster, "logs", "logged", "--rank", "1", "--tail", "1")).out == "one b\n"
    no_rank = await dtrain(cluster, "logs", "logged", "--rank", "7")
    assert no_rank.code == 1 and "no worker pod of rank 7" in no_rank.err

    follow = asyncio.ensure_future(dtrain(cluster, "logs", "logged", "-f", "--rank", "1"))
    await asyncio.sleep(1.0)
    cluster.api.pod_logs.write(NS, "logged-1", "one c\n")
    cluster.api.pod_logs.end(NS, "logged-1")
    followed = await follow
    assert followed.code == 0 and followed.out == "one a\none b\none c\n"

    deleted = await dtrain(cluster, "delete", "logged", "--wait")
    assert deleted.code == 0 and deleted.out == 'distributedtraining.dtrain.dev "logged" deleted\n'
    assert cluster.job(NS, "logged") is None
    gone = await dtrain(cluster, "delete", "logged")
    assert gone.code == 1 and "not found" in gone.err
