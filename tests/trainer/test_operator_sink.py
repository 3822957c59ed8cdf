"""Rank 0's records to the operator: the trainer's OperatorSink against the operator's own report
endpoint (controller/report_server.py) over real HTTPS, a standby and a leader behind one name.

What stands in: the API server's TokenReview (a table of tokens to the pods they are bound to) and
the operator's watch of the job and its pods; the real TokenReview and pods are `make e2e`'s
(scenario `tokens`). Everything else is the code that runs in the pods and the operator.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api import contract
from dtrain_operator.api.records import Event
from dtrain_operator.controller.report_server import BoundPod, Refused, ReportServer
from dtrain_operator.controller.report_tls import issue
from dtrain_operator.core.observation import PodObservation
from dtrain_trainer import hang_watch
from dtrain_trainer.progress import ProgressReporter
from dtrain_trainer.progress_sinks import OperatorSink

from ..ports import free_port

HOST = "dtrain-operator.dtrain-system.svc"
STANDBY, LEADER = "127.0.0.1", "127.0.0.2"
NS, JOB, JOB_UID = "team-a", "resnet", "job-uid"
TLS = issue([HOST])


def pod(uid: str, rank: int, generation: int = 3, owner: str = JOB_UID) -> PodObservation:
    return PodObservation(name=f"{JOB}-{rank}", uid=uid, resource_version="1", role=contract.ROLE_WORKER, rank=rank,
                          generation=generation, phase="Running", owner_uid=owner)


@dataclass
class Jobs:
    """The operator's watch of one job and its pods; the status patches it was asked to write."""

    pods: list[PodObservation] = field(default_factory=lambda: [pod("rank-0", 0), pod("rank-1", 1)])
    patches: list[dict[str, Any]] = field(default_factory=list)

    def job_uid(self, namespace: str, name: str) -> str | None:
        return JOB_UID if (namespace, name) == (NS, JOB) else None

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None:
        return next((p for p in self.pods if p.uid == pod_uid), None) if (namespace, name) == (NS, JOB) else None

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append(dict(patch))


# The API server's TokenReview for the operator's audience: token -> the pod it is bound to.
TOKENS = {
    "rank-0-token": BoundPod(NS, f"{JOB}-0", "rank-0"),
    "rank-1-token": BoundPod(NS, f"{JOB}-1", "rank-1"),
    "elsewhere-token": BoundPod("team-b", f"{JOB}-0", "other"),
    "unseen-pod-token": BoundPod(NS, f"{JOB}-0", "not-yet-watched"),
}


class Reviewer:
    async def review(self, token: str) -> BoundPod:
        if token not in TOKENS:
            raise Refused(401, "the token is not valid for dtrain.dev/operator")
        return TOKENS[token]


