"""The e2e scenarios: each applies a job through the operator, acts on the real processes, and
asserts the objects, the status and the files produced. Figures are collected as they are measured."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from dtrain_operator.api import contract

from . import network
from .bench import RELEASE_NAMESPACE, Bench
from .kubelet import NODE_NAME, PODS

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
SMALL_JOB = Path(__file__).parents[1] / "cluster" / "small-job.yaml"
NS = RELEASE_NAMESPACE
# Override of the quick start's length, for slower machines: only spec.trainer.maxSteps changes.
QUICKSTART_STEPS_VARIABLE = "E2E_QUICKSTART_MAX_STEPS"
TRAINING_TIMEOUT = 600.0


class Figures(dict):
    def add(self, key: str, value: Any) -> None:
        self.setdefault(key, []).append(value)


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def claim_name(job: dict[str, Any]) -> str:
    return f"{job['metadata']['name']}-shared"


def with_shared_storage(job: dict[str, Any]) -> dict[str, Any]:
    """spec.storage, as the quick start's own comment says to add on a cluster: checkpoints and
    model.onnx must outlive a pod and reach the engine Job. Added only when the file has none; one
    claim per job, as the trainer resumes from any last.ckpt it finds in checkpoint.dir."""
    job = copy.deepcopy(job)
    job["metadata"].setdefault("namespace", NS)
    job["spec"].setdefault("storage", {"claimName": claim_name(job)})
    return job


def small_job(name: str, **spec: Any) -> dict[str, Any]:
    job = with_shared_storage(load(SMALL_JOB))
    job["metadata"]["name"] = name
    for key, value in spec.items():
        job["spec"][key] = value
    job["spec"]["storage"] = {"claimName": claim_name(job)}
    return job


def status(bench: Bench, name: str, namespace: str = NS) -> dict[str, Any]:
    return bench.cluster.status(namespace, name)


def progress_step(bench: Bench, name: str) -> int:
    return int((status(bench, name).get("progress") or {}).get("step") or 0)


def checkpoint_step(bench: Bench, name: str) -> int:
    return int((status(bench, name).get("lastCheckpoint") or {}).get("step") or 0)


async def until(check: Callable[[], Any], what: str, bench: Bench, timeout: float = TRAINING_TIMEOUT) -> Any:
    return await bench.cluster.eventually(check, what, timeout=timeout)


def pod_log(bench: Bench, name: str) -> str:
    """The container log of the newest incarnation of a pod (kubectl logs)."""
    folders = sorted((bench.kubelet.folder / "pods").glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    folders = [f for f in folders if re.fullmatch(re.escape(name) + r"-[0-9a-f]{8}", f.name)]
    return (folders[-1] / "container.log").read_text(errors="replace") if folders else ""


def worker_process(bench: Bench, pod_name: str) -> int:
    """The host PID of the training process (torchrun's worker) of a pod."""
    running = bench.kubelet.running(NS, pod_name)
    assert running is not None and running.container_pid is not None, f"{pod_name} is not running"
    children = Path(f"/proc/{running.container_pid}/task/{running.container_pid}/children").read_text().split()
    assert children, f"{pod_name}: torchrun has no worker process"
    return int(children[0])


async def finish(bench: Bench, name: str, timeout: float = TRAINING_TIMEOUT) -> dict[str, Any]:
    final = await until(lambda: status(bench, name).get("phase") in ("Succeeded", "Failed") and status(bench, name),
                        f"{name} finished", bench, timeout)
    assert final["phase"] == "Succeeded", f"{name} ended {final['phase']}: {json.dumps(final, indent=1)}"
    return final


# --- The quick start ----------------------------------------------------------------------------


def quickstart_file(folder: Path) -> Path:
    """examples/quickstart.yaml, plus spec.storage, and maxSteps only when E2E_QUICKSTART_MAX_STEPS says so."""
    job = with_shared_storage(load(QUICKSTART))
    steps = os.environ.get(QUICKSTART_STEPS_VARIABLE)
    if steps:
        job["spec"]["trainer"]["maxSteps"] = int(steps)
    path = folder / "quickstart.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


async def run_job(bench: Bench, job: dict[str, Any], figures: Figures | None = None) -> dict[str, Any]:
    """Apply a job, follow it to its end, and take the figures of a run that nothing disturbs."""
    name, nodes = job["metadata"]["name"], job["spec"].get("nodes", 1)
    start = time.monotonic()
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: bench.all_running(NS, name, nodes), f"{name}: all {nodes} pods Running", bench)
        running = time.monotonic()
        await until(lambda: progress_step(bench, name) >= 1, f"{name}: the first training step", bench)
        first_step = time.monotonic()
        final = await until(lambda: status(bench, name).get("phase") in ("Succeeded", "Failed") and status(bench, name),
                            f"{name} finished", bench)
        end = time.monotonic()
    if figures is not None:
        figures.add("create → all pods Running (s)", running - start)
        figures.add("create → first training step (s)", first_step - start)
    return {"status": final, "wall": end - start}


