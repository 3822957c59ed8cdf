"""bench/anchors.py's workloads (bench/anchor_jobs.py): each anchor runs dtrain's own worker, less what the anchor provides."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from bench import anchor_jobs, anchor_watch, anchors
from dtrain_operator.api import contract
from dtrain_operator.api.records import Event


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


def test_the_workload_is_dtrains_worker_without_the_gang_variables_its_records_on_the_claim() -> None:
    workload = anchor_jobs.Workload.of("anchors-x")
    env = _env(workload.container)
    assert not anchor_jobs.PET_VARIABLES & env.keys()  # the anchor sets torchrun's gang variables
    assert contract.ENV_SHUTDOWN_TIMEOUT not in env and "terminationGracePeriodSeconds" not in workload.pod_spec
    assert env[contract.ENV_PROGRESS_SINK] == f"{contract.PROGRESS_SINK_JSONL_PREFIX}/workspace/anchors/anchors-x/records.jsonl"
    assert env[contract.ENV_POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert workload.records == anchor_jobs.claim_path("/workspace/anchors/anchors-x/records.jsonl")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in workload.pod_spec["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [anchor_jobs.CLAIM]
    (config,) = [v["configMap"]["name"] for v in workload.pod_spec["volumes"] if "configMap" in v]
    assert config == workload.config_map["metadata"]["name"]
    assert workload.pod_spec["securityContext"]["runAsNonRoot"] is True


def test_jobset_gives_torchrun_the_completion_index_and_the_index_0_pod_as_master() -> None:
    config_map, jobset = anchor_jobs.jobset_objects(anchor_jobs.Workload.of("js"))
    assert config_map["kind"] == "ConfigMap"
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": anchor_jobs.MAX_RESTARTS}
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["completionMode"], job["parallelism"], job["completions"], job["backoffLimit"]) == ("Indexed", 2, 2, 0)
    env = _env(job["template"]["spec"]["containers"][0])
    assert env[contract.ENV_MASTER_ADDR] == "js-node-0-0.js"
    assert env[contract.ENV_NODE_RANK] == {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_trainjob_and_pytorchjob_leave_the_gang_variables_to_their_controllers() -> None:
    workload = anchor_jobs.Workload.of("tj")
    _, runtime, train_job = anchor_jobs.trainjob_objects(workload)
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "torch": {}}
    assert train_job["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 1}
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": anchor_jobs.MAX_RESTARTS}
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"  # Trainer's trainer container
    assert train_job["spec"]["runtimeRef"]["name"] == "tj"
    _, pytorch_job = anchor_jobs.pytorchjob_objects(workload)
    replicas = pytorch_job["spec"]["pytorchReplicaSpecs"]
    assert {k: (v["replicas"], v["restartPolicy"]) for k, v in replicas.items()} == {
        "Master": (1, "OnFailure"), "Worker": (1, "OnFailure")}
    assert pytorch_job["spec"]["runPolicy"]["backoffLimit"] == anchor_jobs.MAX_RESTARTS
    for spec in (node["template"]["spec"]["template"]["spec"], replicas["Worker"]["template"]["spec"]):
        assert not anchor_jobs.PET_VARIABLES & _env(spec["containers"][0]).keys()


def test_the_table_says_what_happened_where_a_system_did_not_recover() -> None:
    results = {
        "dtrain": {"system": "dtrain", "version": "0.1.0", "create_to_first_step_s": 20.0,
                   "worker_killed": {"training_again_s": 9.5, "steps_lost": 2}, "hang": {"restarted_s": 41.0}},
        "jobset": {"system": "JobSet", "version": "v0.12.0", "create_to_first_step_s": 21.0,
                   "worker_killed": {"training_again_s": None, "what_happened": "no restart within 600 s"},
                   "hang": {"restarted_s": None}},
    }
    table = anchors.table(results, 900)
    assert "| worker killed → training again (s) | 9.5 | no restart within 600 s |" in table
    assert "| rank hung → gang restarted (s; cap 900) | 41 | not within 900 s |" in table


def test_dtrains_restarts_are_read_from_rank_0s_log_in_place_restarts_too() -> None:
    """The trainer's start line of every gang (a recreate's new pod, or an in-place restart in the same one; not the
    supervisor's, which comes before the trainer's imports) and its resume: at kubectl's timestamps where the kubelet
    keeps them, else when first read."""
    lines = [
        "2026-12-06T16:00:00.05Z dtrain supervisor: starting torchrun for gang generation 0",
        "2026-12-06T16:00:00.100000000Z dtrain: training llm: 2 node(s) x 1 cpu process(es), precision 32-true",
        "2026-12-06T16:00:09.5Z INFO step 40 loss 0.3",
        "2026-12-06T16:00:20.25Z dtrain supervisor: stopping torchrun (restart in place)",
        "2026-12-06T16:00:20.5Z dtrain supervisor: starting torchrun for gang generation 1",
        "2026-12-06T16:00:21.000000001Z dtrain: training llm: 2 node(s) x 1 cpu process(es), precision 32-true",
        "2026-12-06T16:00:30Z 2026-12-06 16:00:29,998 dtrain[rank 0] INFO resumed from s3://b/ckpt/last.ckpt at step 40",
        "  a wrapped line",
    ]
    t0 = anchor_watch.timestamp("2026-12-06T16:00:00Z")
    starts, resumes = anchor_watch.dtrain_log_events(lines, seen_at=t0 + 99)
    assert [round(s - t0, 2) for s in starts] == [0.1, 21.0]
    assert [(round(t - t0, 2), step) for t, step in resumes] == [(30.0, 40)]
    # make cluster's kubelet keeps no times: the lines are stamped when read, a Python log line's own date ignored.
    unstamped = [line.partition(" ")[2] for line in lines]
    assert anchor_watch.dtrain_log_events(unstamped, seen_at=t0 + 99.7) == ([t0 + 99, t0 + 99], [(t0 + 99, 40)])


def test_a_restarted_gangs_first_step_may_fall_in_the_second_of_its_start(tmp_path: Path) -> None:
    """The trainers stamp their records to the second: a step in the same second as a start is after it."""
    records = tmp_path / "records.jsonl"
    lines = [
        {"event": Event.PROGRESS, "time": "2026-12-06T16:00:05Z", "step": 20},
        {"event": Event.START, "time": "2026-12-06T16:00:21Z"},
        {"event": Event.PROGRESS, "time": "2026-12-06T16:00:21Z", "step": 21},
    ]
    records.write_text("".join(json.dumps({**line, "event": line["event"].value}) + "\n" for line in lines))
    progress = anchor_watch.Progress(anchor_jobs.systems()["jobset"], "anchors-jobset", records)
    t0 = anchor_watch.timestamp("2026-12-06T16:00:00Z")
    restarted = progress.start_after(t0 + 10, timeout=1)
    assert restarted == t0 + 21
    assert progress.first_step_after(restarted, timeout=1) == (t0 + 21, 21)


def test_the_controllers_requests_are_counted_by_verb_and_resource() -> None:
    dtrain = anchor_jobs.systems()["dtrain"]
    user = f"{dtrain.controller_users[0]}x"
    status = {"verb": "patch", "objectRef": {"resource": "distributedtrainings", "subresource": "status"},
              "requestURI": "/apis/dtrain.dev/v1alpha1/namespaces/bench/distributedtrainings/j/status"}
    dry = {"verb": "create", "objectRef": {"resource": "pods"}, "requestURI": "/api/v1/namespaces/bench/pods?dryRun=All"}
    assert anchor_watch.request_name(status) == "patch distributedtrainings/status"
    assert anchor_watch.request_name(dry) == "create pods (dry run)"
    counted = Counter({(user, "patch distributedtrainings/status"): 3, (user, "create pods (dry run)"): 2,
                       ("system:kube-scheduler", "create pods/binding"): 2})
    summary = anchors.api_summary(dtrain, counted)
    assert (summary["controller"], summary["kubernetes_controllers"]) == (5, 2)
    assert summary["controller_requests"] == {"patch distributedtrainings/status": 3, "create pods (dry run)": 2}
