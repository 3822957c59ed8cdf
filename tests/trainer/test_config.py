"""The checks that run before anything trains: config file, launch environment, precision, progress interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain_common.config import load_config, parse_config
from dtrain_common.errors import ConfigError
from dtrain_operator.api import TrainerConfig, contract
from dtrain_trainer.config import (
    Topology,
    check_launch_environment,
    config_path,
    cpu_fallback,
    launch_topology,
    progress_interval,
    resolve_precision,
)


def a_config(**fields: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"jobName": "j", "accelerator": "cpu", **fields})


TORCHRUN_2x2 = {
    contract.ENV_NNODES: "2",
    contract.ENV_NPROC_PER_NODE: "2",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "RANK": "3",
    "LOCAL_RANK": "1",
}


def test_the_gangs_shape_comes_from_torchrun() -> None:
    """One route: the config has no nodes or devicesPerNode to disagree with torchrun's environment."""
    assert check_launch_environment(a_config(), TORCHRUN_2x2, visible_gpus=0) == Topology(nodes=2, devices_per_node=2)
    assert launch_topology(TORCHRUN_2x2).world_size == 4
    assert "nodes" not in a_config().to_wire() and "devicesPerNode" not in a_config().to_wire()


def test_single_process_without_torchrun_passes() -> None:
    assert check_launch_environment(a_config(), {}, visible_gpus=0) == Topology(nodes=1, devices_per_node=1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE is 'two', not a whole number"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"}, "WORLD_SIZE 4 is not a whole number of nodes of LOCAL_WORLD_SIZE 3"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE 0 is not a whole number of nodes"),
    ],
)
def test_a_launch_environment_that_cannot_be_a_gang_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_launch_environment(a_config(), env, visible_gpus=0)


def test_gpu_accelerator_without_any_cuda_device_trains_on_the_cpu_and_says_so() -> None:
    """As `dtrain run` does: a node whose GPUs are counted but not exposed (make cluster GPUS_PER_NODE=N)."""
    config, warning = cpu_fallback(a_config(accelerator="gpu"), visible_gpus=0)
    assert config.accelerator == "cpu"
    assert warning is not None and "sees no CUDA device" in warning and "training on the CPU" in warning
    seen = a_config(accelerator="gpu")
    assert cpu_fallback(seen, visible_gpus=1) == (seen, None)  # some, too few: check_launch_environment says so
    assert cpu_fallback(a_config(), visible_gpus=0) == (a_config(), None)


def test_gpu_accelerator_needs_visible_gpus() -> None:
    config = a_config(accelerator="gpu")
    with pytest.raises(ConfigError, match="sees 1 CUDA device"):
        check_launch_environment(config, {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, visible_gpus=1)
    check_launch_environment(config, {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, visible_gpus=2)


@pytest.mark.parametrize(
    ("asked", "accelerator", "runs", "warns"),
    [
        ("16-mixed", "cpu", "32-true", True),
        ("16-mixed", "gpu", "16-mixed", False),
        # `dtrain run` of a gpu job on a machine without one runs it on the cpu, and says 16-true falls back.
        ("16-true", "cpu", "32-true", True),
        ("16-true", "gpu", "16-true", False),
        ("bf16-mixed", "cpu", "bf16-mixed", False),
        ("32-true", "cpu", "32-true", False),
    ],
)
def test_precision(asked: str, accelerator: str, runs: str, warns: bool) -> None:
    precision, warning = resolve_precision(asked, accelerator)
    assert precision == runs
    assert (warning is not None) == warns
    if warning:
        assert f"{asked} needs a CUDA GPU" in warning and "32-true" in warning


def test_progress_interval() -> None:
    assert progress_interval({}) == contract.DEFAULT_PROGRESS_INTERVAL_SECONDS
    assert progress_interval({contract.ENV_PROGRESS_INTERVAL: "2.5"}) == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ConfigError, match=contract.ENV_PROGRESS_INTERVAL):
            progress_interval({contract.ENV_PROGRESS_INTERVAL: bad})


def test_config_path_prefers_the_flag() -> None:
    assert config_path("a.yaml", {contract.ENV_CONFIG: "b.yaml"}) == Path("a.yaml")
    assert config_path(None, {contract.ENV_CONFIG: "b.yaml"}) == Path("b.yaml")
    with pytest.raises(ConfigError, match="--config FILE or set DTRAIN_CONFIG"):
        config_path(None, {})


def test_parse_config_names_each_bad_field() -> None:
    with pytest.raises(ConfigError) as error:
        parse_config("jobName: j\ntrainer: {maxStep: 3, batchSize: 0}\n", "c.yaml")
    message = str(error.value)
    assert "c.yaml: trainer.maxStep: unknown field; did you mean 'maxSteps'?" in message
    assert "c.yaml: trainer.batchSize:" in message


def test_parse_config_yaml_errors_have_a_position() -> None:
    with pytest.raises(ConfigError, match=r"^c.yaml:\d+:\d+: YAML syntax error"):
        parse_config("jobName: j\ntrainer: {maxSteps: 3\n", "c.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config("- a\n", "c.yaml")


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "nope.yaml")
