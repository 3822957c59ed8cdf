"""Gang scheduling on GPU nodes: Kubernetes' own and scheduler-plugins' coscheduling, a gang that waits
whole until a node joins, two gangs that do not deadlock, a gang in one rack."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from localcluster import processes, schedulers

from dtrain_operator.core.child_names import COSCHEDULING_GROUP_LABEL

from ..kube import (
    Failed,
    apply,
    eventually,
    get,
    items,
    kubectl,
    localcluster,
    status,
    worker_pods,
)
from .common import (
    E2E_GPUS_PER_NODE,
    E2E_NODES,
    GPU,
    NS,
    SMALL_JOB,
    Figures,
    condition,
    delete,
    e2e_cluster_arguments,
    events,
    finished,
    running_gang,
    small_job,
)

GANG_NODES = E2E_NODES + 1
# A few epochs of the small job: the scenario is about placement, not training.
GANG_EPOCHS = 3
PENDING_SECONDS = 5
UNBOUND_SECONDS = 20


def gpu_job(name: str, **spec: Any) -> dict[str, Any]:
    """The small job on one more node than the cluster has, each worker on one nvidia.com/gpu.

    The nodes' GPUs are a count the scheduler places by, with no device behind it: each trainer sees no
    CUDA device and trains on the CPU (gloo) with one warning, as `dtrain run` does without CUDA."""
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": GANG_EPOCHS}
    return small_job(name, nodes=GANG_NODES, accelerator="gpu", devicesPerNode=1, trainer=trainer,
                     terminationGracePeriodSeconds=15, **spec)


def node_gpus() -> dict[str, str]:
    """Each node's allocatable nvidia.com/gpu count."""
    return {n["metadata"]["name"]: str((n.get("status", {}).get("allocatable") or {}).get(GPU, "0"))
            for n in items("nodes")}


def bound(name: str) -> dict[str, str]:
    """The job's worker pods that the scheduler bound, with their node."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in worker_pods(name) if p["spec"].get("nodeName")}


def scheduler_messages(name: str) -> dict[str, str]:
    """Each worker pod's PodScheduled condition, as the scheduler wrote it."""
    return {p["metadata"]["name"]: next((f"{c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                                         for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"),
                                        "no PodScheduled condition") for p in worker_pods(name)}


@dataclass(frozen=True)
class GangProvider:
    """What differs between the gang scenarios' providers: the job's spec.scheduling, the PodGroup's
    resource, how a worker names its PodGroup, and what the scheduler's messages say of the gang."""

    label: str
    scheduling: dict[str, Any]
    pod_groups: str
    group_of: Callable[[dict[str, Any]], str | None]
    no_group: str  # why the workers might name no PodGroup
    says_why: Callable[[str], bool]  # the PodsPending condition's message quotes the scheduler on the gang
    # What one of the scheduler's FailedScheduling Events on the workers says (checked when given).
    scheduler_event_says_why: Callable[[str], bool] | None = None


NATIVE_GANG = GangProvider(
    label="Kubernetes' own",
    scheduling={"gang": {"enabled": True, "provider": "kubernetes", "scheduleTimeoutSeconds": PENDING_SECONDS}},
    pod_groups="podgroups.scheduling.k8s.io",
    group_of=lambda p: (p["spec"].get("schedulingGroup") or {}).get("podGroupName"),
    no_group="spec.schedulingGroup dropped by an API server without the GenericWorkload feature gate?",
    says_why=lambda message: "pod group" in message,
)
COSCHEDULING_GANG = GangProvider(
    label="scheduler-plugins' coscheduling",
    scheduling={"schedulerName": schedulers.SCHEDULER_NAME,
                "gang": {"enabled": True, "provider": "scheduler-plugins", "scheduleTimeoutSeconds": PENDING_SECONDS}},
    pod_groups="podgroups.scheduling.x-k8s.io",
    group_of=lambda p: p["metadata"]["labels"].get(COSCHEDULING_GROUP_LABEL),
    no_group="the scheduling.x-k8s.io/pod-group label missing",
    # The pods' conditions end on the plugin's rejection of the gang ("optimistic rejection in PostFilter",
    # "rejection in Unreserve", "PodGroup ... gets rejected"): each placed pod waits at Permit, and all are
    # rejected when one finds no room.
    says_why=lambda message: "rejection in" in message or "gets rejected" in message,
    # The pod that found no room: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. ..., PodGroup
    # default/e2e-cosched gets rejected due to Pod e2e-cosched-3 is unschedulable even after PostFilter".
    scheduler_event_says_why=lambda message: f"Insufficient {GPU}" in message and "gets rejected" in message,
)


