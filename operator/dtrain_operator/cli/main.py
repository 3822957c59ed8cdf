"""The `dtrain` command. Each subcommand imports its own dependencies lazily, so the
operator image (no torch) and the trainer image (no kopf) share one entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain_operator.api import engine_options
from dtrain_operator.cli import subcommands
from dtrain_operator.cli.operator_command import add_operator_command
from dtrain_operator.cli.subcommands import in_this_image

if TYPE_CHECKING:
    from dtrain_operator.api.spec import DistributedTrainingSpec


def _cmd_crd(args: argparse.Namespace) -> int:
    from dtrain_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_api_docs(args: argparse.Namespace) -> int:
    from dtrain_operator.api.reference import api_reference

    sys.stdout.write(api_reference())
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from dtrain_operator.api.job_defaults import JobDefaultsError
    from dtrain_operator.api.validation import EXIT_INVALID_JOB, parse_job_defaults, validate_file

    defaults = None
    if args.defaults:
        try:
            defaults = parse_job_defaults(Path(args.defaults).read_text(), args.defaults)
        except (OSError, JobDefaultsError) as exc:
            print(f"dtrain validate: --defaults {args.defaults}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return EXIT_INVALID_JOB
    failed = False
    estimate_code = 0
    client = None
    if args.server:
        from dtrain_operator.cli.server_verdict import client_for, refusals_on_server

        client = client_for(args)
    for path in args.files:
        namespace = args.namespace or (client.namespace if client is not None else "default")
        result = validate_file(path, defaults=defaults, namespace=namespace)
        if client is not None and result.job is not None and not result.errors:
            result.errors.extend(refusals_on_server(client, result, namespace))
        if result.errors:
            failed = True
            for error in result.errors:
                print(f"{result.source}: {error}", file=sys.stderr)
        elif result.job is not None:
            spec = result.job.spec
            if not args.quiet:
                unjudged = [] if client is not None else _passed_through(spec)
                print(
                    f"{result.source}: ok: DistributedTraining {result.job.name} "
                    f"({spec.nodes} node(s) x {spec.devices_per_node} {spec.accelerator} process(es))"
                    + (f"; {', '.join(unjudged)} go to the pods as written: --server has the API server judge them"
                       if unjudged else "")
                )
            if args.estimate:
                from dtrain_trainer.memory_report import print_estimate

                estimate_code = max(estimate_code, print_estimate(result.job, args.gpu_memory))
    return EXIT_INVALID_JOB if failed else estimate_code


def _passed_through(spec: DistributedTrainingSpec) -> list[str]:
    """The fields of `spec` set with Kubernetes objects that only the API server judges (api/kube_objects.py)."""
    fields = {
        "spec.volumes": spec.volumes, "spec.volumeMounts": spec.volume_mounts,
        "spec.env[].valueFrom": [var for var in spec.env if var.value_from is not None],
        "spec.scheduling.tolerations": spec.scheduling.tolerations, "spec.scheduling.affinity": spec.scheduling.affinity,
    }
    return [name for name, value in fields.items() if value]


def _cluster_options(parser: argparse.ArgumentParser, output: bool = False) -> None:
    """kubectl's options: -n/--namespace, --context, --kubeconfig, and -o json|yaml where an object is printed."""
    parser.add_argument("-n", "--namespace", metavar="NS", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current context)")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    if output:
        parser.add_argument("-o", "--output", choices=["json", "yaml"], help="print the object(s) as JSON or YAML")