async def scenario_quickstart(bench: Bench, figures: Figures) -> None:
    path = quickstart_file(bench.folder)
    job = load(path)
    name = job["metadata"]["name"]
    result = await run_job(bench, job, figures)
    final = result["status"]
    assert final["phase"] == "Succeeded", json.dumps(final, indent=1)
    # rank 0 patched progress with the trainer's own service account (the chart's RBAC allowed it)
    assert bench.trainer_patches(NS, name) >= 1, "no status patch by the trainer's service account"
    assert not [d for d in bench.authz.denied if d[0] == bench.trainer_user], bench.authz.denied
    rows = [row for _, row in bench.printers[name]]
    assert any(row[1] == "Running" and row[3] and row[4] for row in rows), f"no EPOCH and IMG/S while Running: {rows}"
    storage = bench.kubelet.claim_folder(NS, job["spec"]["storage"]["claimName"])
    onnx = storage / "artifacts" / contract.ONNX_FILE_NAME
    report = storage / "artifacts" / contract.ENGINE_REPORT_FILE_NAME
    assert onnx.is_file() and onnx.stat().st_size > 0, f"no {onnx}"
    assert report.is_file(), f"no {report}"
    artifacts = json.dumps(final.get("artifacts") or {})
    assert contract.ONNX_FILE_NAME in artifacts and contract.ENGINE_REPORT_FILE_NAME in artifacts, artifacts
    engine_report = json.loads(report.read_text())
    assert engine_report.get("engine") is None, "this machine has no TensorRT: the fallback writes no engine"
    figures["quick start through the operator (s)"] = [result["wall"]]
    # The same file through `dtrain run`, measured in the same run.
    workdir = bench.folder / "dtrain-run"
    start = time.monotonic()
    # Not subprocess.run: the API server, the kubelet and the printer share this event loop.
    local = await asyncio.create_subprocess_exec(
        str(bench.env_bin / "dtrain"), "run", str(path), "--workdir", str(workdir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(local.communicate(), TRAINING_TIMEOUT)
    local_wall = time.monotonic() - start
    assert local.returncode == 0, f"dtrain run failed ({local.returncode}):\n{output.decode(errors='replace')[-3000:]}"
    figures["quick start with dtrain run (s)"] = [local_wall]


# --- Failures -----------------------------------------------------------------------------------


async def scenario_worker_killed(bench: Bench, figures: Figures) -> None:
    name = "e2e-kill"
    job = small_job(name)
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        # Killed as soon as rank 0 reports step 18 (an epoch's end), two steps after the checkpoint at 16:
        # the step reached is known, and a restart must cost those two steps and no more.
        await until(lambda: progress_step(bench, name) >= 18, f"{name}: step 18 reported", bench)
        kept = checkpoint_step(bench, name)
        reached = progress_step(bench, name)
        pid = worker_process(bench, f"{name}-1")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        await until(lambda: status(bench, name).get("restarts") == 1, f"{name}: a gang restart", bench, 120)
        kept = max(kept, checkpoint_step(bench, name))  # a checkpoint the killed gang wrote as the kill came
        old_updated = (status(bench, name).get("progress") or {}).get("updatedAt")
        await until(lambda: bench.all_running(NS, name, 2, generation=1), f"{name}: the new gang Running", bench, 120)
        await until(lambda: pod_log(bench, f"{name}-0").count("resumed from") >= 1
                    and (status(bench, name).get("progress") or {}).get("updatedAt") != old_updated,
                    f"{name}: training again after the restart", bench, 180)
        again = time.monotonic()
        resumed = int(re.search(r"resumed from \S+ at step (\d+)", pod_log(bench, f"{name}-0")).group(1))
        first_after = progress_step(bench, name)
        assert resumed == kept, f"resumed at step {resumed}, the last checkpoint was at step {kept}"
        assert first_after >= resumed, f"progress after the restart is at step {first_after} < {resumed}"
        final = await finish(bench, name)
    assert final["restarts"] == 1, final
    figures.add("worker killed → training again (s)", again - killed)
    figures.add("steps lost per restart", reached - resumed)


async def scenario_network_cut(bench: Bench, figures: Figures) -> None:
    name = "e2e-netcut"
    job = small_job(name)
    timeout = job["spec"]["nccl"]["timeoutSeconds"]
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: checkpoint_step(bench, name) >= 8, f"{name}: a checkpoint at step 8 or later", bench)
        victim = bench.kubelet.running(NS, f"{name}-1")
        victim.net.link(False)
        cut = time.monotonic()
        await until(lambda: status(bench, name).get("restarts") == 1, f"{name}: a gang restart after the cut",
                    bench, timeout + 60)
        await until(lambda: bench.all_running(NS, name, 2, generation=1), f"{name}: the new gang Running", bench, 60)
        restarted = time.monotonic()
        final = await finish(bench, name)
    elapsed = restarted - cut
    # The gang must not hang: a collective times out after timeoutSeconds, then the pod fails and
    # the operator replaces the gang; the kubelet's SIGTERM-to-exit and the pod start come on top.
    assert elapsed <= timeout + 45, f"the gang took {elapsed:.0f} s to restart after the cut (timeout {timeout} s)"
    assert final["restarts"] == 1, final
    figures.add("network cut → gang restarted (s)", elapsed)


async def scenario_hang(bench: Bench, figures: Figures) -> None:
    """A link cut with a long collective timeout: the progress deadline restarts the gang, not the timeout."""
    name = "e2e-hang"
    deadline = 30
    job = small_job(name)
    job["spec"]["nccl"]["timeoutSeconds"] = 600
    job["spec"]["runPolicy"]["progressDeadlineSeconds"] = deadline
    timeout = job["spec"]["nccl"]["timeoutSeconds"]
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: checkpoint_step(bench, name) >= 8, f"{name}: a checkpoint at step 8 or later", bench)
        preflight = status(bench, name).get("preflight") or {}
        bench.kubelet.running(NS, f"{name}-1").net.link(False)
        cut = time.monotonic()
        await until(lambda: status(bench, name).get("restarts") == 1, f"{name}: a gang restart after the hang",
                    bench, timeout / 4)
        decided = time.monotonic()
        restarting = bench.cluster.condition(NS, name, "Restarting") or {}
        await until(lambda: bench.all_running(NS, name, 2, generation=1), f"{name}: the new gang Running", bench, 60)
        restarted = time.monotonic()
        final = await finish(bench, name)
    assert restarting.get("reason") == "ProgressDeadlineExceeded", restarting
    assert restarted - cut < timeout / 4, f"{restarted - cut:.0f} s from the hang to the new gang"
    assert final["restarts"] == 1, final
    figures.add(f"hang (link cut) → restart decided (s), collective timeout {timeout} s", decided - cut)
    figures.add("hang (link cut) → new gang running (s)", restarted - cut)
    if preflight.get("seconds") is not None:
        figures.add("pre-flight per gang start (s)", float(preflight["seconds"]))


