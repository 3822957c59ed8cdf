"""`dtrain submit`, `get`, `watch`, `logs` and `delete`: jobs on a cluster, through `client.Client`.

They follow kubectl's habits: `-n/--namespace` (default: the kubeconfig context's namespace),
`--context`, `--kubeconfig`, `-o json|yaml`, `-A/--all-namespaces` for `get`, `-f` for `logs`.
`watch` draws the live progress display of `dtrain run` (local.display) from the job's status
and ends with the same summary table (local.summary.RunSummary), built from the status.

Exit codes: 0 done (for `watch`: the job succeeded), 1 the job failed or the request was
refused, 2 an invalid job file, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import yaml

from dtrain_operator import api
from dtrain_operator.api import records
from dtrain_operator.api.crd import PRINTER_COLUMNS
from dtrain_operator.api.results import EngineResults, TrainerResults
from dtrain_operator.api.safe_yaml import printable
from dtrain_operator.api.validation import EXIT_INVALID_JOB
from dtrain_operator.client import Client, DtrainError, InvalidJob, ProgressUpdate

EXIT_OK = 0
EXIT_FAILED = 1
WATCH_POLL_SECONDS = 2.0
# `kubectl get dtr`'s columns (the CRD's printer columns), then two of dtrain's own.
GET_COLUMNS = ("NAME", *(column["name"].upper() for column in PRINTER_COLUMNS), "LOSS", "ETA")


# --- Shared -------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    return Client(namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig)


def _fail(error: DtrainError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return EXIT_INVALID_JOB if isinstance(error, InvalidJob) else EXIT_FAILED


def stored(job: api.DistributedTraining) -> dict[str, Any]:
    """The object as the API server holds it (no defaults filled in)."""
    return job.model_dump(by_alias=True, exclude_unset=True, mode="json")


def _print_objects(objects: Any, output: str) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(objects, indent=4) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(objects, sort_keys=False))


# --- Values of the `get` columns ------------------------------------------------------------------


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(created: str | None, now: datetime) -> str:
    """kubectl's age: 45s, 12m, 3h20m, 2d4h."""
    when = _parse_time(created)
    if when is None:
        return "<unknown>"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    days = hours // 24
    return f"{days}d{hours % 24}h" if days < 8 and hours % 24 else f"{days}d"


def total_steps(job: api.DistributedTraining, update: ProgressUpdate) -> int | None:
    """The run's optimizer steps: reported by the trainer, else spec.trainer.maxSteps when set."""
    if update.total_steps:
        return update.total_steps
    max_steps = job.spec.trainer.max_steps
    return max_steps if max_steps > 0 else None


def eta_seconds(job: api.DistributedTraining, update: ProgressUpdate) -> float | None:
    """Time left, from the steps left and the reported images/s over the global batch of one step."""
    total = total_steps(job, update)
    if update.finished or total is None or update.step is None or not update.images_per_second:
        return None
    spec = job.spec
    images_per_step = spec.trainer.batch_size * spec.world_size * spec.trainer.accumulate_grad_batches
    return max(0, total - update.step) * images_per_step / update.images_per_second


def get_row(job: api.DistributedTraining, now: datetime) -> list[str]:
    from dtrain_operator.local.display import format_duration

    update = ProgressUpdate.of(job)
    status = job.status or api.DistributedTrainingStatus()
    created = (job.metadata.model_extra or {}).get("creationTimestamp")
    eta = eta_seconds(job, update)
    progress = status.progress
    cells = {
        "NAME": job.name,
        "PHASE": status.phase or "",
        "NODES": status.nodes_ready or "",
        "EPOCH": "" if update.epoch is None else str(update.epoch),
        "IMG/S": "" if update.images_per_second is None else f"{update.images_per_second:g}",
        "VAL": (progress.validation if progress is not None else None) or "",
        "RESTARTS": str(status.restarts),
        "GOODPUT": "" if status.goodput is None or status.goodput.ratio is None else f"{status.goodput.ratio:.0%}",
        "AGE": age(created, now),
        "LOSS": "" if update.loss is None else f"{update.loss:.4g}",
        "ETA": "" if eta is None else format_duration(eta),
    }
    return [cells[column] for column in GET_COLUMNS]


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns as kubectl prints them: left-aligned, three spaces apart. Every cell as `printable` writes it: the
    status quotes what a job's own code reported, and an administrator's `dtrain get -A` must not run its escapes."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows) + "\n"


# --- The summary, from the status -------------------------------------------------------------------


