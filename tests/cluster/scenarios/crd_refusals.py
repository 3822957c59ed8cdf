"""What the CRD itself refuses at `kubectl apply` and on an edit (its schema and CEL rules), and what of
dtrain validate's refusals it cannot say."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from typing import Any

import yaml

from ..kube import (
    Failed,
    apply,
    kubectl,
)
from .common import NS, Figures, delete, small_job

# What the CRD itself refuses at `kubectl apply` (its schema and CEL rules), with the server's own message.
CRD_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("nodes 0", lambda s: s.update(nodes=0), "spec.nodes"),
    ("an unknown accelerator", lambda s: s.update(accelerator="tpu"), "spec.accelerator"),
    ("a relative checkpoint dir", lambda s: s["checkpoint"].update(dir="checkpoints"), "spec.checkpoint.dir"),
    ("minBatch above maxBatch", lambda s: s.update(engine={"minBatch": 8, "maxBatch": 2}), "minBatch <= optBatch <= maxBatch"),
    ("a reserved env name", lambda s: s.update(env=[{"name": "PET_NNODES", "value": "9"}]), "spec.env"),
]

# What the CRD's transition rules (oldSelf) refuse on an edit of a job that is not suspended.
CRD_EDIT_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"nodes": 3}, "spec.nodes is immutable"),
    ({"runPolicy": {"backoffLimit": 9}}, "spec.runPolicy.backoffLimit is immutable"),
    ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}]}, "spec.volumes is immutable"),
    ({"scheduling": {"affinity": {"nodeAffinity": {}}}}, "spec.scheduling may change only while the job is suspended"),
]


# Of the bad jobs dtrain validate refuses (refusal_corpus), those the CRD's schema and CEL rules do not
# say, by why: the API server accepts them, and dtrain validate and the operator (its InvalidSpec
# condition) refuse them, naming the field.
POD_FIELDS = ("Kubernetes' pod fields, kept as written (x-kubernetes-preserve-unknown-fields): what dtrain reads "
              "of them (names, paths, a value or its source) and what would collide with the operator's volumes")
ACROSS_FIELDS = "rules across sibling fields or list items: not yet in CEL"
RANGE_ORDER = "the order of an exit-code range's two codes: CEL reads no number out of a string"
CRD_CANNOT_EXPRESS: dict[str, str] = {
    **dict.fromkeys([
        "env value with valueFrom", "mount at the storage path", "mount inside the config", "mount of no volume",
        "mount of the config volume", "mount over shared memory", "mount without a path", "two mounts at one path",
        "two volumes of one name", "volume of the operator's", "volume without name",
    ], POD_FIELDS),
    **dict.fromkeys(["nccl var twice", "profiles naming other inputs", "profiles of other ranks"], ACROSS_FIELDS),
    "failure rule exit code range reversed": RANGE_ORDER,
}
# Bad files that are no DistributedTraining at all: kubectl refuses them before any schema applies.
NOT_A_DISTRIBUTED_TRAINING = {"no metadata", "wrong apiVersion", "wrong kind"}


def refusal_corpus() -> list[tuple[str, dict[str, Any], str]]:
    """Every bad job of the unit tests' tables that dtrain validate refuses: (case, the object, the field
    its line names). tests/unit/test_api.py's spec errors and tests/unit/test_job_files.py's pod fields."""
    from tests.unit.test_api import BAD_SPECS
    from tests.unit.test_job_files import REFUSED, job_text

    corpus = [(case, copy.deepcopy(obj), field) for case, obj, field in BAD_SPECS]
    corpus += [(case, yaml.safe_load(job_text(spec)), line.split(": ", 1)[0]) for case, spec, line in REFUSED]
    return corpus


def _names_field(message: str, field: str) -> bool:
    """Whether the API server's message names `field` or a field that holds it (spec.engine for spec.engine.x)."""
    path = field
    while path:
        if re.search(re.escape(path) + r'(?=[\s:.\["])', message):
            return True
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return False


def scenario_crd_refusals(figures: Figures) -> None:
    for title, change, fragment in CRD_REFUSALS:
        job = small_job("e2e-refused")
        change(job["spec"])
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(job), check=False)
        if result.returncode == 0 or fragment not in result.stderr:
            raise Failed(f"{title}: expected the API server to refuse it naming {fragment!r}: {result.stderr.strip()[:400]}")
        print(f"refused at kubectl apply: {title}: {result.stderr.strip().splitlines()[0][:160]}")
    # Edits, tried with --dry-run=server on a job that is not suspended but whose pods no node takes.
    edited = "e2e-edited"
    apply(small_job(edited, scheduling={"nodeSelector": {"dtrain.dev/e2e": "no-such-node"}}))

    def edit(change: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return kubectl("patch", "dtr", edited, "-n", NS, "--type=merge", "--dry-run=server",
                       "-p", json.dumps({"spec": change}), check=False)

    for change, fragment in CRD_EDIT_REFUSALS:
        result = edit(change)
        if result.returncode == 0 or fragment not in result.stderr:
            raise Failed(f"an edit of {change}: expected the API server to refuse it with {fragment!r}: "
                         f"{(result.stderr or result.stdout).strip()[:400]}")
        print(f"refused at kubectl patch: {result.stderr.strip().splitlines()[0][:160]}")
    result = edit({"runPolicy": {"ttlSecondsAfterFinished": 60}})
    if result.returncode != 0:
        raise Failed(f"an edit of a mutable field was refused: {result.stderr.strip()[:400]}")
    delete(edited)
    # Every bad job dtrain validate refuses: the API server refuses it too, naming the field, unless the
    # CRD cannot say it (CRD_CANNOT_EXPRESS, listed here as the server accepts them).
    accepted, misnamed, refused = [], [], 0
    for case, obj, field in refusal_corpus():
        obj.setdefault("metadata", {})["namespace"] = NS
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj), check=False)
        if result.returncode == 0:
            accepted.append(case)
        elif case not in NOT_A_DISTRIBUTED_TRAINING and not _names_field(result.stderr, field):
            misnamed.append(f"{case}: {field} not named in {result.stderr.strip()[:300]!r}")
        else:
            refused += 1
    print(f"{refused} of {refused + len(accepted) + len(misnamed)} bad jobs dtrain validate refuses are refused at "
          f"kubectl apply, naming the field; the CRD does not express {len(accepted)} (dtrain validate and the "
          "operator refuse them):")
    for why in dict.fromkeys(CRD_CANNOT_EXPRESS.values()):
        cases = sorted(case for case in accepted if CRD_CANNOT_EXPRESS.get(case) == why)
        print(f"  {why}: {', '.join(cases)}")
    unexpected, stale = set(accepted) - set(CRD_CANNOT_EXPRESS), set(CRD_CANNOT_EXPRESS) - set(accepted)
    if misnamed or unexpected or stale:
        raise Failed(f"refused without naming the field: {misnamed}; accepted by the API server though the CRD "
                     f"should refuse them: {sorted(unexpected)}; in CRD_CANNOT_EXPRESS but refused: {sorted(stale)}")