async def scenario_straggler(bench: Bench, figures: Figures) -> None:
    """One pod's link slowed (tc tbf on its eth0): the Straggler condition and Warning Event name that pod."""
    name = "e2e-slow"
    nodes, slowed_rank, rate_mbit = 3, 1, 1000
    # Three ranks: a rank's link time is its two ring neighbours' fetches from it, so a slow one stands
    # out from its neighbours (of two ranks, a link slow both ways cannot be told from its peer's).
    job = small_job(name, nodes=nodes, stragglers={"everyNSteps": 2, "factor": 1.5, "window": 3})
    slowed = f"{name}-{slowed_rank}"
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        # Four comparisons of healthy links first: none may name a straggler.
        await until(lambda: progress_step(bench, name) >= 8, f"{name}: training", bench)
        before = (status(bench, name).get("progress") or {}).get("stepTimes")
        early = [e["message"] for e in bench.cluster.events(NS, name) if e["reason"] == "Straggler"]
        assert not early, f"a straggler named before any link was slowed: {early}; stepTimes {before}"
        bench.kubelet.running(NS, slowed).net.throttle(rate_mbit)
        applied = time.monotonic()
        reports: list[Any] = []

        def straggler_event() -> dict[str, Any] | None:
            times = (status(bench, name).get("progress") or {}).get("stepTimes")
            if times and times != (reports[-1] if reports else None):  # each comparison rank 0 reports, in the log
                reports.append(times)
                print(f"stepTimes: {json.dumps(times)}", flush=True)
            return next((e for e in bench.cluster.events(NS, name) if e["reason"] == "Straggler"), None)

        event = await until(straggler_event, f"{name}: a Straggler Warning Event", bench, 120)
        detected = time.monotonic()
        condition = bench.cluster.condition(NS, name, "Straggler") or {}
        await bench.cluster.delete(f"/apis/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}/{name}")
        await until(lambda: not bench.kubelet.processes(NS, f"{name}-"), f"{name}: every pod process stopped", bench, 60)
    others = [f"{name}-{rank}" for rank in range(nodes) if rank != slowed_rank]
    assert event["type"] == "Warning", event
    assert f"(pod {slowed} on node {NODE_NAME})" in event["message"], event["message"]
    assert not any(other in event["message"] for other in others), event["message"]
    assert condition.get("status") == "True" and f"pod {slowed} " in condition.get("message", ""), condition
    assert "its link time" in event["message"], event["message"]
    figures.add(f"link slowed (to {rate_mbit} Mbit/s) → straggler Event (s)", detected - applied)