def summary_from_status(job: api.DistributedTraining) -> Any:
    """The summary table's content (local.summary.RunSummary) from what the status holds."""
    from dtrain_operator.local.summary import LatencyRow, RunSummary

    status = job.status or api.DistributedTrainingStatus()
    update = ProgressUpdate.of(job)
    finished = next((c for c in status.conditions if c.type == status.phase and c.status == "True"), None)
    start, end = _parse_time(status.start_time), _parse_time(status.completion_time)
    wall = ((end or datetime.now(timezone.utc)) - start).total_seconds() if start else 0.0
    # status.artifacts merges the trainer's and the engine's termination results.
    trainer = TrainerResults.read(status.artifacts or {}) or TrainerResults()
    engine = EngineResults.read(status.artifacts or {})
    breakdown = status.progress.step_breakdown if status.progress else None
    spec = job.spec
    summary = RunSummary(
        job_name=job.name,
        phase=status.phase or "Pending",
        reason=finished.reason if finished and status.phase != "Succeeded" else "",
        message=finished.message if finished else "",
        nodes=spec.nodes,
        devices_per_node=spec.devices_per_node,
        accelerator=spec.accelerator,
        restarts=status.restarts,
        restarts_ignoring_backoff=status.restarts_ignoring_backoff,
        wall_seconds=wall,
        workdir="",
        steps=update.step if update.step is not None else trainer.step,
        epoch=update.epoch,
        final_loss=trainer.loss if trainer.loss is not None else update.loss,
        images_per_second=trainer.images_per_second or update.images_per_second,
        checkpoint=status.last_checkpoint.path if status.last_checkpoint else None,
        onnx=trainer.onnx,
        onnx_parity_error=trainer.parity_error,
        engine_asked=spec.engine.enabled,
        engine_backend=engine.backend if engine else None,
        engine_path=engine.engine if engine else None,
        engine_note=engine.message if engine else None,
        engine_report=engine.report if engine else None,
        metrics=dict(update.metrics),
        last_hang=status.last_hang.message if status.last_hang else None,
        goodput=status.goodput.model_dump(include={"ratio", "seconds"}) if status.goodput else None,
        step_breakdown=breakdown.model_dump(by_alias=True, exclude_none=True, mode="json") if breakdown else None,
        command="dtrain watch",
    )
    for row in (engine.latency if engine else None) or []:
        # [batch, median ms, p99 ms, images/s, speed-up over PyTorch]
        if len(row) >= 5 and isinstance(row[0], int):
            median, speedup = row[1], row[4]
            eager = median * speedup if median is not None and speedup is not None else None
            summary.latency.append(LatencyRow(batch=row[0], latency_ms=median, eager_ms=eager))
    return summary


def progress_record(update: ProgressUpdate) -> dict[str, Any]:
    """A status observation as the trainer's progress record, the input of local.display."""
    return records.ProgressRecord(
        epoch=update.epoch,
        step=update.step,
        total_steps=update.total_steps,
        loss=update.loss,
        images_per_second=update.images_per_second,
        epoch_end=False,
    ).to_wire()


# --- The commands ---------------------------------------------------------------------------------


def memory_estimate(job: api.DistributedTraining) -> tuple[dict[str, str], str, bool]:
    """The memory-estimate annotation for a GPU job, a line about it, and whether that line is for stderr.

    The operator cannot build the model (no torch in its image), so the estimate is made here, where
    the trainer extra is installed, and recorded on the object (api/memory_estimate.py)."""
    if job.spec.accelerator != "gpu":
        return {}, "", False
    try:
        from dtrain_trainer.memory_report import submit_annotation
    except ImportError as exc:
        return {}, (
            f"note: no memory estimate recorded: {exc.name or 'the trainer extra'} is not installed here "
            "(pip install 'dtrain[trainer]' for one; --no-estimate skips it)"
        ), True
    return submit_annotation(job)


def submit(args: argparse.Namespace) -> int:
    try:
        job = Client.validate(args.file)
        client = _client(args)
        spec = job.spec
        batch = spec.trainer.batch_size * spec.world_size * spec.trainer.accumulate_grad_batches
        _children_on_server(client, job, args.namespace)
        annotations, memory_line, to_stderr = ({}, "", False) if args.no_estimate else memory_estimate(job)
        created = client.submit(args.file, annotations=annotations)
    except DtrainError as error:
        return _fail(error)
    # With -o, stdout carries only the object.
    memory_out = sys.stderr if args.output or to_stderr else sys.stdout
    if args.output:
        _print_objects(stored(created), args.output)
    else:
        print(
            f"distributedtraining.dtrain.dev/{created.name} created in namespace {created.namespace}: "
            f"{spec.nodes} node(s) x {spec.devices_per_node} {spec.accelerator} process(es), global batch {batch}"
        )
    if memory_line:
        print(memory_line, file=memory_out)
    if not args.output:
        print(f"follow it with: dtrain watch {created.name} -n {created.namespace}")
    return EXIT_OK