@dataclass
class Endpoint:
    port: int
    jobs: Jobs
    standby: ReportServer
    leader: ReportServer
    loop: asyncio.AbstractEventLoop
    ca: Path
    token: Path

    def sink(self, **kwargs: Any) -> OperatorSink:
        return OperatorSink(f"https://{HOST}:{self.port}", NS, JOB, token_path=self.token, ca_path=self.ca,
                            resolve=lambda host, port: [STANDBY, LEADER], **kwargs)

    def post(self, body: bytes, token: str | None, address: str = LEADER) -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(self.ca))
        connection = http.client.HTTPSConnection(address, self.port, context=context, timeout=5)
        context.check_hostname = False  # the address, not the name: the sink's own connection checks the name
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        connection.request("POST", contract.report_path(NS, JOB), body, headers)
        response = connection.getresponse()
        return response.status, response.read().decode()


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    """A standby and a leader replica on one port of two addresses, in an event loop of their own."""
    port, jobs = free_port(), Jobs()
    standby = ReportServer(TLS, port, host=STANDBY)
    leader = ReportServer(TLS, port, jobs, Reviewer(), host=LEADER)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    for server in (standby, leader):
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    (tmp_path / "ca.crt").write_text(TLS.ca_pem)
    (tmp_path / "token").write_text("rank-0-token\n")
    endpoint = Endpoint(port, jobs, standby, leader, loop, tmp_path / "ca.crt", tmp_path / "token")
    yield endpoint
    for server in (endpoint.standby, endpoint.leader):  # a test may have started another leader
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_records_reach_the_status_through_the_leader(endpoint: Endpoint) -> None:
    reporter = ProgressReporter(endpoint.sink(), interval_seconds=0.0)
    for step in range(1, 6):
        reporter.progress(epoch=0, step=step, loss=1.0 / step, imagesPerSecond=100.0 * step)
    reporter.event(Event.CHECKPOINT, step=4, path="/c/step=00000004.ckpt")
    # A later checkpoint that could not be written: said beside the written one, which stays.
    reporter.event(Event.CHECKPOINT, step=5, path="s3://b/c/step=00000005.ckpt", ok=False, error="Timeout")
    reporter.event(Event.WARNING, message="not a status field: never sent")
    reporter.close()

    assert endpoint.standby.refused and set(endpoint.standby.refused) == {503}  # tried first, said "not me"
    assert endpoint.leader.taken >= 1 and not endpoint.leader.refused
    merged: dict[str, Any] = {}
    for patch in endpoint.jobs.patches:
        for key, value in patch.items():
            merged[key] = {**merged.get(key, {}), **value}
    # The operator stamps the gang generation of the pod that reported (its label, read from its watch).
    assert merged["progress"]["step"] == 5 and merged["progress"]["gangGeneration"] == 3
    assert merged["progress"]["imagesPerSecond"] == 500.0
    assert merged["lastCheckpoint"]["step"] == 4
    assert merged["lastCheckpoint"]["missed"]["error"] == "Timeout"
    assert set(merged) == {"progress", "lastCheckpoint"}


def test_a_hangs_stacks_reach_the_status_whole_and_stamped_within_one_report(endpoint: Endpoint) -> None:
    # As large as the trainer makes them: as many distinct places as the summary lists, each with long frames.
    answers = {
        rank: {"threads": [{"name": "MainThread", "training": True, "frames": [
            [f"my_package.some_long_module_name_{rank}_{i}", f"SomeClass.some_long_method_name_{i}", f"/a/long/path/{i}.py", i]
            for i in range(40)
        ]}]}
        for rank in range(12)
    }
    groups, _ = hang_watch.summarize(answers, world_size=16)
    reporter = ProgressReporter(endpoint.sink(), interval_seconds=0.0)
    reporter.progress(epoch=0, step=7, batches=14)
    reporter.event(Event.PREFLIGHT, worldSize=16, ranks=[{"rank": r, "pod": f"{JOB}-{r}", "node": f"node-{r}"} for r in range(16)])
    reporter.event(Event.HANG, step=7, batches=14, worldSize=16, groups=hang_watch.bounded(groups), silent="12-15",
                   dumps="/art/hangs/t-step-7")
    reporter.close()
    assert not endpoint.leader.refused  # one report, progress, pre-flight and stacks together, under the limit
    stacks = next(patch["hangStacks"] for patch in endpoint.jobs.patches if "hangStacks" in patch)
    assert stacks["gangGeneration"] == 3 and stacks["silent"] == "12-15" and len(stacks["groups"]) == len(groups)
    assert "stalledSeconds" in stacks and stacks["stalledSeconds"] is None  # a merge patch clears an earlier one's


def test_only_rank_zero_of_the_job_may_report(endpoint: Endpoint) -> None:
    progress = json.dumps({"records": [{"event": "progress", "step": 7, "time": "2026-12-02T00:00:00Z"}]}).encode()
    assert endpoint.post(progress, None)[0] == 401
    assert endpoint.post(progress, "forged-token")[0] == 401
    assert endpoint.post(progress, "rank-1-token")[0] == 403  # a worker, but not rank 0
    assert endpoint.post(progress, "elsewhere-token")[0] == 403  # another namespace's pod
    assert endpoint.post(progress, "unseen-pod-token")[0] == 409  # not (yet) in the operator's watch: retried
    assert endpoint.post(progress, "rank-0-token", STANDBY)[0] == 503
    not_a_status_record = json.dumps({"records": [{"event": "warning", "message": "x"}]}).encode()
    assert endpoint.post(not_a_status_record, "rank-0-token")[0] == 400
    assert endpoint.post(b"{", "rank-0-token")[0] == 400
    status, _ = endpoint.post(b'{"records": [' + b'{"event": "progress"},' * 2000 + b"{}]}", "rank-0-token")
    assert status == 413
    assert endpoint.jobs.patches == []
    endpoint.jobs.pods = [pod("rank-0", 0, owner="another-job")]  # a pod that claims the job but is not its
    assert endpoint.post(progress, "rank-0-token")[0] == 403
    endpoint.jobs.pods = [pod("rank-0", 0)]
    assert endpoint.post(progress, "rank-0-token")[0] == 204
    assert endpoint.jobs.patches[-1]["progress"]["step"] == 7


