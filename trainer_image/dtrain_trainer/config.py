"""The trainer's inputs: where its config file is and torchrun's environment, checked before anything starts.

The file itself is read by dtrain_common.config, which the engine builder shares.

Everything here is a pure decision over values (a path, an environment mapping,
a count of visible GPUs), so that a wrong setting fails in the first second with one
line that names it, not an hour later inside a collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dtrain_common.errors import ConfigError
from dtrain_operator.api import TrainerConfig, contract


def config_path(cli_path: str | None, env: Mapping[str, str]) -> Path:
    """--config wins over DTRAIN_CONFIG; one of them is needed."""
    path = cli_path or env.get(contract.ENV_CONFIG)
    if not path:
        raise ConfigError(f"no config: pass --config FILE or set {contract.ENV_CONFIG}")
    return Path(path)


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} is {raw!r}, not a whole number; torchrun sets it from the job's spec") from None


@dataclass(frozen=True)
class Topology:
    """The gang's shape as torchrun launched this process: the only route it takes to the trainer."""

    nodes: int
    devices_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


def launch_topology(env: Mapping[str, str]) -> Topology:
    """From torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE; one process when torchrun did not start this one."""
    world = _int_var(env, "WORLD_SIZE")
    world = 1 if world is None else world
    local = _int_var(env, "LOCAL_WORLD_SIZE")
    local = world if local is None else local
    if world < 1 or local < 1 or world % local:
        raise ConfigError(
            f"WORLD_SIZE {world} is not a whole number of nodes of LOCAL_WORLD_SIZE {local} processes: "
            "start the trainer with torchrun, as the operator and `dtrain run` do"
        )
    return Topology(nodes=world // local, devices_per_node=local)


def cpu_fallback(config: TrainerConfig, visible_gpus: int) -> tuple[TrainerConfig, str | None]:
    """accelerator gpu in a process that sees no CUDA device at all trains on the CPU (gloo), with a
    warning, as `dtrain run` does on a machine without CUDA: a node whose GPUs the scheduler counts
    but whose runtime exposes none (`make cluster GPUS_PER_NODE=N`, or a broken device plugin) still
    trains, and says so. Some devices but fewer than the node's processes stays an error
    (check_launch_environment): that is a pod asking for the wrong count."""
    if config.accelerator != "gpu" or visible_gpus > 0:
        return config, None
    return config.model_copy(update={"accelerator": "cpu"}), (
        "accelerator is gpu but this pod sees no CUDA device: training on the CPU (gloo). "
        "On a GPU node, check the NVIDIA container runtime and device plugin"
    )


def check_launch_environment(config: TrainerConfig, env: Mapping[str, str], visible_gpus: int) -> Topology:
    """The gang's shape from torchrun's environment, or a ConfigError when this process cannot train in it."""
    topology = launch_topology(env)
    if config.accelerator == "gpu" and visible_gpus < topology.devices_per_node:
        raise ConfigError(
            f"accelerator is gpu with {topology.devices_per_node} process(es) per node (devicesPerNode), but this "
            f"process sees {visible_gpus} CUDA device(s); request the GPUs for the pod, or set accelerator: cpu"
        )
    return topology


def resolve_precision(precision: str, accelerator: str) -> tuple[str, str | None]:
    """The precision Lightning runs with, and a warning when it differs from the one asked for."""
    if precision == "16-mixed" and accelerator == "cpu":
        return "32-true", (
            "precision 16-mixed needs a CUDA GPU (fp16 autocast with a gradient scaler) and the accelerator is cpu: "
            "training runs in 32-true instead (bf16-mixed runs on a CPU, but slowly)"
        )
    if precision == "16-true" and accelerator == "cpu":
        return "32-true", (
            "precision 16-true needs a CUDA GPU (many CPU kernels have no float16 version) and the accelerator is "
            "cpu: training runs in 32-true instead (bf16-true runs on a CPU, but slowly)"
        )
    return precision, None


def progress_interval(env: Mapping[str, str]) -> float:
    raw = env.get(contract.ENV_PROGRESS_INTERVAL)
    if raw is None or raw == "":
        return contract.DEFAULT_PROGRESS_INTERVAL_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"{contract.ENV_PROGRESS_INTERVAL} is {raw!r}; use a number of seconds >= 0")
    return seconds


def global_rank(env: Mapping[str, str]) -> int:
    """This process's rank as torchrun sets it (0 when not launched by torchrun)."""
    return _int_var(env, "RANK") or 0


def is_first_process_of_node(env: Mapping[str, str]) -> bool:
    return (_int_var(env, "LOCAL_RANK") or 0) == 0
