"""`dtrain operator`'s flags (the chart passes them)."""

from __future__ import annotations

import argparse

from dtrain_operator.api import contract
from dtrain_operator.cli import subcommands
from dtrain_operator.cli.subcommands import in_this_image


# layout: one flat list of the command's flags, in the order --help shows them, reads best as one list.
def add_operator_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """operator: the controller, with its flags (the chart passes them)."""
    p = sub.add_parser(
        "operator",
        help="run the operator (what the operator Deployment runs)",
        description=(
            "Run the dtrain operator: it turns each DistributedTraining into a Service and a gang "
            "of worker pods, restarts the gang when a worker fails, builds the engine in a Job, and reports "
            "status. Credentials: the pod's service account in a cluster, else $KUBECONFIG (or ~/.kube/config)."
        ),
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch only this namespace (repeat for several; needs a Role in each)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default; needs a ClusterRole)"
    )
    p.add_argument("--health-port", type=int, default=8080, help="port of the /healthz liveness endpoint (default 8080)")
    p.add_argument("--metrics-port", type=int, default=8081, help="port of the Prometheus /metrics (default 8081)")
    p.add_argument(
        "--qps",
        type=float,
        default=500.0,
        help="client-side limit on the operator's own API requests, per second on average (default 500; "
        "the API server's Priority and Fairness protects it; lower it for clusters older than Kubernetes 1.29)",
    )
    p.add_argument(
        "--burst", type=int, default=1000, help="requests allowed at once above --qps before it applies (default 1000)"
    )
    p.add_argument(
        "--network-policy",
        action="store_true",
        help="create a NetworkPolicy per job that admits ingress to its pods (the rendezvous port included) "
        "only from the job's own pods",
    )
    p.add_argument(
        "--refuse-host-access",
        action="store_true",
        help="refuse jobs that ask for hostNetwork or hostPath volumes (condition InvalidSpec naming the field) "
        f"unless their namespace carries the label {contract.LABEL_ALLOW_HOST_ACCESS}=true",
    )
    p.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="re-open every watch after this long, so that a stream that died silently reconnects (default 300)",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a coordination.k8s.io Lease while reconciling, so that several replicas can run and one acts "
        "(default on; --no-leader-elect for a single replica)",
    )
    p.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a standby waits after the Lease last changed before it takes over (default 10)",
    )
    p.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=7.0,
        metavar="SECONDS",
        help="how long the leader tries to renew the Lease before it gives up and exits (default 7)",
    )
    p.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often candidates try to acquire, and the leader renews, the Lease (default 2)",
    )
    p.add_argument(
        "--leader-elect-resource-name", default="dtrain-operator", metavar="NAME", help="the Lease's name"
    )
    p.add_argument(
        "--report-service",
        metavar="NAME",
        default="",
        help="the headless Service, in the operator's own namespace, in front of every replica's report endpoint: "
        "rank 0 of each job sends its progress there over HTTPS and the operator writes it into the job's "
        "status (the chart sets it; unset, reports are off and progress stays in the pods' logs)",
    )
    p.add_argument(
        "--report-port",
        type=int,
        default=contract.DEFAULT_REPORT_PORT,
        help=f"port of the report endpoint (default {contract.DEFAULT_REPORT_PORT})",
    )
    p.add_argument(
        "--report-tls-secret",
        metavar="NAME",
        default="dtrain-operator-report-tls",
        help="the Secret, in the operator's own namespace, holding the report endpoint's CA and certificate "
        "(created at the first start when missing; default dtrain-operator-report-tls)",
    )
    p.add_argument(
        "--job-defaults",
        metavar="FILE",
        help="YAML of the fields every job leaves unset takes ({spec: {...}, namespaces: {NS: {...}}}; the chart's "
        "jobDefaults): storage, images, the engine's fallback, scheduling; a job's own fields win",
    )
    p.add_argument(
        "--service-account",
        metavar="NAME",
        default="dtrain-operator",
        help="the operator's own service account (in its namespace), which no job may run as (default dtrain-operator)",
    )
    p.add_argument(
        "--trainer-service-account",
        metavar="NAME",
        default=contract.DEFAULT_WORKER_SERVICE_ACCOUNT,
        help="the service account a job's pods run as unless an administrator allowed another "
        f"(default {contract.DEFAULT_WORKER_SERVICE_ACCOUNT})",
    )
    p.add_argument(
        "--allow-service-account",
        metavar="NAMESPACE/NAME",
        action="append",
        default=[],
        dest="allowed_service_accounts",
        help="a service account that jobs in NAMESPACE may name in spec.serviceAccountName, and under which they "
        "may mount a token for the Kubernetes API (repeatable; the chart's tenancy.allowedServiceAccounts)",
    )
    p.add_argument(
        "--leader-elect-resource-namespace",
        metavar="NS",
        help="the Lease's namespace: the operator's own (default $POD_NAMESPACE, else the service account's "
        "namespace, else default)",
    )
    p.add_argument(
        "--stuck-terminating-timeout",
        type=float,
        default=150.0,
        metavar="SECONDS",
        help="a deleted worker pod still there this long after its grace period ended (its deletionTimestamp) is "
        "stuck: it is named in a condition and an Event, and force-deleted once its node stopped reporting "
        "(default 150: the kubelet has killed its processes by then, unless its node is gone)",
    )
    p.add_argument(
        "--image-pull-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a worker pod that still cannot pull its image this long after it was scheduled fails the job with "
        "ImagePullFailed (default 300)",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level (default INFO)"
    )
    p.add_argument(
        "--log-format", default="plain", choices=["plain", "json"], help="plain text or one JSON object a line"
    )
    p.set_defaults(func=in_this_image(subcommands.operator))