def gpu_nodes_or_skip(exactly: int | None = None) -> int | None:
    """The number of nodes when each has E2E_GPUS_PER_NODE nvidia.com/gpu (and `exactly` of them, if given);
    else None, having said why the scenario is skipped."""
    gpus = node_gpus()
    if gpus and set(gpus.values()) == {str(E2E_GPUS_PER_NODE)} and exactly in (None, len(gpus)):
        return len(gpus)
    print(f"needs {exactly or 'nodes'} {'nodes ' if exactly else ''}of {E2E_GPUS_PER_NODE} {GPU} each (python -m "
          f"localcluster up {' '.join(e2e_cluster_arguments())}, as python -m tests.cluster starts it), not {gpus}: "
          "skipped")
    return None


def scenario_gang(figures: Figures) -> None:
    """Kubernetes' own gang scheduling (spec.scheduling.gang.provider: kubernetes, the default scheduler's
    GangScheduling plugin) on 2 nodes of one nvidia.com/gpu each. Without a gang, a job of 3 GPU workers
    gets 2 placed, which wait for the third (NODES 2/3). With one, none is placed, the job's PodsPending
    condition and Warning Event say the pod group is unschedulable; a node joins (python -m localcluster
    join) and the whole gang is placed at once and trains to Succeeded. Then two gangs that each fit alone
    but not together do not deadlock, and a gang that asks for one rack lands in one. Last: it leaves the
    third node."""
    if gpu_nodes_or_skip(exactly=E2E_NODES) is None:
        return
    # Without a gang, the scheduler places pod by pod: two run, and wait for the third at the rendezvous.
    partial = "e2e-nogang"
    apply(gpu_job(partial, scheduling={"gang": {"scheduleTimeoutSeconds": PENDING_SECONDS}}))
    eventually(lambda: len(worker_pods(partial)) == GANG_NODES and len(bound(partial)) == E2E_NODES
               and status(partial).get("nodesReady") == f"{E2E_NODES}/{GANG_NODES}",
               f"{partial}: {E2E_NODES} of {GANG_NODES} workers bound and Running (NODES {E2E_NODES}/{GANG_NODES})", 300)
    counts = status(partial).get("nodes") or {}
    column = kubectl("get", "dtr", partial, "-n", NS, "--no-headers").stdout.split()
    if (counts.get("running"), counts.get("pending"), column[2:3]) != (E2E_NODES, 1, [f"{E2E_NODES}/{GANG_NODES}"]):
        raise Failed(f"{partial}: status.nodes {counts}, kubectl get dtr {column}: expected {E2E_NODES} running, "
                     f"1 pending, NODES {E2E_NODES}/{GANG_NODES}")
    pods = worker_pods(partial)
    (unbound,) = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    try:
        said = eventually(lambda: (c := condition(partial, "PodsPending")).get("status") == "True"
                          and unbound in c["message"] and GPU in c["message"] and c,
                          f"{partial}: the PodsPending condition naming {unbound} and the GPUs it lacks", 60)
    except Failed as exc:
        raise Failed(f"{exc}: the condition {condition(partial, 'PodsPending')}") from None
    print(f"without a gang: {sorted(bound(partial).items())} bound, NODES {column[2]}; {said['message'][:300]}")
    kubectl("delete", "dtr", partial, "-n", NS, "--wait=false")
    eventually(lambda: not worker_pods(partial), f"{partial}: its pods gone (their GPUs free)", 180)

    gang_waits_whole_until_a_node_joins("e2e-gang", NATIVE_GANG, E2E_NODES, figures)
    two_gangs_do_not_deadlock(figures)
    gang_in_one_rack()


