"""An elastic job on GPU nodes: a node lost, training goes on smaller; the node back, it grows again."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract
from tests.trainer.user_code.dtrain_test_user import trained_samples

from ..kube import (
    REPO,
    Failed,
    apply,
    eventually,
    items,
    kubectl,
    localcluster,
    status,
    worker_pods,
)
from .common import (
    CLAIM,
    NS,
    SMALL_JOB,
    Figures,
    checkpoint_step,
    delete,
    events,
    finished,
    progress_step,
    running_gang,
    small_job,
)
from .gang import gpu_nodes_or_skip

# The elastic job: 3 GPU workers, down to 2; a short wait for a pod that cannot be placed. The tests' own model and
# data module (from the shared claim: PYTHONPATH) record every sample id each rank trains; a step is slowed to a
# pace that outlasts a node's loss and return. 192 samples, global batches of 16 x 3: 4 steps an epoch, no sample
# left over, and a step checkpoint at each epoch's end.
ELASTIC_NODES, ELASTIC_MIN_NODES, ELASTIC_WAIT_SECONDS, ELASTIC_EPOCHS = 3, 2, 20, 40
ELASTIC_SAMPLES, ELASTIC_STEP_SECONDS = 192, 0.25
USER_CODE = REPO / "tests" / "trainer" / "user_code" / "dtrain_test_user.py"


def elastic_size(name: str) -> tuple[int | None, str | None, str | None]:
    """status.elastic.nodes, the phase and NODES as the job's status says them."""
    found = status(name)
    return (found.get("elastic") or {}).get("nodes"), found.get("phase"), found.get("nodesReady")


def apply_elastic_job(name: str) -> tuple[dict[str, Any], Path]:
    """The elastic job, applied: the tests' own model and data module on the shared claim, logging the sample ids
    each rank trains; returns its trainer section and the stem of the sample logs."""
    claim = layout.VOLUMES / NS / CLAIM
    code, samples = claim / f"{name}-code", claim / f"{name}-samples"
    for old in claim.glob(f"{samples.name}.rank*"):
        old.unlink()
    code.mkdir(exist_ok=True)
    shutil.copy(USER_CODE, code / USER_CODE.name)
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": ELASTIC_EPOCHS}
    apply(small_job(
        name, nodes=ELASTIC_NODES, accelerator="gpu", devicesPerNode=1, trainer=trainer,
        terminationGracePeriodSeconds=15, runPolicy={"backoffLimit": 2},
        elastic={"minNodes": ELASTIC_MIN_NODES, "waitSeconds": ELASTIC_WAIT_SECONDS},
        env=[{"name": "PYTHONPATH", "value": f"/workspace/{code.name}"}],
        model={"classPath": "dtrain_test_user.TinyClassifier", "initArgs": {
            "sample_log": f"/workspace/{samples.name}", "step_sleep": ELASTIC_STEP_SECONDS}},
        data={"classPath": "dtrain_test_user.IndexedImageData", "initArgs": {"num_samples": ELASTIC_SAMPLES}},
    ))
    return trainer, samples


def lose_a_node(name: str, figures: Figures) -> str:
    """The node of the last rank lost: the job trains again on the minimum, NODES and a GangShrunk Event say so;
    returns the lost node."""
    last = max(worker_pods(name), key=lambda p: int(p["metadata"]["labels"][contract.LABEL_NODE_RANK]))
    lost = last["spec"]["nodeName"]
    at_loss = progress_step(name)
    if localcluster("lose", lost) != 0:
        raise Failed(f"python -m localcluster lose {lost} failed (above)")
    since = time.monotonic()
    eventually(lambda: elastic_size(name)[:2] == (ELASTIC_MIN_NODES, "Running") and progress_step(name) > at_loss,
               f"{name}: training again on {ELASTIC_MIN_NODES} nodes after {lost} was lost", 300)
    figures[f"node lost → training on {ELASTIC_MIN_NODES} of {ELASTIC_NODES} nodes (s)"] = time.monotonic() - since
    shrunk = eventually(lambda: events(name, "GangShrunk"), f"{name}: a GangShrunk Event", 60)[0]["message"]
    print(f"after {lost} was lost: {shrunk}")
    print(kubectl("get", "dtr", name, "-n", NS).stdout)
    if elastic_size(name)[2] != f"{ELASTIC_MIN_NODES}/{ELASTIC_MIN_NODES} of {ELASTIC_NODES}" or "keep the global batch" not in shrunk:
        raise Failed(f"{name}: NODES {elastic_size(name)[2]}, the Event {shrunk!r}")
    return lost


