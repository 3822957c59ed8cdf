"""The report endpoint against a job's own code (controller/report_limits.py), from a worker's point of view: an
idle-connection flood, a report every millisecond, a TokenReview flood of made-up tokens, a forged eviction
reason. The endpoint runs in this process over real HTTPS on loopback addresses (one per "pod"); the API
server's TokenReview and the operator's watch stand in, as in tests/trainer/test_operator_sink.py."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from dtrain_operator.api import contract
from dtrain_operator.api.record_patches import replacing_maps, with_records
from dtrain_operator.controller.report_limits import ServingLimits
from dtrain_operator.controller.report_server import BoundPod, Refused, ReportServer, TokenReviewer, merged_patch
from dtrain_operator.controller.report_tls import issue
from dtrain_operator.controller.report_writes import CoalescedWrites
from dtrain_operator.core.observation import PodObservation

from ..ports import free_port

NS, JOB, JOB_UID = "team-a", "resnet", "job-uid"
TLS = issue(["dtrain-operator.dtrain-system.svc"])
ATTACKER, HONEST = "127.0.0.3", "127.0.0.4"
LIMITS = ServingLimits(connections=64, connections_per_peer=4, handshake_seconds=1.0, idle_seconds=1.0,
                       peer_rate=10.0, peer_burst=10.0)


@dataclass
class Jobs:
    pods: list[PodObservation] = field(default_factory=lambda: [
        PodObservation(name=f"{JOB}-0", uid="rank-0", resource_version="1", role=contract.ROLE_WORKER, rank=0,
                       generation=0, phase="Running", owner_uid=JOB_UID)])
    patches: list[dict[str, Any]] = field(default_factory=list)
    launches: list[Any] = field(default_factory=list)

    def job_uid(self, namespace: str, name: str) -> str | None:
        return JOB_UID

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None:
        return next((p for p in self.pods if p.uid == pod_uid), None)

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append(dict(patch))

    def launch_reported(self, namespace: str, name: str, pod: PodObservation, report: Any) -> None:
        self.launches.append(report)

    def launch_order(self, namespace: str, name: str, pod: PodObservation) -> None:
        return None

    async def launch_decided(self, namespace: str, name: str, timeout: float) -> None:
        await asyncio.sleep(min(timeout, 0.05))


class Reviewer:
    def __init__(self) -> None:
        self.asked = 0

    async def review(self, token: str) -> BoundPod:
        self.asked += 1
        if token != "rank-0-token":
            raise Refused(401, "the token is not valid for dtrain.dev/operator")
        return BoundPod(NS, f"{JOB}-0", "rank-0")


@dataclass
class Endpoint:
    server: ReportServer
    port: int
    jobs: Jobs
    reviewer: Reviewer

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=TLS.ca_pem)
        context.check_hostname = False
        return context

    async def connect(self, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.context(), local_addr=(peer, 0))

    async def post(self, peer: str, path: str, body: Mapping[str, Any], token: str = "rank-0-token") -> int:
        reader, writer = await self.connect(peer)
        data = json.dumps(body).encode()
        writer.write((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
                     + data)
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return int(status_line.split()[1])


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    port, jobs, reviewer = free_port(), Jobs(), Reviewer()
    server = ReportServer(TLS, port, jobs, reviewer, host="127.0.0.1", limits=LIMITS)
    await server.start()
    yield Endpoint(server, port, jobs, reviewer)
    await server.stop()


PROGRESS = {"records": [{"event": "progress", "time": "2026-01-01T00:00:00Z", "step": 1}]}


async def test_one_pods_idle_connections_are_capped_and_another_pod_is_served(endpoint: Endpoint):
    held = [await endpoint.connect(ATTACKER) for _ in range(LIMITS.connections_per_peer)]
    reader, _ = await endpoint.connect(ATTACKER)  # one over its share: closed at once
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert endpoint.server.connections.refused >= 1
    assert await endpoint.post(HONEST, contract.report_path(NS, JOB), PROGRESS) == 204
    # Idle connections do not stay: each is closed after its idle time, and its place is free again.
    for reader, _ in held:
        assert await asyncio.wait_for(reader.read(), 10) == b""
    for _ in range(100):  # the server's side of the last close may follow the client's by a moment
        if not endpoint.server.connections.open:
            break
        await asyncio.sleep(0.05)
    assert not endpoint.server.connections.open


async def test_a_peer_gone_silent_frees_its_place_within_the_handshakes_time(endpoint: Endpoint):
    """A pod gone without a word (its network namespace removed) never answers the server's TLS close: its place is
    free once the close has waited the handshake's time for it (asyncio's own wait is 30 s)."""

    def silent_peer() -> ssl.SSLSocket:  # a blocking TLS socket that is never read again: no close is answered
        raw = socket.create_connection(("127.0.0.1", endpoint.port), source_address=(ATTACKER, 0))
        return endpoint.context().wrap_socket(raw)

    peer = await asyncio.to_thread(silent_peer)
    try:
        for held in (True, False):  # admitted; then, after its idle time (1 s) and the close's wait (1 s), released
            for _ in range(200):
                if (ATTACKER in endpoint.server.connections.open) == held:
                    break
                await asyncio.sleep(0.05)
            assert (ATTACKER in endpoint.server.connections.open) == held
    finally:
        peer.close()


async def test_a_silent_handshake_is_dropped():
    """A TCP connection that never starts TLS holds nothing past the handshake's time."""
    port = free_port()
    server = ReportServer(TLS, port, Jobs(), Reviewer(), host="127.0.0.1", limits=LIMITS)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        await server.stop()


