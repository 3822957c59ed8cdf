"""The scenarios on the real control plane: the user's path with kubectl, a worker killed, and what
the API server itself enforces (the CRD's rules, the chart's admission policies and RBAC, checked
with the users' and the pods' own credentials).

One module a theme; SCENARIOS, here, is the order `python -m tests.cluster` runs them in."""

from __future__ import annotations

from collections.abc import Callable

from ..wrong_jobs import scenario_wrong_jobs
from .common import Figures
from .control_plane import scenario_control_plane_outage, scenario_leader_failover, scenario_operator_killed
from .crd_refusals import scenario_crd_refusals
from .elastic import scenario_elastic
from .failures import (
    scenario_hang,
    scenario_in_place_restart,
    scenario_network_cut,
    scenario_object_storage,
    scenario_straggler,
    scenario_wrong_interface,
)
from .gang import scenario_gang, scenario_gang_coscheduling
from .jobs import (
    scenario_back_to_back,
    scenario_delete,
    scenario_engine_backoff,
    scenario_image_missing,
    scenario_quickstart,
    scenario_suspend_resume,
    scenario_user_image,
)
from .tenancy import scenario_report_flood, scenario_status_record, scenario_tenancy, scenario_tokens

SCENARIOS: list[tuple[str, str, Callable[[Figures], None]]] = [
    ("crd-refusals", "what the CRD refuses at kubectl apply and on an edit, with the API server's own message",
     scenario_crd_refusals),
    ("wrong-jobs", ("the wrong-jobs corpus and a few hundred working variants through the API server and the operator: "
                    "each refused before anything runs, or every child created"), scenario_wrong_jobs),
    ("status-record", "the status, the operator's record: neither set nor written with a user's own credentials",
     scenario_status_record),
    ("tenancy", ("a user's own credentials: no job as the operator, with its Secrets, an API token or an account no "
                 "administrator allowed, nor in the operator's namespace; an allowed account runs"), scenario_tenancy),
    ("quickstart", "the quick start: kubectl apply → training → engine Job → kubectl delete; then dtrain run",
     scenario_quickstart),
    ("in-place-restart", ("a training process SIGKILLed, restartStrategy InPlace and Recreate side by side: the "
                          "same pods or new ones, time to train again, steps lost"), scenario_in_place_restart),
    ("object-storage", "the quick start on s3://: worker SIGKILL → resume from the bucket → engine Job on the bucket",
     scenario_object_storage),
    ("network-cut", "network cut → restart within the collective timeout", scenario_network_cut),
    ("hang", "a hang (link cut, long collective timeout) → progress deadline → gang restart", scenario_hang),
    ("straggler", "one pod's link slowed (tc tbf) → the straggler Event names that pod", scenario_straggler),
    ("wrong-interface", "a wrong nccl.socketIfname → the job fails in pre-flight", scenario_wrong_interface),
    ("operator-kill", "the operator's process SIGKILLed → its container restarts, nothing created twice",
     scenario_operator_killed),
    ("suspend", "suspend and resume", scenario_suspend_resume),
    ("delete", "delete → every process gone, the pods' network namespaces removed", scenario_delete),
    ("engine-backoff", "engine Job failing → retried up to its backoffLimit → job Failed", scenario_engine_backoff),
    ("tokens", ("workers hold no API permission: progress through the operator, tokens as the API server and the "
                "operator's TokenReview judge them"), scenario_tokens),
    ("report-flood", ("one job's pod floods the report endpoint (idle connections, oversized reports, made-up tokens) "
                      "while another trains: its progress still reaches its status, no restart, the operator stands"),
     scenario_report_flood),
    ("user-image", "a user's image FROM the trainer image (examples/Containerfile) trains to Succeeded", scenario_user_image),
    ("image-missing", "an image in no store → ErrImagePull, ImagePullBackOff, the operator's condition", scenario_image_missing),
    ("back-to-back", ("a dozen short 2-node jobs, two at a time: each Succeeded within a bound, no restart, no "
                      "torchrun started again after its rank finished"), scenario_back_to_back),
    ("leader-failover", "two operator replicas: the leader's pod lost → the standby leads", scenario_leader_failover),
    ("control-plane-outage", "kube-apiserver, then etcd, stopped for 20 s during training", scenario_control_plane_outage),
    # Last: gang needs the 2 nodes the cluster starts with and leaves a third joined, elastic needs 3 and leaves them,
    # and the coscheduling gang is one larger than the nodes there are.
    ("gang", ("Kubernetes' own gang scheduling: 3 GPU workers on 2 GPU nodes none placed, the job says why; a node "
              "joins → the gang placed whole → Succeeded; two gangs that fit alone, not together: no deadlock; "
              "a gang that asks for one rack lands in one rack"),
     scenario_gang),
    ("elastic", ("an elastic job of 3 GPU workers: a node lost → training on 2 with the global batch kept; the "
                 "node back → grown to 3 at the next checkpoint → Succeeded, the resizes not counted"), scenario_elastic),
    ("gang-coscheduling", ("scheduler-plugins' coscheduling: a gang of one GPU worker more than the nodes, none "
                           "placed, the job says why; a node joins → all placed → Succeeded"),
     scenario_gang_coscheduling),
]
