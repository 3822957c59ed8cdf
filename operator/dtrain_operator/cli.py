"""The `dtrain` command. Each subcommand imports its own dependencies lazily, so the
operator image (no torch) and the trainer image (no kopf) share one entry point."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence


def _cmd_crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validation import validate_file

    failed = False
    for path in args.files:
        for result in validate_file(path):
            if result.errors:
                failed = True
                for error in result.errors:
                    print(f"{result.source}: {error}", file=sys.stderr)
            elif not args.quiet and result.job is not None:
                spec = result.job.spec
                print(
                    f"{result.source}: ok: DistributedTraining {result.job.name} "
                    f"({spec.nodes} node(s) x {spec.devices_per_node} {spec.accelerator} process(es))"
                )
    return 1 if failed else 0


def _lazy(module: str, function: str = "main") -> Callable[[argparse.Namespace], int]:
    """A subcommand whose implementation lives in another module, imported only when run."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), function)(args) or 0)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtrain",
        description="Multi-node PyTorch Lightning DDP training on Kubernetes, and a TensorRT engine at the end.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("crd", help="print the DistributedTraining CustomResourceDefinition (generated from the model)")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser("validate", help="check job files; one line per error naming the field")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("operator", help="run the operator (what the operator Deployment runs)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", dest="namespaces", metavar="NS", help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    p.add_argument("--health-port", type=int, default=8080, help="port of /healthz (default 8080)")
    p.add_argument("--metrics-port", type=int, default=8081, help="port of the Prometheus /metrics (default 8081)")
    p.add_argument("--qps", type=float, default=20.0, help="client-side API request rate limit, requests/s (default 20)")
    p.add_argument("--burst", type=int, default=40, help="requests allowed above --qps in a burst (default 40)")
    p.add_argument(
        "--watch-timeout", type=int, default=300, help="seconds before a watch is re-opened, so a dead stream reconnects"
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level")
    p.add_argument("--log-format", default="plain", choices=["plain", "json"], help="log format")
    p.set_defaults(func=_lazy("dtrain_operator.main"))

    p = sub.add_parser("run", help="run a job file on this machine: training, export and engine, end to end")
    p.add_argument("file", metavar="FILE", help="a DistributedTraining YAML file")
    p.add_argument("--nodes", type=int, help="override spec.nodes (local processes acting as nodes)")
    p.add_argument("--devices-per-node", type=int, help="override spec.devicesPerNode")
    p.add_argument("--workdir", help="checkpoints, artifacts and logs go here (default ./dtrain-runs/<name>/)")
    p.add_argument("--no-engine", action="store_true", help="stop after training and ONNX export")
    p.set_defaults(func=_lazy("dtrain_operator.local_run"))

    p = sub.add_parser("build-engine", help="build and check a TensorRT engine from an ONNX model")
    p.add_argument("--onnx", required=True, metavar="PATH", help="the ONNX model")
    p.add_argument("--out", required=True, metavar="PATH", help="where the engine (.plan) is written")
    p.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16", "int8"], help="default fp16")
    p.add_argument("--min-batch", type=int, default=1, metavar="N")
    p.add_argument("--opt-batch", type=int, metavar="N", help="default: --max-batch")
    p.add_argument("--max-batch", type=int, default=32, metavar="N")
    p.add_argument("--workspace-mib", type=int, default=4096, metavar="N", help="builder workspace limit")
    p.add_argument("--timing-cache", metavar="PATH", help="TensorRT timing cache, read and written")
    p.add_argument("--report", metavar="PATH", help="JSON report (default: next to --out)")
    p.add_argument(
        "--fallback",
        choices=["onnxruntime"],
        help="without TensorRT or a CUDA GPU, check and time the ONNX model with ONNX Runtime instead",
    )
    p.set_defaults(func=_lazy("dtrain_trainer.engine"))
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
