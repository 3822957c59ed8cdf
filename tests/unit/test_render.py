"""The pure renderers: spec in, Kubernetes objects out, compared with the objects we expect and
validated against the real Kubernetes schemas (kubernetes-validate, strict). The engine Job's
build-engine flags: test_render_engine_command.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from dtrain_operator.api import contract
from dtrain_operator.core import engine_job, launch_env, network_policy, pod_groups, render
from dtrain_operator.core.child_names import VOLCANO_GROUP_ANNOTATION
from tests.builders import a_job

MNIST = a_job("mnist").in_namespace("ml")
"""The job rendered here: every spec field at its default unless a test says otherwise."""


def labels(role: str, **extra: str) -> dict[str, str]:
    return {contract.LABEL_JOB_NAME: "mnist", contract.LABEL_ROLE: role, "app.kubernetes.io/name": "dtrain",
            "app.kubernetes.io/managed-by": "dtrain-operator", **extra}


def test_service_is_headless_and_publishes_unready_pods():
    assert render.render_service(MNIST.with_spec(masterPort=29600).as_model()) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "mnist", "namespace": "ml", "labels": labels("worker")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {contract.LABEL_JOB_NAME: "mnist", contract.LABEL_ROLE: "worker"},
            "ports": [{"name": "rendezvous", "port": 29600, "protocol": "TCP"}],
        },
    }


def mounted_trainer_files(pod: dict[str, Any]) -> dict[str, str]:
    """What the kubelet writes into the pod's config volume: each downward API item's annotation, at its path."""
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME]
    annotations = pod["metadata"]["annotations"]
    files = {}
    for item in volume["downwardAPI"]["items"]:
        key = item["fieldRef"]["fieldPath"].removeprefix("metadata.annotations['").removesuffix("']")
        files[item["path"]] = annotations[key]
    mount = {"name": contract.CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT_DIR, "readOnly": True}
    assert mount in pod["spec"]["containers"][0]["volumeMounts"]
    return files


def test_each_worker_pod_carries_the_resolved_trainer_config():
    job = MNIST.with_nodes(3).with_devices(2).with_spec(trainer={"batchSize": 8}).as_model()
    pods = [render.render_worker_pod(job, rank, generation) for rank, generation in ((0, 0), (2, 0), (1, 3))]
    files = mounted_trainer_files(pods[0])
    assert [mounted_trainer_files(pod) for pod in pods[1:]] == [files, files]  # every rank, every gang alike
    assert files == render.trainer_files(job) and set(files) == {contract.CONFIG_FILE_NAME}
    config = yaml.safe_load(files["config.yaml"])
    assert config["jobName"] == "mnist" and "nodes" not in config  # the gang's shape: torchrun's PET_* only
    assert config["trainer"]["batchSize"] == 8
    assert set(config) >= {"model", "data", "trainer", "checkpoint", "export", "artifacts", "nccl"}


BASE_ENV = [
    {"name": "PET_NNODES", "value": "3"},
    {"name": "PET_NPROC_PER_NODE", "value": "2"},
    {"name": "PET_NODE_RANK", "value": "2"},
    {"name": "PET_MASTER_ADDR", "value": "mnist-0.mnist.ml.svc"},
    {"name": "PET_MASTER_PORT", "value": "29500"},
    {"name": "PET_SHUTDOWN_TIMEOUT", "value": "590"},
    {"name": "DTRAIN_CONFIG", "value": "/etc/dtrain/config.yaml"},
    {"name": "DTRAIN_JOB_NAME", "value": "mnist"},
    {"name": "DTRAIN_JOB_NAMESPACE", "value": "ml"},
    {"name": "DTRAIN_POD_NAME", "value": "mnist-2"},
    {"name": "DTRAIN_PROGRESS_SINK", "value": "stdout"},
]
NODE_NAME = {"name": "DTRAIN_NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}
GANG_GENERATION = {"name": "DTRAIN_GANG_GENERATION", "value": "0"}  # the supervisor's first launch
# A GPU job's flight recorder: NCCL's last collectives, dumped at a hang and at a collective timeout (this
# job's artifacts are on object storage: NCCL's own timeout dump, which writes files, has no place there).
FLIGHT_RECORDER = [{"name": "TORCH_FR_BUFFER_SIZE", "value": "2000"}, {"name": "TORCH_NCCL_DUMP_ON_TIMEOUT", "value": "1"}]


@pytest.mark.parametrize(
    "spec,nccl,users",
    [
        ({}, [], []),
        ({"nccl": {"ibDisable": False, "socketIfname": "^lo,docker"}},
         [{"name": "NCCL_IB_DISABLE", "value": "0"}, {"name": "NCCL_SOCKET_IFNAME", "value": "^lo,docker"}], []),
        ({"nccl": {"debug": "WARN", "env": {"NCCL_ALGO": "Ring"}},
          "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]},
         [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_ALGO", "value": "Ring"}],
         [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]),
    ],
)
def test_worker_env_is_the_launch_environment_then_the_node_then_the_users(spec, nccl, users):
    job = MNIST.with_nodes(3).with_devices(2).with_spec(**spec).as_model()
    assert render.worker_env(job, rank=2) == BASE_ENV + FLIGHT_RECORDER + nccl + [GANG_GENERATION, NODE_NAME] + users


def test_the_flight_recorder_is_on_for_gpu_jobs_dumping_under_artifacts_where_that_is_a_path():
    def recorder(**spec: Any) -> dict[str, str]:
        env = launch_env.launch_env(MNIST.with_spec(**spec).as_model(), 0, launch_env.pod_site(MNIST.as_model()))
        return {k: v for k, v in env.items() if k.startswith("TORCH_")}

    assert recorder() == {item["name"]: item["value"] for item in FLIGHT_RECORDER}
    assert recorder(artifacts={"dir": "/shared/art/"}) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/shared/art/hangs/nccl-timeout-rank-",
    }
    assert recorder(nccl={"env": {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}})["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert recorder(accelerator="cpu") == {}


def pod_spec_of(**spec: Any) -> dict[str, Any]:
    return render.render_worker_pod(MNIST.with_spec(**spec).as_model(), rank=1, gang_generation=4)["spec"]


@pytest.mark.parametrize(
    "spec,check",
    [
        ({"accelerator": "gpu", "devicesPerNode": 4},
         lambda p: p["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 4}}),
        ({"accelerator": "gpu", "resources": {"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "64Gi"}}},
         lambda p: p["containers"][0]["resources"]
         == {"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "64Gi", "nvidia.com/gpu": 1}}),
        ({"accelerator": "cpu"}, lambda p: "resources" not in p["containers"][0]),
        ({"storage": {"claimName": "shared"}},
         lambda p: {"name": "dtrain-storage", "persistentVolumeClaim": {"claimName": "shared"}} in p["volumes"]
         and {"name": "dtrain-storage", "mountPath": "/workspace"} in p["containers"][0]["volumeMounts"]),
        ({"scheduling": {"nodeSelector": {"gpu": "h100"}, "priorityClassName": "high",
                         "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
         lambda p: (p["nodeSelector"], p["priorityClassName"], p["tolerations"][0]["key"]) == ({"gpu": "h100"}, "high", "gpu")),
        ({"hostNetwork": True}, lambda p: (p["hostNetwork"], p["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")),
        ({"imagePullSecrets": [{"name": "regcred"}]}, lambda p: p["imagePullSecrets"] == [{"name": "regcred"}]),
        ({}, lambda p: (p["hostname"], p["subdomain"], p["restartPolicy"]) == ("mnist-1", "mnist", "Never")),
        ({}, lambda p: {"name": "dshm", "emptyDir": {"medium": "Memory"}} in p["volumes"]),
        ({}, lambda p: p["securityContext"]["runAsNonRoot"] is True
         and p["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False),
        ({}, lambda p: p["containers"][0]["terminationMessagePath"] == "/dev/termination-log"),
        ({}, lambda p: p["terminationGracePeriodSeconds"] == 600),
        ({"terminationGracePeriodSeconds": 1800}, lambda p: p["terminationGracePeriodSeconds"] == 1800
         and {"name": "PET_SHUTDOWN_TIMEOUT", "value": "1790"} in p["containers"][0]["env"]),
        ({"terminationGracePeriodSeconds": 15}, lambda p: p["terminationGracePeriodSeconds"] == 15
         and {"name": "PET_SHUTDOWN_TIMEOUT", "value": "10"} in p["containers"][0]["env"]),
    ],
    ids=["gpus", "gpus-with-resources", "cpu", "storage", "scheduling", "host-network", "pull-secrets", "dns",
         "shm", "non-root", "termination-log", "grace-default", "grace-long", "grace-short"],
)
def test_worker_pod_spec(spec, check):
    assert check(pod_spec_of(**spec))


def test_worker_pod_labels_name_and_gang_generation():
    pod = render.render_worker_pod(MNIST.as_model(), rank=1, gang_generation=4)
    assert set(pod["metadata"]["annotations"]) == {contract.TRAINER_FILE_ANNOTATIONS[contract.CONFIG_FILE_NAME]}
    assert {key: value for key, value in pod["metadata"].items() if key != "annotations"} == {
        "name": "mnist-1",
        "namespace": "ml",
        "labels": labels("worker", **{contract.LABEL_NODE_RANK: "1", contract.LABEL_GANG_GENERATION: "4"}),
    }


@pytest.mark.parametrize(
    "scheduler,kind_api,where",
    [
        ("volcano", "scheduling.volcano.sh/v1beta1", ("annotations", "scheduling.k8s.io/group-name")),
        ("scheduler-plugins-scheduler", "scheduling.x-k8s.io/v1alpha1", ("labels", "scheduling.x-k8s.io/pod-group")),
    ],
)
def test_gang_scheduling_pod_group_and_membership(scheduler, kind_api, where):
    spec = {"nodes": 4, "scheduling": {"schedulerName": scheduler, "gang": {"enabled": True, "minAvailable": 3}}}
    group = pod_groups.render_pod_group(MNIST.with_spec(**spec).as_model())
    assert (group["apiVersion"], group["kind"], group["metadata"]["name"]) == (kind_api, "PodGroup", "mnist")
    assert group["spec"]["minMember"] == 3
    pod = render.render_worker_pod(MNIST.with_spec(**spec).as_model(), rank=0)
    assert pod["metadata"][where[0]][where[1]] == "mnist"
    assert pod["spec"]["schedulerName"] == scheduler


@pytest.mark.parametrize(
    "provider,scheduler,kind_api",
    [
        ("volcano", "volcano-custom", "scheduling.volcano.sh/v1beta1"),
        ("scheduler-plugins", "volcano", "scheduling.x-k8s.io/v1alpha1"),
        ("kubernetes", None, "scheduling.k8s.io/v1alpha2"),
    ],
)
def test_gang_provider_wins_over_the_scheduler_name(provider, scheduler, kind_api):
    scheduling = {"gang": {"enabled": True, "provider": provider}, **({"schedulerName": scheduler} if scheduler else {})}
    group = pod_groups.render_pod_group(MNIST.with_spec(scheduling=scheduling).as_model())
    assert group["apiVersion"] == kind_api


def test_kubernetes_gang_scheduling_needs_no_scheduler():
    """provider kubernetes: the default scheduler's own PodGroup (1.36), named by the pods' schedulingGroup;
    no scheduler name, no Volcano annotation, no coscheduling label."""
    gang = {"enabled": True, "provider": "kubernetes", "minAvailable": 3}
    job = MNIST.with_nodes(4).with_spec(scheduling={"gang": gang}).as_model()
    assert pod_groups.render_pod_group(job) == {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "mnist", "namespace": "ml", "labels": labels("worker")},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
    }
    pod = render.render_worker_pod(job, rank=2, gang_generation=1)
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "mnist"}
    assert "schedulerName" not in pod["spec"] and VOLCANO_GROUP_ANNOTATION not in pod["metadata"]["annotations"]
    assert pod["metadata"]["labels"] == labels(
        "worker", **{contract.LABEL_NODE_RANK: "2", contract.LABEL_GANG_GENERATION: "1"}
    )
    every = pod_groups.render_pod_group(MNIST.with_nodes(4).with_native_gang_scheduling().as_model())
    assert every["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
    # The engine Job's pod comes after the gang and is no member of it.
    assert "schedulingGroup" not in engine_job.render_engine_job(job)["spec"]["template"]["spec"]


def test_topology_keeps_the_gang_in_one_domain():
    """scheduling.topology.required: a required pod-affinity term on this gang generation's own workers,
    added to the job's own affinity; the engine Job's pod is free to go anywhere."""
    own_affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}]},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}
    scheduling = {"topology": {"required": "topology.kubernetes.io/zone"}, "affinity": own_affinity,
                  "gang": {"enabled": True, "provider": "kubernetes"}}
    job = MNIST.with_nodes(3).with_engine().with_spec(scheduling=scheduling).as_model()
    affinity = render.render_worker_pod(job, rank=1, gang_generation=2)["spec"]["affinity"]
    assert affinity["nodeAffinity"] == own_affinity["nodeAffinity"]
    assert affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        own_affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0],
        {"labelSelector": {"matchLabels": {contract.LABEL_JOB_NAME: "mnist", contract.LABEL_GANG_GENERATION: "2"}},
         "topologyKey": "topology.kubernetes.io/zone"},
    ]
    assert engine_job.render_engine_job(job)["spec"]["template"]["spec"]["affinity"] == own_affinity
    assert job.spec.scheduling.affinity == own_affinity  # the spec itself is untouched
    for child in render.render_children(job, gang_generation=2):
        kubernetes_validate.validate(child, "1.36", strict=True)
    plain = MNIST.with_spec(scheduling={"topology": {"required": "rack"}}).as_model()
    assert render.render_worker_pod(plain, 0)["spec"]["affinity"] == {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {
            contract.LABEL_JOB_NAME: "mnist", contract.LABEL_GANG_GENERATION: "0"}}, "topologyKey": "rack"}]}}


def test_no_pod_group_without_gang_scheduling():
    assert pod_groups.render_pod_group(MNIST.as_model()) is None
    provider_alone = MNIST.with_spec(scheduling={"gang": {"provider": "kubernetes"}}).as_model()
    assert pod_groups.render_pod_group(provider_alone) is None
    assert "schedulingGroup" not in render.render_worker_pod(provider_alone, 0)["spec"]


def test_engine_job():
    batches = {"precision": "fp16", "maxBatch": 16, "optBatch": 8}
    engine = engine_job.render_engine_job(MNIST.with_spec(engine=batches).as_model())
    assert engine["metadata"] == {"name": "mnist-engine", "namespace": "ml", "labels": labels("engine")}
    assert engine["spec"]["backoffLimit"] == 1
    assert engine["spec"]["template"]["metadata"] == {"labels": labels("engine")}
    pod = engine["spec"]["template"]["spec"]
    assert (pod["restartPolicy"], pod["automountServiceAccountToken"]) == ("Never", False)
    (container,) = pod["containers"]
    assert container["command"] == [
        "dtrain", "build-engine", "--onnx", "s3://dtrain-test/jobs/ml/mnist/artifacts/model.onnx",
        "--out", "s3://dtrain-test/jobs/ml/mnist/artifacts/model.plan",
        "--timing-cache", "s3://dtrain-test/jobs/ml/mnist/artifacts/timing.cache",
        "--report", "s3://dtrain-test/jobs/ml/mnist/artifacts/engine-report.json",
        "--min-batch", "1", "--opt-batch", "8", "--max-batch", "16",
    ]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    custom_resources = {"resources": {"limits": {"nvidia.com/gpu": 2, "memory": "32Gi"}}}
    custom = engine_job.render_engine_job(MNIST.with_spec(engine=custom_resources).as_model())
    assert custom["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": 2, "memory": "32Gi"}
    }


def test_children_in_creation_order():
    everything = MNIST.with_nodes(2).with_engine().with_gang_scheduling("volcano").as_model()
    kinds = [c["kind"] for c in render.render_children(everything)]
    assert kinds == ["Service", "PodGroup", "Pod", "Pod", "Job"]
    assert [c["kind"] for c in render.render_children(MNIST.with_nodes(1).without_engine().as_model())] == [
        "Service", "Pod"
    ]


FULL_SPEC = {
    "nodes": 2,
    "devicesPerNode": 2,
    "accelerator": "gpu",
    "resources": {"requests": {"cpu": 4, "memory": "16Gi"}},
    "env": [{"name": "WANDB_MODE", "value": "offline"}],
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
    "storage": {"claimName": "shared"},
    "imagePullSecrets": [{"name": "regcred"}],
    "nccl": {"ibDisable": True},
    "scheduling": {"schedulerName": "volcano", "gang": {"enabled": True},
                   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}},
}


@pytest.mark.parametrize("version", ["1.33", "1.35"])
def test_rendered_objects_are_valid_kubernetes(version):
    for child in render.render_children(MNIST.with_spec(**FULL_SPEC).as_model()):
        if child["kind"] == "PodGroup":
            continue  # not a core API: kubernetes-validate has no schema for it
        kubernetes_validate.validate(child, version, strict=True)


def test_kubernetes_gang_objects_are_valid_kubernetes_1_36():
    """Kubernetes' own PodGroup and the pods' schedulingGroup, against 1.36's schemas (the first with them)."""
    full = {**FULL_SPEC, "scheduling": {**FULL_SPEC["scheduling"], "gang": {"enabled": True, "provider": "kubernetes"}}}
    children = render.render_children(MNIST.with_spec(**full).as_model())
    assert {(c["apiVersion"], c["kind"]) for c in children} >= {("scheduling.k8s.io/v1alpha2", "PodGroup"), ("v1", "Pod")}
    for child in children:
        kubernetes_validate.validate(child, "1.36", strict=True)


