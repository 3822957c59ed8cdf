"""`python -m dtrain_trainer`: what each worker process runs under torchrun, in a pod or under `dtrain run`.

Order of work: read the config, and the gang's shape from torchrun's environment; build the model and
the data module; build Lightning's Trainer (DDP, Lightning detects TorchElasticEnvironment
from torchrun's variables); resume from the newest checkpoint; train; then rank 0
exports and checks the ONNX model while every other rank waits, so that the job's
success means its artifacts exist.

Exit codes: 0 success; contract.TRAINER_EXIT_INVALID_CONFIG (78) for an error that no
restart can cure - a setting the trainer cannot run with, a class that does not import or
refuses its initArgs, a checkpoint or artifacts directory it cannot write, a model it
cannot export, a full disk - with one line that names it (the restart policy fails the job
at once on this code); 143 stopped by SIGTERM after saving a checkpoint of the step every
rank stopped at (see `stopping`). An export that fails after training does not fail the
process (training succeeded; a restart would only train again): it exits 0 with the
exporter's message under `exportError` in its results. Other failures keep their traceback.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch

from dtrain_common.config import load_config
from dtrain_common.errors import ConfigError
from dtrain_common.loading import instantiate
from dtrain_operator.api import TrainerConfig, contract
from dtrain_operator.api.records import Event
from dtrain_operator.api.results import TrainerResults
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer import artifact_store, checkpoint_store, flavor, hang_watch, preflight
from dtrain_trainer.checkpoint_store import LAST_POINTER
from dtrain_trainer.checkpointing import (
    LAST_CHECKPOINT,
    _StepCheckpointBehaviour,
    atomic_checkpoint_io_class,
    check_writable,
    find_resume_checkpoint,
    step_checkpoint_class,
)
from dtrain_trainer.config import (
    check_launch_environment,
    config_path,
    cpu_fallback,
    global_rank,
    is_first_process_of_node,
    launch_topology,
    progress_interval,
    resolve_precision,
)
from dtrain_trainer.elastic_data import at_gang_size, elastic_order
from dtrain_trainer.example_inputs import ExampleInputs, resolve_example
from dtrain_trainer.export import ExportError, export_artifacts, write_termination_log
from dtrain_trainer.loading import instantiate_data, job_classes
from dtrain_trainer.logs import build_logger, configure_logging, continue_log, silence_expected_warnings
from dtrain_trainer.progress import ProgressReporter
from dtrain_trainer.progress_callback import _ProgressBehaviour, progress_callback_class
from dtrain_trainer.progress_sinks import NullSink, sink_from_env
from dtrain_trainer.resumable import exact_resume_callbacks, resumable
from dtrain_trainer.stopping import STOP_SIGNAL, STOPPED_EXIT_CODE, _GracefulStopBehaviour, graceful_stop_class
from dtrain_trainer.stragglers import step_measures
from dtrain_trainer.survivor import survivor_checkpoint_class

log = logging.getLogger("dtrain_trainer")

EXIT_OK = 0
EXIT_CONFIG_ERROR = contract.TRAINER_EXIT_INVALID_CONFIG


def _step_checkpoint(config: TrainerConfig, reporter: ProgressReporter, package: str) -> Any:
    """The step-checkpoint callback, reporting each save or miss (stopping on a miss if onWriteFailure is Fail)."""
    stop_on_miss = config.checkpoint.on_write_failure == "Fail"
    return step_checkpoint_class(package)(
        dirpath=config.checkpoint_dir,
        every_n_steps=config.checkpoint.every_n_steps,
        keep_last=config.checkpoint.keep_last,
        on_saved=lambda step, path, upload, survivor: checkpoint_store.report_saved(reporter, step, path, upload, survivor),
        on_failed=lambda step, upload: checkpoint_store.report_failed(reporter, step, upload, stop=stop_on_miss),
    )


def build_trainer(
    config: TrainerConfig,
    reporter: ProgressReporter | None = None,
    package: str = flavor.LIGHTNING,
    env: Mapping[str, str] = os.environ,
) -> L.Trainer:
    """Lightning's Trainer for `config`, with dtrain's checkpoint and progress callbacks.

    `package` is the Lightning package the model and data module are built on
    (lightning.pytorch or pytorch_lightning): the Trainer and every callback come from it."""
    topology = launch_topology(env)
    pl = flavor.flavor(package)
    reporter = reporter or ProgressReporter(NullSink(), math.inf)
    settings = config.trainer
    on_gpu = config.accelerator == "gpu"
    precision, warning = resolve_precision(settings.precision, config.accelerator)
    if warning:
        log.warning(warning)
        reporter.event(Event.WARNING, message=warning)
    collective_timeout = timedelta(seconds=config.nccl.timeout_seconds)
    strategy = pl.strategies.DDPStrategy(
        find_unused_parameters=settings.find_unused_parameters,
        timeout=collective_timeout,
        process_group_backend="nccl" if on_gpu else "gloo",
        gradient_as_bucket_view=True,
    )
    progress = progress_callback_class(package)(
        reporter, default_batch_size=settings.batch_size, metric_names=config.logging.metrics
    )
    checkpoint = _step_checkpoint(config, reporter, package)
    checkpoint_io = atomic_checkpoint_io_class(package)()
    checkpoint_io.on_writing = progress.checkpoint_writing
    checkpoint_io.owner = checkpoint_store.owner_of(config).to_wire()
    stop = graceful_stop_class(package)(collective_timeout)
    meter, straggler, loader_wait = step_measures(package, config, progress)
    return pl.Trainer(  # type: ignore[no-any-return]
        accelerator="gpu" if on_gpu else "cpu",
        devices=topology.devices_per_node,
        num_nodes=topology.nodes,
        strategy=strategy,
        precision=precision,  # type: ignore[arg-type]
        gradient_clip_val=settings.gradient_clip_val,
        gradient_clip_algorithm=settings.gradient_clip_algorithm,
        accumulate_grad_batches=settings.accumulate_grad_batches,
        max_epochs=settings.resolved_max_epochs,
        max_steps=settings.max_steps,
        log_every_n_steps=settings.log_every_n_steps,
        limit_train_batches=settings.limit_train_batches,
        # The meter's first, so that its clock reads a step's end before any other callback's work; then the
        # survivor's: it copies the state at each step boundary before any other callback moves on.
        callbacks=[meter, survivor_checkpoint_class(package)(), *exact_resume_callbacks(package, elastic_order(config, env)),
                   straggler, progress, stop, checkpoint],
        plugins=[checkpoint_io],
        profiler=loader_wait,
        logger=build_logger(config, pl, env),
        default_root_dir=config.checkpoint_dir,
        # Progress goes through the sink; a terminal progress bar only floods pod logs.
        enable_progress_bar=False,
        benchmark=on_gpu,
    )


def check_model_matches_data(model: Any, data: Any) -> None:
    model_classes, data_classes = getattr(model, "num_classes", None), getattr(data, "num_classes", None)
    if isinstance(model_classes, int) and isinstance(data_classes, int) and model_classes != data_classes:
        raise ConfigError(
            f"model.initArgs.num_classes is {model_classes} but the data has {data_classes} classes; make them equal"
        )


def _progress_callback(trainer: L.Trainer) -> _ProgressBehaviour:
    return next(c for c in trainer.callbacks if isinstance(c, _ProgressBehaviour))  # type: ignore[attr-defined]


def _export_on_rank_zero(
    trainer: L.Trainer,
    config: TrainerConfig,
    model: L.LightningModule,
    inputs: ExampleInputs,
    metrics: Mapping[str, Any],
    reporter: ProgressReporter,
) -> tuple[bool, dict[str, Any]]:
    """Rank 0 exports; every rank returns rank 0's outcome (the broadcast is the barrier)."""
    outcome: dict[str, Any] = {}
    ok = True
    if trainer.is_global_zero:
        onnx = config.export.onnx
        # The job's phase becomes Exporting: a large model's export and check take minutes.
        total_steps = _progress_callback(trainer).total_steps
        reporter.progress(stage=contract.PROGRESS_STAGE_EXPORTING, totalSteps=total_steps, **metrics)
        try:
            record = artifact_store.export_to(
                config.artifacts_dir,
                _latest_checkpoint(trainer, config),
                lambda directory, checkpoint: export_artifacts(
                    model, inputs, onnx.opset, onnx.dynamic_batch, directory, config.job_name, metrics, checkpoint,
                    model_class=config.model.to_wire(),
                ),
            )
            outcome = {
                "onnx": record["onnx"]["path"],
                "sha256": record["onnx"]["sha256"],
                "parityError": record["parity"]["maxRelativeError"],
                "artifacts": artifact_store.join(config.artifacts_dir, contract.ARTIFACTS_FILE_NAME),
            }
            reporter.event(
                Event.EXPORT, ok=True, tolerance=record["parity"]["tolerance"], error=None, **outcome
            )
        except Exception as exc:  # other ranks wait in the broadcast below: never leave them hanging
            if isinstance(exc, ExportError):
                message = str(exc)
            else:
                log.exception("the export failed")
                message = f"the export failed: {type(exc).__name__}: {exc}"
            log.error(message)
            reporter.event(Event.EXPORT, ok=False, error=message)
            ok, outcome = False, {contract.RESULTS_KEY_EXPORT_ERROR: message}
    ok = bool(trainer.strategy.broadcast(ok, src=0))
    return ok, outcome