async def scenario_wrong_interface(bench: Bench, figures: Figures) -> None:
    """nccl.socketIfname names an interface the pods lack: the job fails in pre-flight, not in a hang."""
    name = "e2e-iface"
    job = small_job(name)
    job["spec"]["nccl"]["socketIfname"] = "ens9f7"
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: bench.all_running(NS, name, 2, generation=0), f"{name}: the gang Running", bench, 120)
        running = time.monotonic()
        final = await until(lambda: status(bench, name).get("phase") in ("Succeeded", "Failed") and status(bench, name),
                            f"{name} finished", bench, 120)
        failed = time.monotonic()
    condition = next(c for c in final["conditions"] if c["type"] == "Failed")
    assert final["phase"] == "Failed" and condition["reason"] == "InvalidTrainerConfig", final
    assert "NCCL_SOCKET_IFNAME=ens9f7" in condition["message"] and "rank " in condition["message"], condition
    assert final["restarts"] == 0, final
    assert failed - running < 60, f"{failed - running:.0f} s from Running to Failed"
    figures.add("wrong interface → job failed, from Running (s)", failed - running)


async def scenario_operator_killed(bench: Bench, figures: Figures) -> None:
    name = "e2e-opkill"
    job = small_job(name)
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: progress_step(bench, name) >= 4, f"{name}: training", bench)
        bench.operator.kill()
        await asyncio.sleep(2.0)
        step_while_down = progress_step(bench, name)
        await bench.start_operator()
        final = await finish(bench, name)
    assert final["restarts"] == 0, f"a restart after the operator's restart: {final}"
    for rank in range(2):
        creations = bench.cluster.pod_creations(NS, f"{name}-{rank}")
        assert creations == 1, f"{name}-{rank} was created {creations} times"
    # No pod beyond the gang's two was ever made (whatever cleanPodPolicy deleted at the end).
    made = {key[2] for key in bench.api.objects if key[0] == PODS and key[1] == NS and key[2].startswith(f"{name}-")}
    assert made == {f"{name}-0", f"{name}-1"}, f"pods made: {sorted(made)}"
    assert (final.get("progress") or {}).get("step", 0) > step_while_down


async def scenario_suspend_resume(bench: Bench, figures: Figures) -> None:
    name = "e2e-suspend"
    job = small_job(name)
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: checkpoint_step(bench, name) >= 8, f"{name}: a checkpoint at step 8 or later", bench)
        await bench.cluster.patch_job(NS, name, {"spec": {"runPolicy": {"suspend": True}}})
        suspended = time.monotonic()
        await until(lambda: status(bench, name).get("phase") == "Suspended", f"{name} Suspended", bench, 60)
        await until(lambda: not bench.kubelet.processes(NS, f"{name}-"), f"{name}: every pod process stopped",
                    bench, 60)
        figures.add("suspend → every pod process stopped (s)", time.monotonic() - suspended)
        kept = checkpoint_step(bench, name)
        await bench.cluster.patch_job(NS, name, {"spec": {"runPolicy": {"suspend": False}}})
        await until(lambda: pod_log(bench, f"{name}-0").count("resumed from") >= 1, f"{name}: resumed", bench, 180)
        resumed = int(re.search(r"resumed from \S+ at step (\d+)", pod_log(bench, f"{name}-0")).group(1))
        assert resumed == kept, f"resumed at step {resumed}, the last checkpoint was at step {kept}"
        await finish(bench, name)