def scenario_gang_coscheduling(figures: Figures) -> None:
    """The same all-or-nothing gang through scheduler-plugins' coscheduling scheduler (a second scheduler,
    python -m localcluster up --schedulers coscheduling, which python -m tests.cluster starts for this
    scenario): one GPU worker more than the cluster's nodes (4 after the gang scenario's join, 3 alone),
    none bound, the job says why; a node joins, all bind and it trains to Succeeded. It leaves that node."""
    if not processes.running(schedulers.PROCESS):
        print(f"needs scheduler-plugins' coscheduling scheduler (python -m localcluster up --schedulers coscheduling, "
              f"as python -m tests.cluster starts it for this scenario): {schedulers.PROCESS} does not run: skipped")
        return
    nodes = gpu_nodes_or_skip()
    if nodes is not None:
        gang_waits_whole_until_a_node_joins("e2e-cosched", COSCHEDULING_GANG, nodes, figures)


def none_bound_and_the_job_says_why(name: str, provider: GangProvider, group: str, nodes: int) -> None:
    """A gang one GPU worker larger than the `nodes` waits whole: none of its pods bound, however long one looks,
    and the job's PodsPending condition, a Warning Event (and the scheduler's, where it says why) and NODES 0/N
    say so."""
    size = nodes + 1
    # All or nothing: with one GPU too few, none is bound, however long one looks.
    watched_until = time.monotonic() + UNBOUND_SECONDS
    while time.monotonic() < watched_until:
        if bound(name):
            raise Failed(f"{name}: part of the gang was placed on {nodes} nodes: {bound(name)}")
        time.sleep(1)
    names = [f"{name}-{rank}" for rank in range(size)]
    try:
        said = eventually(lambda: (c := condition(name, "PodsPending")).get("status") == "True"
                          and provider.says_why(c["message"]) and all(n in c["message"] for n in names) and c,
                          f"{name}: the PodsPending condition naming the {size} pods and why", 60)
    except Failed as exc:
        raise Failed(f"{exc}: the condition {condition(name, 'PodsPending')}; the scheduler's "
                     f"{scheduler_messages(name)}") from None
    eventually(lambda: [e for e in events(name, "PodsPending") if e["type"] == "Warning"],
               f"{name}: a Warning Event PodsPending", 60)
    if provider.scheduler_event_says_why is not None:
        told = eventually(lambda: next((e["message"] for e in items("events", NS) if e["reason"] == "FailedScheduling"
                                        and e["involvedObject"].get("name") in names
                                        and provider.scheduler_event_says_why(e["message"])), None),
                          f"{name}: the scheduler's FailedScheduling Event on a worker saying why", 60)
        print(f"the scheduler's Event: {told[:400]}")
    group_status = (get(provider.pod_groups, group, NS) or {}).get("status") or {}
    waiting = kubectl("get", "dtr", name, "-n", NS).stdout
    if f"0/{size}" not in waiting:
        raise Failed(f"{name}: kubectl get dtr while the gang waits:\n{waiting}")
    print(f"{provider.label} gang: none bound for {UNBOUND_SECONDS} s; {said['message'][:600]}; "
          f"PodGroup {group}: {json.dumps(group_status)[:300]}")
    print(f"kubectl get dtr while the gang waits:\n{waiting}")