REPORT = launch_env.ReportEndpoint("https://dtrain-operator.dtrain-system.svc:8443", "-----BEGIN CERTIFICATE-----\n...")


def test_no_pod_holds_an_api_token_and_each_one_for_the_operator():
    """No worker can call the Kubernetes API; each holds a token for the operator's audience (rank 0 sends its
    records with it, every pod's supervisor its launch), and the operator's URL and CA; without an endpoint
    (`dtrain run`), records go to the log and the supervisor is the launcher."""
    three = MNIST.with_nodes(3).as_model()
    pods = [render.render_worker_pod(three, rank, 0, REPORT)["spec"] for rank in range(3)]
    assert [pod["automountServiceAccountToken"] for pod in pods] == [False, False, False]
    projected = [v for pod in pods for v in pod["volumes"] if "projected" in v]
    assert projected == 3 * [{"name": contract.OPERATOR_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
        "audience": "dtrain.dev/operator", "expirationSeconds": 3600, "path": "token"}}]}}]
    mount = {"name": contract.OPERATOR_TOKEN_VOLUME, "mountPath": contract.OPERATOR_TOKEN_DIR, "readOnly": True}
    assert [mount in pod["containers"][0]["volumeMounts"] for pod in pods] == [True, True, True]
    assert [pod["containers"][0]["command"] for pod in pods] == 3 * [render.POD_COMMAND]
    generation = render.render_worker_pod(three, 1, 4, REPORT)["spec"]["containers"][0]["env"]
    assert {"name": contract.ENV_GANG_GENERATION, "value": "4"} in generation
    env = {var["name"]: var.get("value") for var in pods[0]["containers"][0]["env"]}
    assert (env[contract.ENV_PROGRESS_SINK], env[contract.ENV_OPERATOR_URL]) == ("operator", REPORT.url)
    assert mounted_trainer_files(render.render_worker_pod(three, 2, 0, REPORT))[contract.OPERATOR_CA_FILE_NAME] == REPORT.ca_pem
    alone = render.render_worker_pod(three, 0)
    assert all("projected" not in v for v in alone["spec"]["volumes"])
    assert contract.ENV_OPERATOR_URL not in {var["name"] for var in alone["spec"]["containers"][0]["env"]}
    assert contract.OPERATOR_CA_FILE_NAME not in mounted_trainer_files(alone)


