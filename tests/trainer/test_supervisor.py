"""A worker pod's supervisor (dtrain_trainer.supervisor) restarting torchrun in place, as the operator orders it.

Real: the supervisor as a process with torchrun and its workers under it, the operator's report endpoint
(controller/report_server.py) over HTTPS, the operator's record of the supervisors (controller/supervisors.py)
and its pure decisions: the status (compute_status), the plan (plan_children) and the orders (core.in_place).
What stands in: the API server (TokenReview is a table; the pod's watch is a PodObservation whose label the
test changes as the relabel would) and the reconcile loop, which `Operator.reconcile` plays from the same
functions. The pods, the kubelet and the real reconciler are `make e2e`'s (scenario in-place-restart).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, contract
from dtrain_operator.api.launches import LaunchOrder, LaunchReport
from dtrain_operator.controller.report_server import BoundPod, Refused, ReportServer
from dtrain_operator.controller.report_tls import issue
from dtrain_operator.controller.supervisors import Supervisors
from dtrain_operator.core import progress_deadline
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.observation import Observed, PodObservation
from dtrain_operator.core.render import POD_COMMAND
from dtrain_operator.core.status.compute import compute_status
from dtrain_trainer.operator_link import Answer
from dtrain_trainer.supervisor import Supervisor, acted_on, step
from tests.builders import a_cpu_job, accepted_status

from ..ports import free_port
from .conftest import process_env

HOST = "localhost"
NS, JOB_NAME, JOB_UID = "team-a", "resnet", "job-uid"
TLS = issue([HOST])
JOB = a_cpu_job(JOB_NAME).in_namespace(NS).with_nodes(1).with_uid(JOB_UID).with_progress_deadline(60).as_model()
KEY = (NS, JOB_NAME)
POD_UID = "pod-0"
TOKENS = {"pod-token": BoundPod(NS, f"{JOB_NAME}-0", POD_UID)}

# The worker: each start appends to LOG; what it does is the next of ACTIONS (exit:N, or hang: ignore SIGTERM).
WORKER = """
import os, signal, sys, time
log = os.environ["SUPERVISED_LOG"]
with open(log, "a") as f:
    f.write(f"start {os.getpid()}\\n")
starts = open(log).read().count("start")
action = os.environ["SUPERVISED_ACTIONS"].split(",")[starts - 1]
if action == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
with open(os.environ["DTRAIN_TERMINATION_LOG"], "w") as f:
    f.write(f"launch {starts} ends with {action}")