def node_returns(name: str, lost: str, figures: Figures) -> None:
    """The lost node back: the gang grows back to all its nodes (a GangGrown Event), no standby pod left."""
    if localcluster("rejoin", lost) != 0:
        raise Failed(f"python -m localcluster rejoin {lost} failed (above)")
    since = time.monotonic()
    eventually(lambda: elastic_size(name) == (ELASTIC_NODES, "Running", f"{ELASTIC_NODES}/{ELASTIC_NODES}")
               and running_gang(name, nodes=ELASTIC_NODES),
               f"{name}: grown back to {ELASTIC_NODES} nodes after {lost} returned", 300)
    grown_at = progress_step(name)
    eventually(lambda: progress_step(name) > grown_at, f"{name}: training on {ELASTIC_NODES} nodes", 300)
    figures[f"capacity back → training on all {ELASTIC_NODES} nodes (s)"] = time.monotonic() - since
    grown = eventually(lambda: events(name, "GangGrown"), f"{name}: a GangGrown Event", 60)[0]["message"]
    print(f"after {lost} returned: {grown}")
    if items("pods", NS, f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_STANDBY}"):
        raise Failed(f"{name}: standby pods left once the gang is whole")


def every_sample_once_an_epoch(name: str, steps: int, trainer: dict[str, Any], samples: Path) -> None:
    """Each epoch trained every sample exactly once, across the resizes: the ids each step's gang recorded."""
    trained = trained_samples(samples)
    per_epoch = ELASTIC_SAMPLES // (trainer["batchSize"] * ELASTIC_NODES)
    expected = [(step // per_epoch, step) for step in range(ELASTIC_EPOCHS * per_epoch)]
    if steps != len(expected) or list(trained) != expected:
        out_of_place = next((key for key, want in zip(trained, expected) if key != want), None)
        raise Failed(f"{name}: {steps} steps for {ELASTIC_EPOCHS} epochs of {per_epoch}; the sample logs record "
                     f"{len(trained)} (epoch, step), the first out of place {out_of_place}")
    for epoch in range(ELASTIC_EPOCHS):
        ids = sorted(i for (e, _), step_ids in trained.items() if e == epoch for i in step_ids)
        if ids != list(range(ELASTIC_SAMPLES)):
            raise Failed(f"{name}: epoch {epoch} trained {len(ids)} samples, {len(set(ids))} distinct, of "
                         f"{ELASTIC_SAMPLES}")


def scenario_elastic(figures: Figures) -> None:
    """An elastic job (spec.elastic, minNodes 2) of 3 GPU workers on 3 nodes of one nvidia.com/gpu each. A node
    is lost (python -m localcluster lose: its kubelet stopped, its Node deleted; the pod garbage collector deletes
    its pod about 40 s later): the gang restarts (counted once when a surviving rank's collective error is seen
    before the lost pod is gone), the pod replacing the lost one cannot be placed, and after
    waitSeconds the job trains on 2 nodes (NODES 2/2 of 3, a GangShrunk Event saying how the global batch is
    kept). The node returns (rejoin): a standby pod is placed on it and the gang grows back to 3 at its next
    checkpoint (GangGrown). It ends Succeeded, the resizes not counted, and the sample ids the ranks recorded show
    every sample trained exactly once in each epoch, across the resizes."""
    nodes = gpu_nodes_or_skip()
    if nodes is None:
        return
    for _ in range(ELASTIC_NODES - nodes):
        if localcluster("join") != 0:
            raise Failed("python -m localcluster join failed (above)")
    name = "e2e-elastic"
    trainer, samples = apply_elastic_job(name)
    eventually(lambda: running_gang(name, nodes=ELASTIC_NODES) and checkpoint_step(name) >= 4,
               f"{name}: all {ELASTIC_NODES} workers training, a checkpoint written", 300)
    lost = lose_a_node(name, figures)
    node_returns(name, lost, figures)
    final = finished(name, timeout=1800)
    resizes = (final.get("elastic") or {}).get("resizes")
    # The node's loss itself counts once at most (a survivor's collective error seen first); the resizes never.
    if final.get("restarts") not in (0, 1) or resizes != 2:
        raise Failed(f"{name}: restarts {final.get('restarts')}, resizes {resizes}: expected at most 1 and 2")
    every_sample_once_an_epoch(name, final["progress"]["step"], trainer, samples)
    print(f"{name}: Succeeded after {resizes} resizes, {final.get('restartsIgnoringBackoff')} restarts not counted; "
          f"every one of the {ELASTIC_SAMPLES} samples trained once in each of {ELASTIC_EPOCHS} epochs")
    delete(name)
    eventually(lambda: not worker_pods(name), f"{name}: its pods gone (their GPUs free)", 180)