def _add_cluster_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """submit, get, watch, logs, delete: jobs on a cluster (dtrain_operator.cli.cluster, on client.Client)."""
    p = sub.add_parser(
        "submit",
        help="validate a job file and create the job on the cluster",
        description="Validate FILE as `dtrain validate` does, then create the DistributedTraining on the cluster "
        "(kubeconfig or in-cluster credentials). A GPU job's per-GPU memory estimate (`dtrain validate --estimate`, "
        "where the trainer extra is installed) is recorded on it for the operator's GPUMemoryExceeded condition; "
        "a job that does not fit is still created, with a warning. Exit codes: 0 created, 1 refused, 2 invalid file.",
    )
    p.add_argument("file", metavar="FILE", help="a DistributedTraining YAML file")
    p.add_argument(
        "--no-estimate", action="store_true", help="do not estimate per-GPU memory (it builds the model on the CPU)"
    )
    _cluster_options(p, output=True)
    p.set_defaults(func=in_this_image(subcommands.submit))

    p = sub.add_parser(
        "get",
        help="list jobs, or show one: the columns of `kubectl get dtr`, plus the last loss and the ETA",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="one job (default: every job of the namespace)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    _cluster_options(p, output=True)
    p.set_defaults(func=in_this_image(subcommands.get))

    p = sub.add_parser(
        "watch",
        help="follow a job's progress live until it ends, then print its summary",
        description="Draw the job's progress (epoch, step, loss, images/s, ETA) from its status until it succeeds "
        "or fails, then the summary table of `dtrain run`. Exit codes: 0 succeeded, 1 failed or refused.",
    )
    p.add_argument("name", metavar="NAME", help="the job")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between reads (default 2)")
    _cluster_options(p)
    p.set_defaults(func=in_this_image(subcommands.watch))

    p = sub.add_parser("logs", help="print the trainer log of one worker pod (rank 0 by default)")
    p.add_argument("name", metavar="NAME", help="the job")
    p.add_argument("--rank", type=int, default=0, metavar="N", help="node rank of the worker pod (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="stream the log until the container ends")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines")
    p.add_argument("-p", "--previous", action="store_true", help="the log of the previous container")
    _cluster_options(p)
    p.set_defaults(func=in_this_image(subcommands.logs))

    p = sub.add_parser("delete", help="delete jobs (their pods, Service and engine Job go with them)")
    p.add_argument("names", nargs="+", metavar="NAME", help="the jobs")
    p.add_argument("--wait", action="store_true", help="return once each job is gone")
    _cluster_options(p)
    p.set_defaults(func=in_this_image(subcommands.delete))


def _cmd_cli_docs(args: argparse.Namespace) -> int:
    from dtrain_operator.cli.reference import cli_reference

    sys.stdout.write(cli_reference(build_parser()))
    return 0


def _cmd_troubleshooting_docs(args: argparse.Namespace) -> int:
    from dtrain_operator.cli.troubleshooting import troubleshooting_reference

    sys.stdout.write(troubleshooting_reference())
    return 0


def _cmd_client_docs(args: argparse.Namespace) -> int:
    from dtrain_operator import client
    from dtrain_operator.cli.client_reference import client_reference

    sys.stdout.write(client_reference(client))
    return 0


def _add_file_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """crd, the generated docs and validate: the API, the command, the client and the reasons, and job files checked."""
    p = sub.add_parser("crd", help="print the DistributedTraining CustomResourceDefinition (generated from the model)")
    p.set_defaults(func=_cmd_crd)
    p = sub.add_parser("api-docs", help="print the API reference in Markdown, docs/api.md (generated from the model)")
    p.set_defaults(func=_cmd_api_docs)
    p = sub.add_parser("cli-docs", help="print this command's reference in Markdown, docs/cli.md (generated from its parser)")
    p.set_defaults(func=_cmd_cli_docs)
    p = sub.add_parser("troubleshooting-docs", help="print every condition and Event reason the operator writes, what "
                       "each means and what to do, in Markdown, docs/troubleshooting.md (generated from the code)")
    p.set_defaults(func=_cmd_troubleshooting_docs)
    p = sub.add_parser("client-docs", help="print the Python client's reference in Markdown, docs/client.md "
                       "(generated from its docstrings)")
    p.set_defaults(func=_cmd_client_docs)

    p = sub.add_parser(
        "validate",
        help="check job files; one line per error naming the field",
        description="Check each FILE (one DistributedTraining per file) as the operator would; with --server, also "
        "as the API server would (the Kubernetes objects a job passes to its pods, such as volumes and "
        "tolerations, are the server's to judge). "
        "Exit codes: 0 every file valid, 2 a file invalid (as `dtrain submit` and `dtrain run` say it), "
        "3 with --estimate when a batch does not fit.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="DistributedTraining YAML files")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    p.add_argument(
        "--defaults",
        metavar="FILE",
        help="the cluster's job defaults ({spec: {...}, namespaces: {NS: {...}}}, the chart's jobDefaults): every "
        "field a job leaves unset is taken from them first, as the operator does",
    )
    p.add_argument(
        "-n", "--namespace", metavar="NS",
        help="the namespace a file without one is applied to (kubectl apply -n NS), for --defaults and --server "
        "(default: default; with --server, the kubeconfig context's)",
    )
    p.add_argument(
        "--server",
        action="store_true",
        help="also ask the API server (a server-side dry run, nothing is created): the DistributedTraining and "
        "one of each object the operator would create for it (pods, Service, engine Job, ...)",
    )
    p.add_argument("--context", metavar="NAME", help="with --server: kubeconfig context (default: the current one)")
    p.add_argument("--kubeconfig", metavar="PATH", help="with --server: kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="also estimate per-GPU memory (builds the model on the CPU; needs the trainer extra); "
        "exit code 3 when it does not fit",
    )
    p.add_argument(
        "--gpu-memory", metavar="SIZE", help="memory of one GPU for --estimate's verdict, e.g. 32Gi or 80G"
    )
    p.set_defaults(func=_cmd_validate)


def _add_run_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """run: a job file on this machine."""
    p = sub.add_parser(
        "run",
        help="run a job file on this machine: training, export and engine, end to end",
        description="Run a job file on this machine as the operator would on a cluster: one local torchrun "
        "per node with the worker pod's environment, gang restarts from the last checkpoint under runPolicy, "
        "then the engine step, and a summary table. Exit codes: 0 everything asked for succeeded, 1 the job "
        "failed, 2 the file is invalid or cannot run here, 128+N stopped by signal N (Ctrl-C: 130).",
    )
    p.add_argument("file", metavar="FILE", help="a DistributedTraining YAML file")
    p.add_argument("--nodes", type=int, metavar="N", help="override spec.nodes (local processes acting as nodes)")
    p.add_argument("--devices-per-node", type=int, metavar="G", help="override spec.devicesPerNode")
    p.add_argument(
        "--workdir", metavar="DIR", help="checkpoints, artifacts and logs go here (default ./dtrain-runs/<name>/)"
    )
    p.add_argument("--no-engine", action="store_true", help="stop after training and ONNX export")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint an earlier run left in the workdir (default: start afresh)",
    )
    p.set_defaults(func=in_this_image(subcommands.run_locally))