def _children_on_server(client: Client, job: api.DistributedTraining, namespace: str | None) -> None:
    """Before the job is created: InvalidJob when the API server refuses a child the operator would create for
    it (a dry run of each, cli.server_verdict); its warnings printed."""
    from dtrain_operator.cli.server_verdict import in_namespace, server_verdict

    job, _ = in_namespace(job, {}, namespace or client.namespace)
    verdict = server_verdict(client, job)
    for line in [*verdict.warnings, verdict.note(job.namespace)]:
        if line:
            print(f"warning: {line}", file=sys.stderr)
    if verdict.refusals:
        raise InvalidJob(verdict.refusals)


def get(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
        if args.name:
            jobs = [client.get(args.name)]
        else:
            jobs = client.list(all_namespaces=args.all_namespaces)
    except DtrainError as error:
        return _fail(error)
    if args.output:
        if args.name:
            _print_objects(stored(jobs[0]), args.output)
        else:
            _print_objects({"apiVersion": "v1", "kind": "List", "items": [stored(j) for j in jobs],
                            "metadata": {"resourceVersion": ""}}, args.output)
        return EXIT_OK
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"{client.namespace} namespace"
        print(f"No resources found in {where}.", file=sys.stderr)
        return EXIT_OK
    now = datetime.now(timezone.utc)
    header = list(GET_COLUMNS)
    rows = [get_row(job, now) for job in jobs]
    if args.all_namespaces:
        header = ["NAMESPACE", *header]
        rows = [[job.namespace, *row] for job, row in zip(jobs, rows)]
    sys.stdout.write(table([header, *rows]))
    if args.name:
        sys.stdout.write(detail_lines(jobs[0]))
    return EXIT_OK


def detail_lines(job: api.DistributedTraining) -> str:
    """Below one job's row: what limits its steps (status.progress.stepBreakdown), and where its latest hang sat
    (status.lastHang), if it ever hung."""
    status = job.status
    breakdown = status.progress.step_breakdown if status and status.progress else None
    hang = status.last_hang if status else None
    lines = []
    if breakdown is not None and breakdown.bottleneck:
        lines.append(f"Bottleneck (step {breakdown.step}): {breakdown.bottleneck}")
    if hang is not None and hang.message:
        lines.append(f"Last hang ({hang.time}, step {hang.step}): {hang.message}")
    return "".join("\n" + printable(line) for line in lines) + "\n" if lines else ""


def watch(args: argparse.Namespace) -> int:
    from dtrain_operator.local.display import Display

    display = Display.for_stream(sys.stdout)
    try:
        client = _client(args)
        job = client.get(args.name)
        display.info(
            f"{job.name} in {job.namespace}: {job.spec.nodes} node(s) x {job.spec.devices_per_node} "
            f"{job.spec.accelerator} process(es); {client.credentials}"
        )
        phase: str | None = None
        updates = client.progress(args.name, interval=args.interval)
        while True:
            update = next(updates, None)
            if update is None:
                break
            job = update.job
            started = _parse_time(job.status.start_time if job.status else None)
            if started is not None:  # elapsed is the job's, not this command's
                age_seconds = (datetime.now(timezone.utc) - started).total_seconds()
                display.view.started = time.monotonic() - max(0.0, age_seconds)
            if update.phase != phase:
                display.progress_done()
                display.info(f"phase {update.phase or 'Pending'}" + (f" (restarts {update.restarts})" if update.restarts else ""))
                phase = update.phase
            if update.step is not None and not update.finished:
                display.progress(progress_record(update), update.restarts)
            display.tick()
    except DtrainError as error:
        display.progress_done()
        return _fail(error)
    display.summary(summary_from_status(job))
    return EXIT_OK if job.status and job.status.phase == "Succeeded" else EXIT_FAILED


def logs(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
        if args.follow:
            for line in client.stream_logs(args.name, rank=args.rank, tail_lines=args.tail):
                print(line, flush=True)
        else:
            sys.stdout.write(client.logs(args.name, rank=args.rank, tail_lines=args.tail, previous=args.previous))
    except DtrainError as error:
        return _fail(error)
    return EXIT_OK


def delete(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
        for name in args.names:
            client.delete(name, wait=args.wait)
            print(f'distributedtraining.dtrain.dev "{name}" deleted')
    except DtrainError as error:
        return _fail(error)
    return EXIT_OK