async def scenario_delete(bench: Bench, figures: Figures) -> None:
    name = "e2e-delete"
    job = small_job(name)
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        await until(lambda: progress_step(bench, name) >= 2, f"{name}: training", bench)
        pids = bench.kubelet.processes(NS, f"{name}-")
        assert pids, "no processes to stop"
        await bench.cluster.delete(f"/apis/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}/{name}")
        deleted = time.monotonic()
        grace = 30
        await until(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()],
                    f"{name}: every process gone", bench, grace + 5)
        gone = time.monotonic() - deleted
    await until(lambda: not network.bridge_ports(), f"nothing on the bridge (left: {network.bridge_ports()})", bench, 10)
    left = [n for n in network.list_netns() if n != network.NODE_NETNS]
    assert not left, f"pod network namespaces left: {left}"
    assert bench.cluster.job(NS, name) is None
    figures.add("job deleted → every process gone (s)", gone)


async def scenario_engine_backoff(bench: Bench, figures: Figures) -> None:
    """An engine build that fails: int8 needs a quantized (Q/DQ) model, which the export is not, so
    `dtrain build-engine` exits 2 in every pod; the Job controller retries backoffLimit times, then the
    Job fails with BackoffLimitExceeded, and the DistributedTraining fails with the engine's message."""
    name = "e2e-engine"
    job = small_job(name, trainer={**load(SMALL_JOB)["spec"]["trainer"], "maxEpochs": 1},
                    export={"onnx": {"enabled": True}},
                    engine={"enabled": True, "precision": "int8", "maxBatch": 4, "backoffLimit": 1})
    async with bench.watching(NS, name):
        await bench.cluster.apply(job)
        final = await until(lambda: status(bench, name).get("phase") in ("Succeeded", "Failed") and status(bench, name),
                            f"{name} finished", bench)
    assert final["phase"] == "Failed", json.dumps(final, indent=1)
    engine_jobs = bench.cluster.objects("batch/v1/jobs", NS, name)
    assert len(engine_jobs) == 1, engine_jobs
    conditions = {c["type"]: c for c in (engine_jobs[0].get("status") or {}).get("conditions", [])}
    assert conditions.get("Failed", {}).get("reason") == "BackoffLimitExceeded", conditions
    attempts = [p for p in bench.cluster.objects("v1/pods", NS, name)
                if p["metadata"]["labels"].get(contract.LABEL_ROLE) == contract.ROLE_ENGINE]
    assert len(attempts) == 2, f"backoffLimit 1 means 2 attempts, saw {len(attempts)}"
    assert all(p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] != 0 for p in attempts)
    message = json.dumps(final.get("conditions"))
    assert "int8" in message, f"the engine's own message is not in the conditions: {message}"


# (id for --only, title, scenario)
SCENARIOS: list[tuple[str, str, Callable[[Bench, Figures], Awaitable[None]]]] = [
    ("quickstart", "quickstart through the operator", scenario_quickstart),
    ("worker-kill", "worker SIGKILL → gang restart → resume at the checkpoint", scenario_worker_killed),
    ("network-cut", "network cut → restart within the collective timeout", scenario_network_cut),
    ("hang", "a hang (link cut, long collective timeout) → progress deadline → gang restart", scenario_hang),
    ("straggler", "one pod's link slowed (tc tbf) → the straggler Event names that pod", scenario_straggler),
    ("wrong-interface", "a wrong nccl.socketIfname → the job fails in pre-flight", scenario_wrong_interface),
    ("operator-kill", "operator SIGKILL and restart", scenario_operator_killed),
    ("suspend", "suspend and resume", scenario_suspend_resume),
    ("delete", "delete → every process gone, nothing on the bridge", scenario_delete),
    ("engine-backoff", "engine Job failing → retried up to its backoffLimit → job Failed", scenario_engine_backoff),
]


def figures_table(figures: Figures) -> str:
    lines = ["| figure | value |", "|---|---|"]
    for key, values in figures.items():
        text = ", ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in values)
        lines.append(f"| {key} | {text} |")
    local = figures.get("quick start with dtrain run (s)")
    operated = figures.get("quick start through the operator (s)")
    if local and operated:
        lines.append(f"| quick start wall time, operator ÷ dtrain run | {operated[0] / local[0]:.2f} |")
    return "\n".join(lines)