def _checkpoint_callback(trainer: L.Trainer) -> _StepCheckpointBehaviour:
    return next(c for c in trainer.callbacks if isinstance(c, _StepCheckpointBehaviour))  # type: ignore[attr-defined]


def _latest_checkpoint(trainer: L.Trainer, config: TrainerConfig) -> str:
    """The newest checkpoint saved whole: on object storage the step checkpoint last.json names, else last.ckpt."""
    if is_object_url(config.checkpoint_dir):
        return _checkpoint_callback(trainer).latest_path or artifact_store.join(config.checkpoint_dir, LAST_POINTER)
    return str(Path(config.checkpoint_dir) / LAST_CHECKPOINT)


def _resume_checkpoint(trainer: L.Trainer, config: TrainerConfig, reporter: ProgressReporter) -> str | None:
    """The checkpoint to resume from, if it is this job's (or the spec says to take it all the same)."""
    located = find_resume_checkpoint(config.checkpoint_dir)
    if located is None:
        return None
    found = str(located)
    checkpoint_io = trainer.strategy.checkpoint_io
    resume, warning = checkpoint_store.decide_resume(checkpoint_io.preload(found), found, config)  # type: ignore[attr-defined]
    if warning:
        log.warning(warning)
        reporter.event(Event.WARNING, message=warning)
    if not resume:
        checkpoint_io.forget_preloaded()  # type: ignore[attr-defined]
        return None
    return found


