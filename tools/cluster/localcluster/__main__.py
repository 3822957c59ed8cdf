"""`python -m localcluster up|join|down|status` (from tools/cluster; make cluster, cluster-join, cluster-down).

    up [--nodes N] [--gpus-per-node G]   build what is missing, start the control plane, N kubelets, an S3
       [--schedulers coscheduling]       gateway for spec.storage.url and the operator (helm install), the
       [--kueue]                         second schedulers named (schedulers.py) and Kueue when asked
                                         (kueue.py); return when the operator is Available
    join                                 one more node in the running cluster (the next index, with the CPU,
                                         memory and GPUs each node got at `up`); return when it is Ready
    down                                 stop everything `up` started and remove its state
    status                               what runs
    volume NAME [-n NAMESPACE]           a ReadWriteMany claim for spec.storage.claimName
    kueue                                Kueue in the running cluster (built the first time)
    anchors                              JobSet, Kubeflow Trainer and the Training Operator in the running
                                         cluster (anchors.py; built the first time), for make bench-anchors
    build [--schedulers S] [--kueue] [--anchors]
                                         the binaries `up` runs (Go builds), nothing started
    kubelet --node I ...                 one node's kubelet (started by `up`)

Each command's code: up.py (up, build, kueue, anchors), nodes.py (join, lose, rejoin), claims.py (volume),
down.py and kubelet.py; what they share: cluster.py.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import layout, pki, processes, schedulers
from .claims import volume
from .cluster import (
    DEFAULT_CPU,
    DEFAULT_MEMORY,
    ClusterError,
)
from .down import down
from .nodes import join, lose, rejoin
from .up import build, start_anchors, start_kueue, up


def status(_: argparse.Namespace) -> int:
    names = processes.names()
    if not names:
        print("cluster: not running (make cluster starts it)")
        return 1
    for name in names:
        pid = processes.running(name)
        print(f"{name:28} {'running, pid ' + str(pid) if pid else 'NOT RUNNING (log: ' + str(processes.log_file(name)) + ')'}")
    print(f"export KUBECONFIG={layout.KUBECONFIG}")
    return 0 if all(processes.running(n) for n in names) else 1


def _second_schedulers(text: str) -> list[str]:
    try:
        return schedulers.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str]) -> int:
    if argv[:1] == ["kubelet"]:
        from . import kubelet

        return kubelet.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the cluster")
    start.add_argument("--nodes", type=int, default=2)
    start.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu allocatable per node (counted, not devices)")
    start.add_argument("--cpu-per-node", default=DEFAULT_CPU)
    start.add_argument("--memory-per-node", default=DEFAULT_MEMORY)
    start.add_argument("--no-operator", action="store_true", help="do not install the operator")
    start.add_argument("--schedulers", type=_second_schedulers, default=[], metavar="NAME[,NAME]",
                       help=f"second schedulers to start beside kube-scheduler: {', '.join(schedulers.KNOWN)} "
                       f"(scheduler-plugins, schedulerName {schedulers.SCHEDULER_NAME}; built the first time)")
    start.add_argument("--kueue", action="store_true", help="build and install Kueue (make cluster KUEUE=1)")
    start.add_argument("--pods-from", choices=("images", "host"), default=os.environ.get("PODS_FROM") or "images",
                       help="run containers from their images (default; built when missing) or from this machine's "
                       "Python environment (quick local loops)")
    start.set_defaults(run=up)
    commands.add_parser("join", help="one more node in the running cluster, as `up` made each").set_defaults(run=join)
    lost = commands.add_parser("lose", help="a node lost: its kubelet stopped and its Node deleted")
    lost.add_argument("node", help="node-N")
    lost.set_defaults(run=lose)
    back = commands.add_parser("rejoin", help="a lost node back: its kubelet started again")
    back.add_argument("node", help="node-N")
    back.set_defaults(run=rejoin)
    commands.add_parser("down", help="stop the cluster and remove its state").set_defaults(run=down)
    commands.add_parser("status", help="what runs").set_defaults(run=status)
    commands.add_parser("kueue", help="build and install Kueue in the running cluster").set_defaults(run=start_kueue)
    commands.add_parser("anchors", help="build and install JobSet, Kubeflow Trainer and the Training Operator in the "
                        "running cluster").set_defaults(run=start_anchors)
    binaries = commands.add_parser("build", help="build the binaries `up` runs, start nothing")
    binaries.add_argument("--schedulers", type=_second_schedulers, default=[], metavar="NAME[,NAME]")
    binaries.add_argument("--kueue", action="store_true")
    binaries.add_argument("--anchors", action="store_true", help="the anchors' controllers (make bench-anchors)")
    binaries.set_defaults(run=build)
    claim = commands.add_parser("volume", help="a ReadWriteMany claim (for spec.storage.claimName)")
    claim.add_argument("name")
    claim.add_argument("-n", "--namespace", default=layout.JOB_NAMESPACE)
    claim.add_argument("--size", default=layout.SHARED_CLAIM_SIZE)
    claim.set_defaults(run=volume)
    args = parser.parse_args(argv)
    if args.command == "up" and args.nodes < 1:
        parser.error("--nodes must be at least 1")
    try:
        return args.run(args)
    except (ClusterError, RuntimeError, pki.PkiError) as exc:
        print(f"cluster: FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