sys.exit(int(action.split(":")[1]))
"""


class Reviewer:
    async def review(self, token: str) -> BoundPod:
        if token not in TOKENS:
            raise Refused(401, "not a token for dtrain.dev/operator")
        return TOKENS[token]


@dataclass
class Operator:
    """The operator's side for one job of one pod: the real report endpoint and supervisors' record, and a
    reconcile made of the real pure functions (status, plan, orders) with the pod's label kept here."""

    loop: asyncio.AbstractEventLoop
    job: DistributedTraining = field(default_factory=lambda: JOB)
    supervisors: Supervisors = field(default_factory=Supervisors)
    pod: PodObservation = field(default_factory=lambda: PodObservation(
        name=f"{JOB_NAME}-0", uid=POD_UID, resource_version="1", role=contract.ROLE_WORKER, rank=0, generation=0,
        phase="Running", owner_uid=JOB_UID, scheduled=True))
    status: DistributedTrainingStatus = field(default_factory=lambda: accepted_status(JOB))
    watch: progress_deadline.ProgressWatch | None = None
    reports: list[LaunchReport] = field(default_factory=list)
    hang_now: bool = False

    # report_server.Jobs
    def job_uid(self, namespace: str, name: str) -> str | None:
        return JOB_UID if (namespace, name) == KEY else None

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None:
        return self.pod if pod_uid == self.pod.uid else None

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        pass

    def launch_reported(self, namespace: str, name: str, pod: PodObservation, report: LaunchReport) -> None:
        self.reports.append(report)
        if self.supervisors.report(KEY, pod.uid, report, datetime.now(timezone.utc)):
            self.reconcile()

    def launch_order(self, namespace: str, name: str, pod: PodObservation) -> LaunchOrder | None:
        return self.supervisors.order(KEY, pod)

    async def launch_decided(self, namespace: str, name: str, timeout: float) -> None:
        await self.supervisors.changed(KEY, timeout)

    def reconcile(self) -> None:
        """One reconcile, on the server's event loop (as the operator's): status, plan, relabel, orders."""
        now = datetime.now(timezone.utc)
        (pod,) = self.supervisors.attach(KEY, [self.pod])
        if self.hang_now:  # the progress deadline ran out (core.progress_deadline watches it in the operator)
            self.hang_now = False
            self.watch = progress_deadline.ProgressWatch(
                self.status.gang_generation, (), now.replace(year=2000), 0, "training", started=True)
        elif self.watch is not None and self.watch.generation != self.status.gang_generation:
            self.watch = None
        self.status = compute_status(self.job, Observed(workers=(pod,)), self.status, now, progress_watch=self.watch)
        job = self.job.model_copy(update={"status": self.status})
        plan = plan_children(job, self.status, Observed(workers=(pod,)), now)
        assert self.status.phase == "Failed" or not (plan.delete_pods or plan.create_ranks), plan
        if plan.relabel_pods:
            self.pod = replace(self.pod, generation=self.status.gang_generation)
            return self.reconcile()
        self.supervisors.decided(KEY, job, self.status)
        return None

    def call(self, function: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(_call(function), self.loop).result(10)


async def _call(function: Callable[[], Any]) -> Any:
    return function()


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[tuple[Operator, int]]:
    port = free_port()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    jobs = Operator(loop)
    server = ReportServer(TLS, port, jobs, Reviewer(), host="127.0.0.1")
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    jobs.call(jobs.reconcile)
    yield jobs, port
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def supervise(tmp_path: Path, port: int | None, actions: str, shutdown_seconds: int = 3) -> subprocess.Popen[str]:
    """The pod's command (render.POD_COMMAND's supervisor) on a worker script, with the pod's token and CA;
    torchrun waits `shutdown_seconds` for its workers after SIGTERM."""
    (tmp_path / "ca.crt").write_text(TLS.ca_pem)
    (tmp_path / "token").write_text("pod-token\n")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {
        **process_env(),
        contract.ENV_JOB_NAMESPACE: NS,
        contract.ENV_JOB_NAME: JOB_NAME,
        contract.ENV_GANG_GENERATION: "0",
        contract.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"),
        "SUPERVISED_LOG": str(tmp_path / "starts.log"),
        "SUPERVISED_ACTIONS": actions,
        contract.ENV_SHUTDOWN_TIMEOUT: str(shutdown_seconds),
    }
    if port is not None:
        env[contract.ENV_OPERATOR_URL] = f"https://{HOST}:{port}"
    module = POD_COMMAND[2]
    code = (f"import sys; from pathlib import Path; from {module} import main; "
            f"sys.exit(main(sys.argv[1:], Path({str(tmp_path / 'token')!r}), Path({str(tmp_path / 'ca.crt')!r})))")
    return subprocess.Popen(
        [sys.executable, "-c", code, "--nnodes=1", "--nproc-per-node=1", "--master-port=0", str(worker)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def starts(tmp_path: Path) -> list[int]:
    log = tmp_path / "starts.log"
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_failed_torchrun_is_reported_and_run_again_in_the_same_process_tree(operator, tmp_path: Path) -> None:
    jobs, port = operator
    supervisor = supervise(tmp_path, port, "exit:3,exit:0")
    output, _ = supervisor.communicate(timeout=180)
    assert supervisor.returncode == 0, output[-3000:]
    assert len(starts(tmp_path)) == 2
    exited = next(r for r in jobs.reports if r.state == "exited")
    assert (exited.generation, exited.exit_code, exited.reason) == (0, 3, "Error")
    assert exited.message == "launch 1 ends with exit:3"  # the termination log, as a pod's message
    status = jobs.status
    assert (status.restarts, status.restarts_in_place, status.gang_generation) == (1, 1, 1)
    assert status.last_restart.strategy == "InPlace"
    assert jobs.pod.generation == 1  # relabelled, not recreated
    assert "starting torchrun for gang generation 1" in output


def test_a_hung_worker_that_ignores_sigterm_is_killed_after_the_grace_and_the_gang_runs_again(operator, tmp_path):
    jobs, port = operator
    supervisor = supervise(tmp_path, port, "hang,exit:0", shutdown_seconds=60)
    wait_until(lambda: len(starts(tmp_path)) == 1 and any(r.state == "running" for r in jobs.reports))
    hung = starts(tmp_path)[0]
    stopping = time.monotonic()
    jobs.hang_now = True
    jobs.call(jobs.reconcile)
    assert jobs.status.in_place_generation == 1
    output, _ = supervisor.communicate(timeout=180)
    assert supervisor.returncode == 0, output[-3000:]
    # The worker ignored SIGTERM and torchrun waits longer than the hung gang's grace period: the supervisor
    # killed both after it, the worker in a session of its own as torchrun starts it.
    assert time.monotonic() - stopping >= progress_deadline.HUNG_GANG_GRACE_SECONDS
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)
    assert "did not stop within 5 s of SIGTERM" in output
    stopped = next(r for r in jobs.reports if r.state == "exited")
    assert stopped.reason == "Stopped"
    assert len(starts(tmp_path)) == 2 and jobs.pod.generation == 1


def test_sigterm_reaches_torchrun_and_the_pod_ends_with_its_code(operator, tmp_path: Path) -> None:
    _jobs, port = operator
    supervisor = supervise(tmp_path, port, "hang")
    wait_until(lambda: len(starts(tmp_path)) == 1)
    supervisor.send_signal(signal.SIGTERM)
    output, _ = supervisor.communicate(timeout=120)
    # torchrun passes SIGTERM on and stops its worker after its shutdown timeout: the launcher's 143.
    assert supervisor.returncode == 143, output[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(starts(tmp_path)[0], 0)


def test_a_failure_the_operator_answers_with_exit_ends_the_pod_with_torchruns_code(operator, tmp_path: Path) -> None:
    jobs, port = operator
    # restartPolicy Never: the job fails, the pod exits with the worker's own code (and its message stays).
    jobs.job = a_cpu_job(JOB_NAME).in_namespace(NS).with_nodes(1).with_uid(JOB_UID).with_restart_policy("Never").as_model()
    jobs.status = accepted_status(jobs.job)
    supervisor = supervise(tmp_path, port, "exit:3")
    output, _ = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 3, output[-3000:]
    assert jobs.status.phase == "Failed"
    assert (tmp_path / "termination-log").read_text() == "launch 1 ends with exit:3"


def test_without_the_operator_it_is_the_launcher(tmp_path: Path) -> None:
    supervisor = supervise(tmp_path, None, "exit:3")
    output, _ = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 3 and "dtrain supervisor" not in output


class LaunchThatEnds:
    """A torchrun whose exit the test decides (no process): `code` None while it runs."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def wait(self) -> int:
        assert self.code is not None
        return self.code

    def stop(self, grace_seconds: float) -> int:
        raise AssertionError("nothing runs: nothing to stop")

    def exit_report(self, code: int) -> tuple[str, str]:
        return "Error", f"exited {code}"


class NoOperator:
    """The supervisor's link when the test plays the operator's answers itself."""

    def post(self, path: str, body: bytes, timeout: float) -> str:
        return "unreachable"


def supervisor_with(launch: LaunchThatEnds, tmp_path: Path) -> Supervisor:
    supervisor = Supervisor(["--nnodes=1"], NoOperator(), "/launches", launch.generation, tmp_path / "log")  # type: ignore[arg-type]
    supervisor.launch = launch  # type: ignore[assignment]
    return supervisor


@pytest.mark.parametrize(("launched", "order", "expected"), [
    (0, LaunchOrder(action="run", generation=0), "nothing"),
    (None, LaunchOrder(action="run", generation=0), "replace"),
    (0, LaunchOrder(action="run", generation=1), "replace"),
    (0, LaunchOrder(action="stop", generation=0), "stop"),
    (0, LaunchOrder(action="exit", generation=0), "exit"),
    (0, LaunchOrder(action="wait", generation=0), "nothing"),
])
def test_one_place_decides_what_an_order_comes_to(launched, order, expected) -> None:
    assert step(launched, order) == expected


class HeldAnswers:
    """The operator's answers to one supervisor's questions, in turn: `run` for the generation it runs (what the
    operator says when its hold of the question runs out), then `wait`, which also ends the supervisor's polling."""

    def __init__(self, supervisor_of: Callable[[], Supervisor]) -> None:
        self.supervisor_of = supervisor_of
        self.asked: list[LaunchReport] = []

    def post(self, path: str, body: bytes, timeout: float) -> Answer:
        self.asked.append(LaunchReport.model_validate_json(body))
        if len(self.asked) == 1:
            return Answer(200, LaunchOrder(action="run", generation=0).model_dump_json())
        self.supervisor_of().terminated.set()
        return Answer(200, LaunchOrder(action="wait", generation=0).model_dump_json())


def test_an_order_already_in_effect_is_followed_by_the_next_question_at_once(tmp_path: Path) -> None:
    """A `run` for the generation that runs changes nothing, so the supervisor asks again at once (the operator holds
    the question): a stop decided meanwhile reaches it then, not after a pause of its own."""
    assert not acted_on(0, LaunchOrder(action="run", generation=0))
    assert not acted_on(0, LaunchOrder(action="wait", generation=0))
    assert acted_on(0, LaunchOrder(action="stop", generation=0)) and acted_on(0, LaunchOrder(action="run", generation=1))
    supervisor = supervisor_with(LaunchThatEnds(0), tmp_path)
    supervisor.link = HeldAnswers(lambda: supervisor)  # type: ignore[assignment]
    poll = threading.Thread(target=supervisor.poll_forever, daemon=True)
    poll.start()
    poll.join(5.0)  # without asking at once, it would wait up to 10 s for a report that never changes
    assert not poll.is_alive()
    assert [report.sequence for report in supervisor.link.asked] == [0, 0]  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [0, 1])
def test_a_run_order_after_torchrun_ended_never_starts_that_generation_again(tmp_path: Path, code: int) -> None:
    """The race of a finished gang started again: the loop looks (torchrun runs), torchrun exits, then the
    operator's `run` for the same generation (its answer to "running") is obeyed. Interleaved by hand."""
    launch = LaunchThatEnds(generation=0)
    supervisor = supervisor_with(launch, tmp_path)
    assert supervisor.launch_ended() is None  # the loop's look: it runs
    launch.code = code  # it ends now, between the look and the order
    assert supervisor.obey(LaunchOrder(action="run", generation=0)) is None
    assert supervisor.launch is launch, "a new torchrun was started for a generation that had ended"
    if code == 0:
        assert supervisor.launch_ended() == 0  # the rank finished: the pod ends with 0
    else:
        assert supervisor.launch_ended() is None and supervisor.report.state == "exited"  # reported, not rerun
        assert supervisor.report.exit_code == 1 and supervisor.report.generation == 0


@pytest.mark.parametrize("action", ["stop", "exit"])
def test_a_stop_or_exit_order_racing_a_clean_exit_ends_with_0(tmp_path: Path, action: str) -> None:
    launch = LaunchThatEnds(generation=0)
    supervisor = supervisor_with(launch, tmp_path)
    assert supervisor.launch_ended() is None
    launch.code = 0
    done = supervisor.obey(LaunchOrder(action=action, generation=0))
    assert supervisor.launch is launch
    assert (done if action == "exit" else supervisor.launch_ended()) == 0