def gang_waits_whole_until_a_node_joins(name: str, provider: GangProvider, nodes: int, figures: Figures) -> None:
    """A gang of one GPU worker per node and one more: none bound, however long one looks, and the job's
    PodsPending condition, a Warning Event and NODES 0/N say so; then a node joins, the whole gang is
    placed at once, one worker per node, and trains to Succeeded; deleted, its GPUs free."""
    size = nodes + 1
    job = gpu_job(name, scheduling=provider.scheduling)
    job["spec"]["nodes"] = size
    apply(job)
    pods = eventually(lambda: len(found := worker_pods(name)) == size and found, f"{name}: {size} worker pods", 120)
    groups = {provider.group_of(p) for p in pods}
    if len(groups) != 1 or None in groups:
        raise Failed(f"{name}: the workers' PodGroups: {groups} ({provider.no_group})")
    (group,) = groups
    if get(provider.pod_groups, group, NS) is None:
        raise Failed(f"{name}: no {provider.pod_groups} {group}")
    none_bound_and_the_job_says_why(name, provider, group, nodes)

    if localcluster("join") != 0:
        raise Failed("python -m localcluster join failed (above)")
    joined = time.monotonic()
    eventually(lambda: running_gang(name, nodes=size), f"{name}: all {size} workers Running", 300)
    figures[f"node joined → the waiting gang of {size} all Running, {provider.label} (s)"] = time.monotonic() - joined
    placed = set(bound(name).values())
    if len(placed) != size:
        raise Failed(f"{name}: {size} workers of one GPU each on {sorted(placed)}")
    # No CUDA device behind the counted GPU: rank 0 says once that it trains on the CPU.
    eventually(lambda: kubectl("logs", f"{name}-0", "-n", NS, check=False).stdout.count("training on the CPU") == 1,
               f"{name}-0: one warning that it trains on the CPU", 120)
    final = finished(name)
    if final["restarts"] != 0:
        raise Failed(f"{name}: restarts {final['restarts']}, expected 0")
    print(f"after the join: the gang on {sorted(placed)}, Succeeded")
    delete(name)
    eventually(lambda: not worker_pods(name), f"{name}: its pods gone (their GPUs free)", 180)


RACK = "e2e.dtrain.dev/rack"


def gang_in_one_rack() -> None:
    """Nodes labelled into two racks (node-1 alone in rack-a): a gang that asks for one rack
    (scheduling.topology.required) lands in one rack, whichever its first worker is placed in."""
    nodes = sorted(n["metadata"]["name"] for n in items("nodes"))
    racks = {node: "rack-a" if index == 0 else "rack-b" for index, node in enumerate(nodes)}
    for node, rack in racks.items():
        kubectl("label", "node", node, f"{RACK}={rack}", "--overwrite")
    name = "e2e-rack"
    try:
        job = small_job(name, scheduling={"topology": {"required": RACK},
                                          "gang": {"enabled": True, "provider": "kubernetes"}})
        job["spec"]["trainer"]["maxEpochs"] = GANG_EPOCHS
        apply(job)
        eventually(lambda: running_gang(name), f"{name}: both workers Running", 300)
        placed = bound(name)
        if len({racks[node] for node in placed.values()}) != 1:
            raise Failed(f"{name}: the gang spans racks: {placed} ({racks})")
        finished(name)
        print(f"one rack: {name} on {placed}, all in {racks[next(iter(placed.values()))]}")
    finally:
        delete(name)
        for node in racks:
            kubectl("label", "node", node, f"{RACK}-", check=False)


def two_gangs_do_not_deadlock(figures: Figures) -> None:
    """Two gangs of 2 GPU workers on 3 GPUs: each fits alone, not both. Placed pod by pod they could
    hold 1 + 2 or 2 + 1 GPUs and wait for each other for ever; as gangs, one runs whole, the other
    waits whole (no pod bound) and runs when the first is done."""
    gangs = ["e2e-gang-a", "e2e-gang-b"]
    for gang in gangs:
        job = gpu_job(gang, scheduling={"gang": {"enabled": True, "provider": "kubernetes"}})
        job["spec"]["nodes"] = 2
        apply(job)
    first = eventually(lambda: next((g for g in gangs if running_gang(g)), None), "one gang Running whole", 300)
    (second,) = [g for g in gangs if g != first]
    if bound(second):
        raise Failed(f"{second} holds GPUs while {first} runs: {bound(second)}")
    finished(first)
    freed = time.monotonic()
    eventually(lambda: running_gang(second), f"{second}: Running whole once {first} is done", 300)
    figures["gang done → the waiting gang of 2 all Running (s)"] = time.monotonic() - freed
    finished(second)
    print(f"two gangs: {first} ran whole while {second} waited with no pod bound; then {second} ran and Succeeded")
    for gang in gangs:
        delete(gang)
