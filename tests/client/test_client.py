"""The Python client against the test API server (and, where a job must run, the operator as a process).

The client is synchronous, as a notebook wants it; the API server runs on the test's event loop,
so every client call runs in a thread (`call`).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dtrain_operator import api
from dtrain_operator.api import contract
from dtrain_operator.api.validation import validate_object
from dtrain_operator.client import (
    AlreadyExists,
    Client,
    ConnectionFailed,
    DtrainError,
    InvalidJob,
    NoCrdError,
    NotFound,
    PermissionDenied,
    ProgressUpdate,
    WaitTimeout,
)
from tests.builders import a_cpu_job

from ..operator.apiserver import ApiServer
from ..operator.cluster import Cluster
from ..operator.operator_process import write_kubeconfig
from ..ports import free_port
from .jobs import cluster_quickstart

NS = "default"
ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = cluster_quickstart()


async def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(functools.partial(function, *args, **kwargs))


def client_of(cluster: Cluster, **kwargs: Any) -> Client:
    return Client(kubeconfig=cluster.kubeconfig, **kwargs)


async def test_submit_a_file_get_list_and_delete(cluster: Cluster):
    client = client_of(cluster)
    assert client.namespace == NS  # the kubeconfig context's namespace
    created = await call(client.submit, QUICKSTART)
    assert isinstance(created, api.DistributedTraining)
    assert (created.name, created.namespace, created.spec.nodes) == ("quickstart", NS, 2)
    stored = cluster.job(NS, "quickstart")
    assert stored["spec"] == yaml.safe_load(QUICKSTART.read_text())["spec"]  # sent as written, no defaults added

    await cluster.patch_job_status(NS, "quickstart", {"phase": "Running", "nodesReady": "2/2", "restarts": 1,
                                                      "progress": {"epoch": 1, "step": 30, "loss": 0.25}})
    job = await call(client.get, "quickstart")
    assert job.status.phase == "Running" and job.status.nodes_ready == "2/2" and job.status.restarts == 1
    assert job.status.progress.loss == 0.25

    await call(client.submit, a_cpu_job("second").as_dict())
    assert [j.name for j in await call(client.list)] == ["quickstart", "second"]
    with pytest.raises(AlreadyExists, match="already exists in namespace default; delete it first"):
        await call(client.submit, QUICKSTART)

    await call(client.delete, "second", wait=True)
    assert cluster.job(NS, "second") is None
    with pytest.raises(NotFound, match="DistributedTraining second not found in namespace default"):
        await call(client.get, "second")
    with pytest.raises(NotFound):
        await call(client.delete, "second")


async def test_submit_validates_first_with_the_messages_of_dtrain_validate(cluster: Cluster):
    client = client_of(cluster)
    bad = a_cpu_job("bad").with_spec(nodes=0).with_spec(trainer={"maxEpoch": 2}).as_dict()
    expected = [f"job: {line}" for line in validate_object(bad).errors]
    assert len(expected) == 2
    with pytest.raises(InvalidJob) as raised:
        await call(client.submit, bad)
    assert raised.value.errors == expected
    assert "did you mean 'maxEpochs'?" in str(raised.value)
    assert cluster.job(NS, "bad") is None  # nothing was sent

    # A file: the lines name the file, as `dtrain validate FILE` prints them.
    path = cluster.tmp / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InvalidJob, match=f"^{path}: spec.nodes: "):
        await call(client.submit, path)


async def test_namespace_and_context_as_kubectl(cluster: Cluster):
    kubeconfig = cluster.tmp / "two-contexts"
    server = str(cluster.api.url).rstrip("/")
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "dev", "context": {"cluster": "emulator", "user": "me", "namespace": "team-a"}},
                    {"name": "prod", "context": {"cluster": "emulator", "user": "me", "namespace": "team-b"}},
                ],
                "current-context": "dev",
            }
        )
    )
    assert Client(kubeconfig=kubeconfig).namespace == "team-a"
    prod = Client(kubeconfig=kubeconfig, context="prod")
    assert prod.namespace == "team-b"
    await call(prod.submit, a_cpu_job("here").in_namespace("team-b").as_dict())
    await call(prod.submit, {**a_cpu_job("bare").as_dict(), "metadata": {"name": "bare"}})
    assert cluster.job("team-b", "bare") is not None
    explicit = Client(kubeconfig=kubeconfig, namespace="team-c")
    with pytest.raises(Exception, match="names namespace 'team-b' but 'team-c' was asked for; use -n team-b"):
        await call(explicit.submit, a_cpu_job("x").in_namespace("team-b").as_dict())
    assert [j.name for j in await call(explicit.list, all_namespaces=True)] == ["bare", "here"]
    with pytest.raises(ConnectionFailed, match="context 'nope'"):
        Client(kubeconfig=kubeconfig, context="nope")


async def test_wait_for_a_phase_with_a_timeout(cluster: Cluster):
    client = client_of(cluster)
    await call(client.submit, a_cpu_job("slow").as_dict())
    with pytest.raises(WaitTimeout, match="default/slow is not started after 0.3 s, not Running") as raised:
        await call(client.wait, "slow", "Running", timeout=0.3, interval=0.05)
    assert raised.value.job is not None and raised.value.job.name == "slow"

    waiting = asyncio.ensure_future(call(client.wait, "slow", timeout=10, interval=0.05))
    await asyncio.sleep(0.2)
    await cluster.patch_job_status(NS, "slow", {"phase": "Running"})
    await asyncio.sleep(0.2)
    assert not waiting.done()  # Running is not finished
    await cluster.patch_job_status(NS, "slow", {"phase": "Succeeded"})
    job = await waiting
    assert job.status.phase == "Succeeded"
    # A job that finished another way ends the wait for a phase it will never reach.
    assert (await call(client.wait, "slow", "Running", timeout=1)).status.phase == "Succeeded"


async def test_progress_streams_each_change_until_the_job_ends(cluster: Cluster):
    client = client_of(cluster)
    await call(client.submit, a_cpu_job("prog").as_dict())

    updates: list[ProgressUpdate] = []

    def consume() -> None:
        for update in client.progress("prog", interval=0.03, timeout=60):
            updates.append(update)  # noqa: PERF402 - one at a time: the test reads them as they arrive

    consumer = asyncio.ensure_future(call(consume))

    async def seen(what: str, check: Callable[[ProgressUpdate], bool]) -> None:
        await cluster.eventually(lambda: any(check(u) for u in updates), what)

    # The trainer's reports, each once the client has seen the one before (polls may be slow on a busy machine).
    await cluster.patch_job_status(NS, "prog", {"phase": "Running"})
    await seen("Running", lambda u: u.phase == "Running")
    for step in (10, 20, 30):
        await cluster.patch_job_status(NS, "prog", {"progress": {
            "epoch": step // 20, "step": step, "totalSteps": 30, "loss": 1.0 / step, "imagesPerSecond": 100.0,
            "metrics": {"val_acc": step / 31}}})
        await seen(f"step {step}", lambda u, step=step: u.step == step)
    await cluster.patch_job_status(NS, "prog", {"phase": "Succeeded"})
    await asyncio.wait_for(consumer, 30)
    # Each report once, in order; the last comes again with Succeeded.
    assert [(u.phase, u.step) for u in updates if u.step is not None] == [
        ("Running", 10), ("Running", 20), ("Running", 30), ("Succeeded", 30)]
    assert len({u.key() for u in updates}) == len(updates)  # only changes
    last = updates[-1]
    assert last.finished and last.phase == "Succeeded"
    assert (last.total_steps, last.loss, last.images_per_second) == (30, 1.0 / 30, 100.0)
    assert last.metrics == {"val_acc": 30 / 31}
    assert last.line() == "Succeeded  epoch 2  step 30/30  loss 0.03333  100 img/s  val_acc 0.9677"


async def test_logs_of_a_rank_and_following_them_on_a_running_job(cluster: Cluster):
    await cluster.start_operator()
    client = client_of(cluster)
    await call(client.submit, a_cpu_job("logged").with_nodes(2).as_dict())
    await cluster.run_all(NS, "logged", 2)
    logs = cluster.api.pod_logs
    logs.write(NS, "logged-0", "rank 0 starts\nepoch 1 step 10 loss 0.5\n")
    logs.write(NS, "logged-1", "rank 1 starts\n")
    assert await call(client.logs, "logged", rank=1) == "rank 1 starts\n"
    assert await call(client.logs, "logged", tail_lines=1) == "epoch 1 step 10 loss 0.5\n"
    with pytest.raises(NotFound, match="no worker pod of rank 5 .* \\(ranks: 0, 1\\)"):
        await call(client.logs, "logged", rank=5)
    with pytest.raises(NotFound, match="DistributedTraining ghost not found"):
        await call(client.logs, "ghost")

    lines: list[str] = []
    follower = asyncio.ensure_future(call(lambda: lines.extend(client.stream_logs("logged", rank=0))))
    await cluster.eventually(lambda: len(lines) == 2, "the log so far")
    logs.write(NS, "logged-0", "epoch 2 step 20 loss 0.25\npartial")
    await cluster.eventually(lambda: len(lines) == 3, "the line written while following")
    logs.write(NS, "logged-0", " line\n")
    logs.end(NS, "logged-0")
    await cluster.exit(NS, "logged-0", 0)
    await asyncio.wait_for(follower, 10)
    assert lines == ["rank 0 starts", "epoch 1 step 10 loss 0.5", "epoch 2 step 20 loss 0.25", "partial line"]


async def test_no_permission_says_which_verb_and_how_to_check(cluster: Cluster):
    client = client_of(cluster)
    cluster.api.faults.fail(lambda r: r.resource is not None and r.resource.plural == contract.PLURAL,
                            status=403, reason="Forbidden")
    with pytest.raises(PermissionDenied) as raised:
        await call(client.submit, a_cpu_job("nope").as_dict())
    assert "cannot create distributedtrainings in namespace default" in str(raised.value)
    assert "kubectl auth can-i create distributedtrainings -n default" in str(raised.value)
    with pytest.raises(PermissionDenied, match="kubectl auth can-i get distributedtrainings -n default"):
        await call(client.get, "nope")


async def test_no_crd_says_to_install_the_operator(tmp_path: Path):
    import kmock

    async with ApiServer() as server, kmock.Server(server):  # no resources declared: no CRD
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url).rstrip("/"))
        client = Client(kubeconfig=kubeconfig)
        for attempt in (functools.partial(client.submit, a_cpu_job("x").as_dict()),
                        functools.partial(client.get, "x"), client.list):
            with pytest.raises(NoCrdError, match="CRD distributedtrainings.dtrain.dev is not installed.*helm install"):
                await call(attempt)


async def test_no_answer_and_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    client = Client(kubeconfig=kubeconfig)
    with pytest.raises(ConnectionFailed, match="no answer from the API server at http://127.0.0.1"):
        await call(client.get, "x")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConnectionFailed, match="no Kubernetes credentials"):
        Client()


async def test_a_job_from_a_newer_operator_is_a_clear_error(cluster: Cluster):
    await cluster.apply({**a_cpu_job("future").as_dict(), "spec": {"nodes": 1, "quantumAccelerator": True}})
    with pytest.raises(Exception, match="does not fit this dtrain's API model .*quantumAccelerator.*upgrade dtrain") as error:
        await call(client_of(cluster).get, "future")
    # dtrain is not on PyPI: the way to upgrade is from a checkout or a wheel, never `pip install dtrain`.
    assert "pip install -U './[client]'" in str(error.value) and "'dtrain[client]'" not in str(error.value)


def test_without_the_client_extra_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # what `import kubernetes` meets where it is not installed
    with pytest.raises(DtrainError) as error:
        Client()
    assert "pip install './[client]'" in str(error.value) and "'dtrain[client]'" not in str(error.value)


def test_in_a_pod_the_service_account_and_its_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kubernetes.config import incluster_config

    from dtrain_operator.client import credentials as client_module

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (account / "namespace").write_text("team-x\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(account / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(account / "ca.crt"))
    monkeypatch.setattr(client_module, "SERVICE_ACCOUNT_NAMESPACE_FILE", account / "namespace")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    pod = Client()
    assert (pod.namespace, pod.credentials) == ("team-x", "the pod's service account")
    assert pod._api.configuration.host == "https://10.96.0.1:443"
    assert Client(namespace="other").namespace == "other"