async def test_a_report_every_millisecond_is_slowed_and_costs_no_token_reviews(endpoint: Endpoint):
    started = asyncio.get_running_loop().time()
    answers = [await endpoint.post(ATTACKER, contract.report_path(NS, JOB), PROGRESS, token=f"made-up-{i}")
               for i in range(40)]
    # The bucket refills while the requests are made (each a new TLS connection): what it can have let through.
    let_through = LIMITS.peer_burst + LIMITS.peer_rate * (asyncio.get_running_loop().time() - started) + 1
    assert 429 in answers and len(answers) - answers.count(429) <= let_through
    assert endpoint.reviewer.asked <= let_through
    assert await endpoint.post(HONEST, contract.report_path(NS, JOB), PROGRESS) == 204


async def test_a_deeply_nested_body_is_a_bad_request(endpoint: Endpoint):
    reader, writer = await endpoint.connect(HONEST)
    body = b"{\"records\": " + b"[" * 10000 + b"]" * 10000 + b"}"
    writer.write((f"POST {contract.report_path(NS, JOB)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer rank-0-token\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
    assert int((await asyncio.wait_for(reader.readline(), 10)).split()[1]) == 400
    writer.close()


async def test_a_forged_eviction_reason_is_refused(endpoint: Endpoint):
    forged = {"generation": 0, "state": "exited", "exitCode": 143, "reason": "WorkloadEvicted", "sequence": 1}
    assert await endpoint.post(HONEST, contract.launch_path(NS, JOB), forged) == 400
    assert endpoint.jobs.launches == []


class FakeApi:
    """The API server's TokenReview: one token is good."""

    def __init__(self) -> None:
        self.asked = 0

    async def review_token(self, token: str, audience: str) -> dict[str, Any]:
        self.asked += 1
        if token != "good":
            return {"status": {"authenticated": False, "error": "invalid bearer token"}}
        return {"status": {"authenticated": True, "audiences": [audience], "user": {
            "username": f"system:serviceaccount:{NS}:dtrain-trainer",
            "extra": {"authentication.kubernetes.io/pod-name": [f"{JOB}-0"],
                      "authentication.kubernetes.io/pod-uid": ["rank-0"]}}}}


async def test_made_up_tokens_never_push_a_good_one_out_of_the_cache():
    api = FakeApi()
    reviewer = TokenReviewer(api)  # type: ignore[arg-type]
    assert await reviewer.review("good") == BoundPod(NS, f"{JOB}-0", "rank-0")
    for i in range(5000):
        with pytest.raises(Refused):
            await reviewer.review(f"made-up-{i}")
    asked = api.asked
    assert await reviewer.review("good") == BoundPod(NS, f"{JOB}-0", "rank-0")
    assert api.asked == asked, "the good token's review is still cached"


@pytest.mark.parametrize(("record", "answer", "named"), [
    ({"event": "progress", "metrics": {f"metric_{i}": 1.0 for i in range(100)}}, 413, "metrics"),
    ({"event": "progress", "stage": "x" * 100_000}, 413, "stage"),
    ({"event": "preflight", "versions": {f"lib{i}": "1.0" for i in range(100)}}, 413, "versions"),
    ({"event": "progress", "metrics": {"\x1b]0;pwned\x07val_loss": 1.0}}, 400, "metrics"),
    ({"event": "progress", "validation": "val_loss=\x1b[2J0.4"}, 400, "validation"),
    ({"event": "progress", "stepBreakdown": {"ranks": [{"rank": r} for r in range(256)]}}, 413, "stepBreakdown"),
    ({"event": "progress", "stepBreakdown": {"bottleneck": "rank 1:\x1b[2J"}}, 400, "stepBreakdown"),
], ids=["too many metrics", "a huge stage", "too many versions", "an escape in a metric name", "an escape in VAL",
        "every rank's step breakdown", "an escape in the bottleneck"])
def test_a_record_over_its_bounds_is_refused_naming_the_field(record, answer, named):
    with pytest.raises(Refused) as refused:
        merged_patch([{"time": "2026-01-01T00:00:00Z", **record}], 0)
    assert refused.value.status == answer and f"records[0].{named}" in str(refused.value)


def test_a_status_field_stays_within_its_bound_however_the_records_add_up():
    many = [{"event": "preflight", "ranks": [{"rank": r, "pod": "p" * 200, "node": "n" * 200} for r in range(80)]}]
    with pytest.raises(Refused) as refused:
        merged_patch(many, 0)
    assert refused.value.status == 413 and "status.preflight would be" in str(refused.value)


def test_metrics_are_replaced_not_merged():
    """A metric logged once does not stay in the status for ever: the keys a new record lacks are nulled."""
    status = {"progress": {"step": 3, "metrics": {"val_loss": 0.5, "debug_once": 1.0}},
              "preflight": {"versions": {"torch": "2.14", "nccl": None}}}
    patch = merged_patch([{"event": "progress", "step": 4, "metrics": {"val_loss": 0.4}}], 0)
    assert replacing_maps(patch, status)["progress"]["metrics"] == {"debug_once": None, "val_loss": 0.4}
    assert replacing_maps({"progress": {"step": 5}}, status) == {"progress": {"step": 5}}  # no metrics sent: kept


async def test_a_jobs_reports_are_coalesced_into_few_writes():
    """A report every millisecond costs one status write per interval, with every record's content in it."""
    written: list[tuple[Any, dict[str, Any]]] = []

    async def write(key: Any, patch: Mapping[str, Any]) -> None:
        written.append((key, dict(patch)))

    writes = CoalescedWrites(write, interval=0.3)
    started = asyncio.get_running_loop().time()
    for step in range(200):
        writes.add(("team-a", "resnet"), {"progress": {"step": step, "metrics": {f"m{step % 3}": 1.0}}})
        writes.add(("team-b", "other"), {"progress": {"step": step}})
        await asyncio.sleep(0.001)
    while writes._flushing:
        await asyncio.sleep(0.05)
    elapsed = asyncio.get_running_loop().time() - started
    mine = [patch for key, patch in written if key == ("team-a", "resnet")]
    assert len(mine) <= 2 + elapsed / 0.3
    assert mine[-1]["progress"]["step"] == 199
    assert mine[-1]["progress"]["metrics"] == {"m1": 1.0}  # the latest record's map, not a merge of all of them
    assert [patch for key, patch in written if key == ("team-b", "other")][-1] == {"progress": {"step": 199}}


def _recorded_writes(interval: float) -> tuple[CoalescedWrites, list[dict[str, Any]]]:
    """Coalesced writes of one job, and the list of patches they write."""
    written: list[dict[str, Any]] = []

    async def write(key: Any, patch: Mapping[str, Any]) -> None:
        written.append(dict(patch))

    return CoalescedWrites(write, interval=interval), written


def test_the_status_read_with_records_not_written_yet():
    """What the reconciler decides from: the pending records on the status, maps they replace replaced."""
    status = {"phase": "Running", "progress": {"step": 3, "stage": "training", "metrics": {"val_loss": 0.5, "once": 1.0}}}
    records = {"progress": {"step": 9, "stage": "checkpointing", "metrics": {"val_loss": 0.4}},
               "lastCheckpoint": {"step": 8}}
    assert with_records(status, records) == {
        "phase": "Running",
        "progress": {"step": 9, "stage": "checkpointing", "metrics": {"val_loss": 0.4}},
        "lastCheckpoint": {"step": 8},
    }
    assert status["progress"]["step"] == 3  # the status read is left as it is


async def test_records_a_status_write_carried_are_not_written_again():
    """The reconciler's own status write takes the pending records along; what came after it is still written."""
    key = ("team-a", "resnet")
    writes, written = _recorded_writes(interval=0.2)
    writes.add(key, {"progress": {"step": 1}})
    carried = writes.pending(key)
    writes.written(key, carried)  # the reconciler's write carried step 1
    while writes._flushing:
        await asyncio.sleep(0.05)
    assert written == []

    writes.add(key, {"progress": {"step": 3}})
    carried = writes.pending(key)
    writes.add(key, {"progress": {"step": 4}})  # arrives while the reconciler writes
    writes.written(key, carried)
    while writes._flushing:
        await asyncio.sleep(0.05)
    assert written == [{"progress": {"step": 4}}]


async def test_a_gangs_first_training_batch_is_news_for_the_reconciler_with_what_came_before():
    """What a user watching a start or a restart waits for does not wait for the interval: the reconcile each record
    starts writes it at once (`news`), with its own changes; the pre-flight and the sanity check before it wait, and
    go with it."""
    key = ("team-a", "resnet")
    writes, written = _recorded_writes(interval=60.0)
    carried = []
    for patch in ({"preflight": {"ranks": 2}},
                  {"progress": {"gangGeneration": 0, "stage": "training", "step": 0}},
                  {"progress": {"gangGeneration": 0, "batches": 1, "stage": "validating"}},  # the sanity check's
                  {"progress": {"gangGeneration": 0, "batches": 2, "stage": "training", "step": 1}},
                  {"progress": {"gangGeneration": 0, "batches": 3, "step": 2}},
                  {"progress": {"gangGeneration": 1, "batches": 0, "step": 1}},
                  {"progress": {"gangGeneration": 1, "batches": 1, "stage": "training", "step": 2}}):
        writes.add(key, patch)
        if writes.news(key):  # as the reconciler's status write does
            carried.append(writes.pending(key))
            writes.written(key, carried[-1])
        for _ in range(5):
            await asyncio.sleep(0)
    # Step 2 and the next gang's first record wait for the interval, and go with its first batch.
    assert [(w["progress"]["gangGeneration"], w["progress"].get("step")) for w in carried] == [(0, 1), (1, 2)]
    assert carried[0]["preflight"] == {"ranks": 2}
    assert written == []  # nothing left for the interval's write
    await writes.stop()


async def test_a_gang_written_training_is_not_news_again_after_a_checkpoint():
    """A write that caught the gang checkpointing does not make its next training batch a first one."""
    key = ("team-a", "resnet")
    writes, written = _recorded_writes(interval=60.0)
    for patch in ({"progress": {"gangGeneration": 0, "batches": 2, "stage": "training", "step": 1}},
                  {"progress": {"gangGeneration": 0, "batches": 9, "stage": "checkpointing", "step": 8}}):
        writes.add(key, patch)
        writes.written(key, writes.pending(key))  # each carried by a status write of the reconciler's
    writes.add(key, {"progress": {"gangGeneration": 0, "batches": 10, "stage": "training", "step": 9}})
    for _ in range(5):
        await asyncio.sleep(0)
    assert written == []  # step 9 waits for the interval
    await writes.stop()