def run(config: TrainerConfig, env: Mapping[str, str]) -> int:
    """Train (resuming when a checkpoint exists), then export. Raises ConfigError for bad settings."""
    visible_gpus = torch.cuda.device_count() if config.accelerator == "gpu" else 0
    config, fallback = cpu_fallback(config, visible_gpus)
    topology = check_launch_environment(config, env, visible_gpus)
    config = at_gang_size(config, topology)
    sink = sink_from_env(env, config.job_name) if global_rank(env) == 0 else NullSink()
    reporter = ProgressReporter(sink, progress_interval(env))
    if fallback:
        reporter.event(Event.WARNING, message=fallback)
    try:
        # Before the model is built: a broken network fails here, at once, not as a hang.
        checked = preflight.run(env, config.accelerator, topology.devices_per_node, config.nccl.preflight_timeout_seconds)
        if checked is not None:
            reporter.event(Event.PREFLIGHT, **checked)
        return _train_and_export(config, env, reporter)
    except ConfigError as exc:
        reporter.event(Event.ERROR, message=str(exc))
        raise
    except Exception as exc:
        reporter.event(Event.ERROR, message=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        reporter.close()


def _train_and_export(config: TrainerConfig, env: Mapping[str, str], reporter: ProgressReporter) -> int:
    settings = config.trainer
    pl, model_cls, data_cls = job_classes(config.model, config.data)
    pl.seed_everything(settings.seed, workers=True, verbose=False)
    model = instantiate(config.model, "model", pl.LightningModule, cls=model_cls)
    data = instantiate_data(config.data, pl, data_cls, settings.batch_size, settings.num_workers)
    check_model_matches_data(model, data)
    resumable(data, elastic_order(config, env))
    check_writable(config.checkpoint_dir, "checkpoint.dir")
    if global_rank(env) == 0:
        check_writable(config.artifacts_dir, "artifacts.dir")
    onnx = config.export.onnx
    inputs = resolve_example(onnx.input_shape, onnx.input_dtype, data, model) if onnx.enabled else None
    if config.accelerator == "gpu":
        # TF32 matmuls on Ampere and newer: the usual choice for training, several times faster than full fp32.
        torch.set_float32_matmul_precision("high")
    trainer = build_trainer(config, reporter, pl.name, env)
    if global_rank(env) == 0:
        continue_log(trainer.logger, config)
    resume = _resume_checkpoint(trainer, config, reporter)
    reporter.event(
        Event.START,
        jobName=config.job_name,
        worldSize=trainer.world_size,
        nodes=trainer.num_nodes,
        devicesPerNode=trainer.num_devices,
        accelerator=config.accelerator,
        precision=str(trainer.precision),
        clusterEnvironment=type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
        maxSteps=settings.max_steps,
        maxEpochs=settings.resolved_max_epochs if settings.resolved_max_epochs > 0 else None,
        resumeFrom=resume,
        lightning=pl.name,
    )
    _fit(trainer, model, data, resume, config, env, reporter)
    metrics = _progress_callback(trainer).final_metrics(trainer)
    stop = next(c for c in trainer.callbacks if isinstance(c, _GracefulStopBehaviour))  # type: ignore[attr-defined]
    # Decided together: a late SIGTERM may reach some ranks only, and one stopping while another exports would wait.
    if stop.any_rank_signalled():
        return _stopped(trainer, config, metrics, reporter, env)
    if trainer.is_global_zero:
        # Training is over: the export and the exit complete no batch; the progress deadline holds from here.
        total_steps = _progress_callback(trainer).total_steps
        reporter.progress(stage=contract.PROGRESS_STAGE_FINISHING, totalSteps=total_steps, **metrics)
    outcome: dict[str, Any] = {}
    if onnx.enabled:
        assert inputs is not None
        # A failed export does not fail the training: a restart would train again only to fail the
        # same way. Training succeeded, its checkpoints stay; the results say why there is no model.onnx.
        _, outcome = _export_on_rank_zero(trainer, config, model, inputs, metrics, reporter)
    if trainer.is_global_zero:
        export_error = outcome.get(contract.RESULTS_KEY_EXPORT_ERROR)
        reporter.event(Event.FINISHED, ok=True, **metrics, **({"exportError": export_error} if export_error else {}))
        write_termination_log(TrainerResults(ok=True, **metrics, **outcome).to_wire(), env)
    _leave_process_group()
    return EXIT_OK


def _fit(
    trainer: L.Trainer, model: Any, data: Any, resume: str | None, config: TrainerConfig, env: Mapping[str, str],
    reporter: ProgressReporter,
) -> None:
    """Train under the hang watch; an error whose fix is a spec field is raised in the spec's terms."""
    progress = _progress_callback(trainer)
    probe = lambda: (progress.batches, progress.holding, trainer.global_step)
    watch = hang_watch.start(config, env, reporter, probe, progress_interval(env))
    try:
        trainer.fit(model, datamodule=data, ckpt_path=resume)
    except RuntimeError as exc:
        spec_error = _in_spec_terms(exc, config.trainer.find_unused_parameters)
        if spec_error is None:
            raise
        raise spec_error from exc
    finally:
        watch.close()


# How DDP (and Lightning on top of it) says that some parameters took no part in the loss.
_UNUSED_PARAMETERS_MARKERS = ("parameters that were not used in producing", "find_unused_parameters")


def _in_spec_terms(exc: RuntimeError, find_unused_parameters: bool) -> ConfigError | None:
    """A training error whose fix is a spec field, named as the spec names it (None for any other error)."""
    if not find_unused_parameters and any(marker in str(exc) for marker in _UNUSED_PARAMETERS_MARKERS):
        return ConfigError(
            "trainer.findUnusedParameters: the model has parameters that take no part in the loss of some steps "
            "(a layer its forward skips, a frozen branch); set trainer.findUnusedParameters: true in the spec "
            "(it costs some speed), or remove or freeze those parameters (requires_grad=False)"
        )
    return None


def _stopped(
    trainer: L.Trainer, config: TrainerConfig, metrics: Mapping[str, Any], reporter: ProgressReporter, env: Mapping[str, str]
) -> int:
    """SIGTERM stopped training (the pod is going away): its checkpoint is saved; no export, exit 143."""
    if trainer.is_global_zero:
        checkpoint = _latest_checkpoint(trainer, config)
        reporter.event(Event.STOPPED, signal=STOP_SIGNAL.name, checkpoint=checkpoint, **metrics)
        write_termination_log(
            TrainerResults(ok=False, stopped=STOP_SIGNAL.name, checkpoint=checkpoint, **metrics).to_wire(), env
        )
    _leave_process_group()
    return STOPPED_EXIT_CODE


def _leave_process_group() -> None:
    """Leave the process group together: a rank that exits while a peer is still tearing down
    its connections can abort the peer ("terminate called without an active exception"),
    which would turn a finished job into a failed node and a needless gang restart."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dtrain_trainer",
        description="Train a DistributedTraining's model (one process of the gang; torchrun starts one per device).",
    )
    parser.add_argument("--config", metavar="FILE", help="the trainer config (default: $DTRAIN_CONFIG)")
    args = parser.parse_args(argv)
    env = os.environ
    configure_logging(env)
    silence_expected_warnings()
    try:
        config = load_config(config_path(args.config, env))
        return run(config, env)
    except ConfigError as exc:
        prefix = f"dtrain[rank {global_rank(env)}]" if "RANK" in env else "dtrain"
        print(f"{prefix}: error: {exc}", file=sys.stderr, flush=True)
        if is_first_process_of_node(env):
            write_termination_log({"ok": False, "error": str(exc)}, env)
        return EXIT_CONFIG_ERROR