@pytest.mark.parametrize("version", ["1.33", "1.35"])
def test_reporting_pods_are_valid_kubernetes(version):
    for child in render.render_children(MNIST.with_nodes(2).as_model(), 0, REPORT):
        kubernetes_validate.validate(child, version, strict=True)


def test_worker_and_engine_pods_run_as_the_trainer_images_user():
    """Stated in the pod, so that the kubelet need not read the image's USER (a root-based image
    otherwise fails with CreateContainerConfigError after its pull)."""
    spec = MNIST.with_engine().on_cpu().as_model()
    pods = [render.render_worker_pod(spec, 0, 0)["spec"], engine_job.render_engine_job(spec)["spec"]["template"]["spec"]]
    for pod in pods:
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (contract.WORKLOAD_UID, contract.WORKLOAD_GID) == (10001, 0)
        assert context["runAsNonRoot"] is True


@pytest.mark.parametrize("version", ["1.33", "1.35"])
def test_network_policy_is_valid_kubernetes_and_admits_only_the_jobs_pods(version):
    policy = network_policy.render_network_policy(a_job("fenced").in_namespace("ml").as_model())
    kubernetes_validate.validate(policy, version, strict=True)
    own = {contract.LABEL_JOB_NAME: "fenced"}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": own}}]}]
    worker = render.render_worker_pod(a_job("fenced").in_namespace("ml").as_model(), 0, 0)
    assert own.items() <= worker["metadata"]["labels"].items()