def test_an_unreachable_operator_costs_training_nothing(endpoint: Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    """No leader answers: sends return at once, only the newest record of each kind waits, one warning;
    once a leader answers, the newest records arrive."""
    endpoint.leader, running = ReportServer(TLS, endpoint.port, host=LEADER), endpoint.leader
    asyncio.run_coroutine_threadsafe(running.stop(), endpoint.loop).result(10)
    asyncio.run_coroutine_threadsafe(endpoint.leader.start(), endpoint.loop).result(10)  # a second standby
    with caplog.at_level(logging.DEBUG, logger="dtrain_trainer"):
        sink = endpoint.sink(request_timeout=1.0)
        started = time.monotonic()
        for step in range(1000):
            sink.send({"event": "progress", "step": step, "time": "2026-12-02T00:00:00Z"})
        assert time.monotonic() - started < 2.0  # generous: 1000 sends take milliseconds
        wait_until(lambda: endpoint.standby.refused.total() >= 2)
        assert len(sink._slots) == 1  # the newest progress record only
        # The leader comes back (a failover completed): the newest record arrives.
        asyncio.run_coroutine_threadsafe(endpoint.leader.stop(), endpoint.loop).result(10)
        endpoint.leader = ReportServer(TLS, endpoint.port, endpoint.jobs, Reviewer(), host=LEADER)
        asyncio.run_coroutine_threadsafe(endpoint.leader.start(), endpoint.loop).result(10)
        wait_until(lambda: bool(endpoint.jobs.patches))
        sink.close()
    assert endpoint.jobs.patches[-1]["progress"]["step"] == 999
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "dtrain_trainer"]
    assert len(warnings) == 1 and "503" in warnings[0] and "training goes on" in warnings[0]
    assert "rank-0-token" not in caplog.text


def test_a_certificate_from_another_ca_is_refused(endpoint: Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    endpoint.ca.write_text(issue([HOST]).ca_pem)  # not the CA the operator's certificate is signed by
    with caplog.at_level(logging.WARNING, logger="dtrain_trainer"):
        sink = endpoint.sink(request_timeout=1.0, close_seconds=1.0)
        sink.send({"event": "progress", "step": 1, "time": "2026-12-02T00:00:00Z"})
        sink.close()
    assert endpoint.leader.taken == 0 and "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_the_last_checkpoint_reaches_a_leader_that_answers_only_after_close(endpoint: Endpoint) -> None:
    """A pod going away after its SIGTERM checkpoint while no replica leads (a failover, a busy
    operator): close keeps trying, so the status still names the checkpoint the resume will use."""
    asyncio.run_coroutine_threadsafe(endpoint.leader.stop(), endpoint.loop).result(10)
    sink = endpoint.sink(request_timeout=1.0, close_seconds=20.0)
    sink.send({"event": "checkpoint", "step": 29, "path": "/c/step=00000029.ckpt", "time": "2026-12-02T00:00:00Z"})
    closing = threading.Thread(target=sink.close)
    closing.start()
    wait_until(lambda: endpoint.standby.refused.total() >= 2)  # tried, and tried again after close
    assert closing.is_alive() and not endpoint.jobs.patches
    endpoint.leader = ReportServer(TLS, endpoint.port, endpoint.jobs, Reviewer(), host=LEADER)
    asyncio.run_coroutine_threadsafe(endpoint.leader.start(), endpoint.loop).result(10)
    closing.join(30)
    assert not closing.is_alive()
    assert [p["lastCheckpoint"]["step"] for p in endpoint.jobs.patches] == [29]