def _add_engine_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """build-engine: the engine Job's command, also usable by hand."""
    p = sub.add_parser(
        "build-engine",
        help="build a TensorRT engine from an ONNX model, check it against references and time it",
        description="Build a TensorRT engine from an ONNX model, compare it with ONNX Runtime (and the PyTorch "
        "model when known) on random batches at the min/opt/max batch sizes, time it next to PyTorch eager, "
        "and write the engine and a JSON report. Exit codes: 0 passed, 1 build or accuracy check failed, "
        "2 bad arguments or model, 3 TensorRT or a CUDA GPU missing (without --fallback).",
    )
    p.add_argument("--onnx", required=True, metavar="PATH", help="the ONNX model")
    p.add_argument("--out", required=True, metavar="PATH", help="where the engine (.plan) is written")
    p.add_argument("--timing-cache", metavar="PATH", help="TensorRT timing cache, read and written")
    p.add_argument("--report", metavar="PATH", help="JSON report (default: engine-report.json next to --out)")
    p.add_argument(
        "--pytorch-checkpoint",
        metavar="PATH",
        help="checkpoint of the PyTorch model (default: from artifacts.json next to --onnx)",
    )
    p.add_argument(
        "--model-config",
        metavar="PATH",
        help="trainer config or job file whose `model` (classPath, initArgs) the checkpoint belongs to "
        "(default: from artifacts.json next to --onnx)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the PyTorch reference and eager baseline")
    p.add_argument("--warmup", type=int, default=10, metavar="N", help="warm-up runs per batch size (default 10)")
    p.add_argument("--iterations", type=int, default=100, metavar="N", help="timed runs per batch size (default 100)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="time budget per backend and batch size; at least 5 runs are timed (default 10)",
    )
    p.add_argument("--seed", type=int, metavar="N", help="seed of the random check batches (default: fresh)")
    engine_options.add_flags(p)  # the build options: spec.engine's fields, help and all
    p.add_argument("--dry-run", action="store_true", help="print the build plan as JSON and stop: no TensorRT or GPU needed, nothing written")
    p.add_argument("--tensorrt-version", metavar="X.Y", help="the TensorRT a --dry-run plans for (default: the one installed, else 10.13)")
    p.set_defaults(func=in_this_image(subcommands.build_engine))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtrain",
        description="Multi-node PyTorch Lightning DDP training on Kubernetes, and a TensorRT engine at the end.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_file_commands(sub)
    add_operator_command(sub)
    _add_run_command(sub)
    _add_cluster_commands(sub)
    _add_engine_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
