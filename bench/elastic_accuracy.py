"""The quick start's digits model trained by an elastic gang resized twice, beside the same job on a fixed gang.

Both train examples/quickstart.yaml's job (resnet18 on the bundled digits, 6 epochs, a cosine
schedule) with spec.elastic {minNodes: 1}: the same seed and the same global batch (32 x 2 nodes).
The fixed gang trains on 2 nodes throughout. The resized one trains on 2 nodes until a third of
the run's steps, on 1 node (twice the accumulation, the same global batch) until two thirds,
then on 2 again to the end. A resize is what the operator does for a lost node and its return:
SIGTERM to every node (each rank stops at one step and rank 0 saves a checkpoint, as for pods
going away), then the gang started again at the other size from that checkpoint. Each node is a
real torchrun launcher, as `dtrain run` starts it.

The table: each gang's validation accuracy and loss at the end (the digits' held-out fifth), the
difference, and the sizes the resized gang trained at. Its steps see the same samples as the fixed
gang's (tests/trainer/test_elastic.py checks that sample by sample); what differs is the order of
the sums in each gradient and batch norm's statistics, computed per micro-batch.

`OMP_NUM_THREADS=1 .venv/bin/python -m bench.elastic_accuracy` (`--smoke`: one epoch of 16x16 images,
for the tests: the figures are not meant to be read)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO_ROOT, machine, markdown_table, write_results
from dtrain_operator.api import TrainerConfig, contract
from dtrain_operator.api.elastic import ElasticPolicy
from dtrain_operator.api.validation import load_job
from dtrain_operator.core.render import TRAINER_COMMAND
from tests.ports import free_port

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
NODES = 2
RUN_TIMEOUT_SECONDS = 3600


def trainer_config(workdir: Path, smoke: bool) -> dict[str, Any]:
    """The quick start's trainer config, elastic, in `workdir`; no export (accuracy is the figure)."""
    job, errors = load_job(QUICKSTART)
    if job is None:
        raise SystemExit("; ".join(errors))
    spec = job.spec.model_copy(update={"elastic": ElasticPolicy(min_nodes=1)})
    if smoke:  # one epoch of 16x16 images: the same path, a fraction of the time
        spec.trainer.max_epochs = 1
        spec.data.init_args["image_size"] = 16
    config = TrainerConfig.from_job(job.model_copy(update={"spec": spec}))
    wire = config.to_wire()
    wire["checkpoint"]["dir"] = str(workdir / "checkpoints")
    wire["artifacts"]["dir"] = str(workdir / "artifacts")
    wire["export"]["onnx"]["enabled"] = False
    return wire


def node_env(config: Path, nodes: int, rank: int, port: int, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not contract.is_reserved_env_name(k)}
    env.update({
        "OMP_NUM_THREADS": "1",
        contract.ENV_CONFIG: str(config),
        contract.ENV_NNODES: str(nodes),
        contract.ENV_NPROC_PER_NODE: "1",
        contract.ENV_NODE_RANK: str(rank),
        contract.ENV_MASTER_ADDR: "127.0.0.1",
        contract.ENV_MASTER_PORT: str(port),
        contract.ENV_PROGRESS_SINK: f"{contract.PROGRESS_SINK_JSONL_PREFIX}{workdir / 'progress.jsonl'}",
        contract.ENV_PROGRESS_INTERVAL: "0",  # a record per step: the stop lands near its step
        contract.ENV_TERMINATION_LOG: str(workdir / f"results-{rank}.json"),
    })
    return env


def latest_step(progress: Path) -> int:
    steps = [0]
    if progress.exists():
        for line in progress.read_text().splitlines():
            try:
                steps.append(int(json.loads(line).get("step") or 0))
            except (ValueError, AttributeError):
                continue
    return max(steps)


def train(config: Path, workdir: Path, nodes: int, stop_at: int | None) -> int:
    """One gang of `nodes` nodes, stopped by SIGTERM once it passed step `stop_at` (None: to the end); the step it
    reached."""
    port = free_port()
    logs = [open(workdir / f"gang-{nodes}-{time.monotonic_ns()}-node-{rank}.log", "w") for rank in range(nodes)]  # noqa: SIM115
    launchers = [
        subprocess.Popen([sys.executable, *TRAINER_COMMAND[1:]], env=node_env(config, nodes, rank, port, workdir),
                         stdout=log, stderr=subprocess.STDOUT)
        for rank, log in enumerate(logs)
    ]
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    try:
        while any(p.poll() is None for p in launchers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"a gang of {nodes} did not finish within {RUN_TIMEOUT_SECONDS} s")
            if stop_at is not None and latest_step(workdir / "progress.jsonl") >= stop_at:
                for launcher in launchers:
                    launcher.send_signal(signal.SIGTERM)
                stop_at = None
            time.sleep(0.5)
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
        for log in logs:
            log.close()
    codes = [p.wait() for p in launchers]
    if any(code not in (0, 143) for code in codes):
        raise RuntimeError(f"a gang of {nodes} ended with {codes}; see {workdir}/gang-{nodes}-*.log")
    return latest_step(workdir / "progress.jsonl")


def validation(workdir: Path) -> dict[str, float]:
    results = json.loads((workdir / "results-0.json").read_text())
    metrics = results.get("metrics") or {}
    return {"step": results["step"], "acc": float(metrics["val_acc"]), "loss": float(metrics["val_loss"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", help="where to write the results JSON (default: bench/results/)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dtrain-elastic-") as tmp:
        fixed_dir, resized_dir = Path(tmp) / "fixed", Path(tmp) / "resized"
        outcomes: dict[str, Any] = {}
        for workdir in (fixed_dir, resized_dir):
            workdir.mkdir()
            (workdir / "config.yaml").write_text(yaml.safe_dump(trainer_config(workdir, args.smoke), sort_keys=False))
        started = time.monotonic()
        steps = train(fixed_dir / "config.yaml", fixed_dir, NODES, None)
        outcomes["fixed"] = {**validation(fixed_dir), "sizes": [f"{NODES} nodes to step {steps}"],
                             "seconds": time.monotonic() - started}
        started, sizes = time.monotonic(), []
        for nodes, stop_at in ((NODES, steps // 3), (1, 2 * steps // 3), (NODES, None)):
            reached = train(resized_dir / "config.yaml", resized_dir, nodes, stop_at)
            sizes.append(f"{nodes} node{'s' if nodes > 1 else ''} to step {reached}")
        outcomes["resized"] = {**validation(resized_dir), "sizes": sizes, "seconds": time.monotonic() - started}
    fixed, resized = outcomes["fixed"], outcomes["resized"]
    rows = [
        ("fixed: 2 nodes", fixed["step"], f"{100 * fixed['acc']:.2f} %", f"{fixed['loss']:.4f}", "; ".join(fixed["sizes"])),
        ("resized twice", resized["step"], f"{100 * resized['acc']:.2f} %", f"{resized['loss']:.4f}",
         "; ".join(resized["sizes"])),
    ]
    difference = 100 * (resized["acc"] - fixed["acc"])
    print(markdown_table(("gang", "steps", "validation accuracy", "validation loss", "sizes"), rows))
    print(f"\nresized - fixed: {difference:+.2f} accuracy points (the issue's bound: within 1 point)")
    path = write_results("elastic_accuracy", {"machine": machine(), "smoke": args.smoke, "fixed": fixed,
                                              "resized": resized, "accuracy_difference_points": difference}, args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
