"""The Lightning logger a job asks for (spec.logging.logger), one continuous log across gang restarts.

- tensorboard (the default): TensorBoardLogger in <artifacts.dir>/logs/version_0, on the shared storage.
- csv: CSVLogger in <artifacts.dir>/logs/version_0 (metrics.csv, written at every log step and
  appended to after a restart).
- mlflow: MLFlowLogger on spec.logging.mlflowTrackingUri or MLFLOW_TRACKING_URI, experiment
  spec.logging.mlflowExperimentName or the job's name; the run's id is kept in the checkpoint
  directory so that a restarted gang logs into the same run.

With artifacts.dir on object storage, the TensorBoard and CSV files stay on the pod's disk (their
writers do not stream to a bucket) and the MLflow run's id is an object beside the checkpoints.

The version is fixed, not counted up: Lightning's default starts version_1, version_2, ...
at every start, which splits one job's curves into as many runs as it had restarts.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dtrain_common import object_store
from dtrain_common.errors import ConfigError
from dtrain_operator.api import TrainerConfig
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer.config import global_rank
from dtrain_trainer.flavor import Flavor

LOG_NAME = "logs"
LOG_VERSION = "version_0"
MLFLOW_RUN_ID_FILE = ".mlflow-run-id"
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"


def mlflow_run_id_path(config: TrainerConfig) -> str:
    return f"{config.checkpoint_dir.rstrip('/')}/{MLFLOW_RUN_ID_FILE}"


def _log_dir(config: TrainerConfig) -> str:
    if is_object_url(config.artifacts_dir):
        return str(Path(tempfile.gettempdir()) / "dtrain-logs" / config.job_name)
    return config.artifacts_dir


def _read_run_id(location: str) -> str | None:
    if is_object_url(location):
        return object_store.read_text(location)
    path = Path(location)
    return path.read_text().strip() if path.is_file() else None


def build_logger(config: TrainerConfig, pl: Flavor, env: Mapping[str, str]) -> Any:
    settings = config.logging
    save_dir = _log_dir(config)
    if settings.logger == "csv":
        # Written at every log step: a node that dies keeps what it logged.
        return pl.loggers.CSVLogger(
            save_dir=save_dir,
            name=LOG_NAME,
            version=LOG_VERSION,
            flush_logs_every_n_steps=config.trainer.log_every_n_steps,
        )
    if settings.logger == "tensorboard":
        try:
            return pl.loggers.TensorBoardLogger(save_dir=save_dir, name=LOG_NAME, version=LOG_VERSION)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"logging.logger: tensorboard needs the tensorboard package in the image ({exc}); "
                "pip install tensorboard, or set logging.logger: csv"
            ) from None
    uri = settings.mlflow_tracking_uri or env.get(ENV_MLFLOW_TRACKING_URI)
    if not uri:
        raise ConfigError(
            f"logging.mlflowTrackingUri: logger mlflow needs a tracking server; set logging.mlflowTrackingUri "
            f"or {ENV_MLFLOW_TRACKING_URI} (spec.env)"
        )
    run_id = _read_run_id(mlflow_run_id_path(config))
    try:
        return pl.loggers.MLFlowLogger(
            experiment_name=settings.mlflow_experiment_name or config.job_name,
            run_name=config.job_name,
            tracking_uri=uri,
            run_id=run_id or None,
        )
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"logging.logger: mlflow needs the mlflow (or mlflow-skinny) package in the image ({exc}); "
            "pip install mlflow-skinny"
        ) from None


def continue_csv_log(logger: Any) -> None:
    """Rank 0: Lightning's CSV writer deletes the metrics.csv of an earlier start; put it back and continue it."""
    path = Path(logger.log_dir) / "metrics.csv"
    previous = path.read_text() if path.is_file() else ""
    writer = logger.experiment  # creating the writer deletes the file
    if previous.strip():
        path.write_text(previous)
        # The writer rewrites the file whenever a new column appears; it must know the old ones.
        writer.metrics_keys = previous.splitlines()[0].split(",")


def continue_log(logger: Any, config: TrainerConfig) -> None:
    """Rank 0, before training: make the logger continue what an earlier start of the job logged."""
    if config.logging.logger == "mlflow":
        remember_mlflow_run(logger, config)
    elif config.logging.logger == "csv":
        continue_csv_log(logger)


def remember_mlflow_run(logger: Any, config: TrainerConfig) -> None:
    """Rank 0: keep the MLflow run's id beside the checkpoints, for the restarted gang to log into."""
    location = mlflow_run_id_path(config)
    if _read_run_id(location):
        return
    run_id = getattr(logger, "run_id", None)  # creates the run on the tracking server
    if not run_id:
        return
    if is_object_url(location):
        object_store.put_bytes(location, f"{run_id}\n".encode())
        return
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(run_id) + "\n")


def configure_logging(env: Mapping[str, str]) -> None:
    """The trainer's own log lines on stderr, each with its rank."""
    handler = logging.StreamHandler(sys.stderr)
    rank = f"[rank {global_rank(env)}]" if "RANK" in env else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s dtrain{rank} %(levelname)s %(message)s"))
    logger = logging.getLogger("dtrain_trainer")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)


def silence_expected_warnings() -> None:
    """Warnings that say what dtrain does on purpose: a person can act on none of them."""
    # Resuming into the directory that holds the checkpoints is the point, not a mistake.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # One log per job: after a restart the logger continues the files it wrote (build_logger).
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
    # ImageFolderDataModule without val_dir returns no validation loaders, on purpose.
    warnings.filterwarnings("ignore", message=r"Total length of `list` across ranks is zero")
    # Lightning's use of a torch API that torch deprecated; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
