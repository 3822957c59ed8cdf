"""Bad configs: one clear line each on stderr, naming the field, exit code 2, no traceback.

Most cases call the entry point's `main` in this process (every one of them fails before
a Trainer exists); one runs the real `python -m dtrain_trainer` to see the whole output.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api import contract
from dtrain_trainer.checkpointing import check_writable
from dtrain_trainer.runner import EXIT_CONFIG_ERROR, main

from .conftest import USER_CODE, run_trainer, trainer_config, write_config

BUILTIN_MODEL = {"classPath": "ImageClassifier", "initArgs": {"arch": "resnet18", "num_classes": 4}}


@pytest.fixture(autouse=True)
def clean_launch_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in list(contract.RESERVED_ENV_NAMES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(contract.ENV_PROGRESS_SINK, f"jsonl:{tmp_path / 'progress.jsonl'}")
    monkeypatch.syspath_prepend(str(USER_CODE))
    # main() points the trainer's log at this test's captured stderr; later tests must not inherit it.
    logger = logging.getLogger("dtrain_trainer")
    handlers = logger.handlers[:]
    yield
    logger.handlers[:] = handlers


def fails_with(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == EXIT_CONFIG_ERROR, err
    assert len(lines) == 1, err
    assert lines[0].startswith("dtrain: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in err
    return lines[0]


CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    (
        "module that does not import",
        {"model": {"classPath": "nosuchpackage.Model"}},
        ("model.classPath: cannot import 'nosuchpackage'", "PYTHONPATH"),
    ),
    (
        "class not in the module",
        {"model": {"classPath": "dtrain_test_user.TinyClasifier"}},
        ("model.classPath: module 'dtrain_test_user' has no 'TinyClasifier'", "did you mean dtrain_test_user.TinyClassifier?"),
    ),
    (
        "class of the wrong kind",
        {"model": {"classPath": "dtrain_trainer.data.SyntheticImageDataModule"}},
        ("model.classPath: dtrain_trainer.data.SyntheticImageDataModule is not a LightningModule subclass",),
    ),
    (
        "not a class at all",
        {"data": {"classPath": "dtrain_test_user.CRASH_EXIT_CODE"}},
        ("data.classPath: dtrain_test_user.CRASH_EXIT_CODE is not a class (found int 17)",),
    ),
    (
        "unknown bare name",
        {"model": {"classPath": "ImageClasifier"}},
        ("model.classPath: 'ImageClasifier' is neither a built-in", "did you mean ImageClassifier?"),
    ),
    (
        "init argument the class does not take",
        {"model": {"classPath": "ImageClassifier", "initArgs": {"arch": "resnet18", "num_class": 4}}},
        ("model.initArgs.num_class: ImageClassifier takes no argument 'num_class'", "did you mean 'num_classes'?"),
    ),
    (
        "init argument with a bad value",
        {"model": {"classPath": "ImageClassifier", "initArgs": {"arch": "resnet5O"}}},
        ("model.initArgs: ImageClassifier: arch 'resnet5O' is not a torchvision classification model", "resnet50"),
    ),
    (
        "required init argument missing",
        {"data": {"classPath": "dtrain_trainer.data.ImageFolderDataModule"}},
        ("data.initArgs: ImageFolderDataModule needs 'train_dir'",),
    ),
    (
        "data set directory missing",
        {"data": {"classPath": "dtrain_trainer.data.ImageFolderDataModule", "initArgs": {"train_dir": "/no/such/dir"}}},
        ("data.initArgs: ImageFolderDataModule: train_dir '/no/such/dir' is not a directory",),
    ),
    (
        "batch size set twice",
        {"data": {"classPath": "SyntheticImageDataModule", "initArgs": {"batch_size": 4}}},
        ("data.initArgs.batch_size: set trainer.batchSize instead",),
    ),
    (
        "model and data disagree on classes",
        {"model": BUILTIN_MODEL, "data": {"classPath": "SyntheticImageDataModule", "initArgs": {"num_classes": 10}}},
        ("model.initArgs.num_classes is 4 but the data has 10 classes",),
    ),
    (
        "unknown trainer field",
        {"trainer": {"maxStep": 3}},
        ("trainer.maxStep: unknown field; did you mean 'maxSteps'?",),
    ),
]


@pytest.mark.parametrize(("sections", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    config = trainer_config(tmp_path)
    config.update(sections)  # whole sections, so that a case states all of what it is about
    fails_with(capsys, ["--config", str(write_config(tmp_path, config))], *fragments)


def test_export_needs_an_input_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A data module without sample_shape, and a model without example_input_array.
    (tmp_path / "shapeless.py").write_text(
        "from dtrain_test_user import RandomImageData\n"
        "class Shapeless(RandomImageData):\n"
        "    def __init__(self, **kw):\n"
        "        super().__init__(**kw)\n"
        "        del self.sample_shape\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = trainer_config(tmp_path)
    config["data"] = {"classPath": "shapeless.Shapeless"}
    fails_with(capsys, ["--config", str(write_config(tmp_path, config))], "export.onnx.inputShape", "e.g. [3, 224, 224]")


def test_a_launch_that_cannot_be_a_gang_names_the_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, trainer_config(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    fails_with(capsys, ["--config", str(path)], "WORLD_SIZE 3 is not a whole number of nodes of LOCAL_WORLD_SIZE 2")


def test_bad_progress_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.ENV_PROGRESS_SINK, "carrier-pigeon")
    path = write_config(tmp_path, trainer_config(tmp_path))
    fails_with(capsys, ["--config", str(path)], "DTRAIN_PROGRESS_SINK is 'carrier-pigeon'", "jsonl:<path>")


def test_config_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_CONFIG, str(tmp_path / "missing.yaml"))
    fails_with(capsys, [], "missing.yaml: cannot read the config")


def test_error_reaches_the_progress_sink_and_the_termination_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    termination_log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(termination_log))
    config = trainer_config(tmp_path)
    config["model"] = {"classPath": "nosuchpackage.Model"}
    line = fails_with(capsys, ["--config", str(write_config(tmp_path, config))], "nosuchpackage")
    assert '"ok":false' in termination_log.read_text()
    assert line.removeprefix("dtrain: error: ") in termination_log.read_text()
    progress = (tmp_path / "progress.jsonl").read_text()
    assert '"event": "error"' in progress and "nosuchpackage" in progress


def test_unwritable_directories_are_named_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file where a directory should be: as unwritable for root as for the trainer's user.
    (tmp_path / "volume").write_text("not a directory")
    config = trainer_config(tmp_path, checkpoint={"dir": str(tmp_path / "volume" / "checkpoints")})
    fails_with(capsys, ["--config", str(write_config(tmp_path, config))], "checkpoint.dir", "is not writable")
    config = trainer_config(tmp_path, artifacts={"dir": str(tmp_path / "volume" / "artifacts")})
    fails_with(capsys, ["--config", str(write_config(tmp_path, config))], "artifacts.dir", "is not writable")
    # Nothing trained: no checkpoint was written.
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_the_ranks_of_a_gang_check_one_shared_directory_at_once(tmp_path: Path) -> None:
    """Every rank checks checkpoint.dir as it starts, and on a shared volume they check one directory at the same
    moment, each pod with a PID namespace of its own (the same pid). Here threads of one process, one pid: none
    may remove the probe of another (the e2e elastic job's worker failed 'not writable (No such file or directory)')."""
    failures: list[BaseException] = []

    def check() -> None:
        try:
            for _ in range(50):
                check_writable(tmp_path / "shared" / "checkpoints", "checkpoint.dir")
        except BaseException as exc:  # noqa: BLE001 - any failure is the test's
            failures.append(exc)

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]
    assert not list((tmp_path / "shared" / "checkpoints").iterdir()), "a probe was left behind"


def test_the_invalid_config_exit_code_is_the_contracts() -> None:
    assert EXIT_CONFIG_ERROR == contract.TRAINER_EXIT_INVALID_CONFIG


def test_real_process_prints_one_line_and_exits_with_the_invalid_config_code(tmp_path: Path) -> None:
    config = trainer_config(tmp_path)
    config["model"] = {"classPath": "dtrain_test_user.NotAModule"}
    run = run_trainer(write_config(tmp_path, config), DTRAIN_PROGRESS_SINK="none")
    assert run.returncode == EXIT_CONFIG_ERROR
    assert run.stderr.strip().splitlines() == [
        (
            "dtrain: error: model.classPath: dtrain_test_user.NotAModule is not a LightningModule subclass "
            "(of lightning.pytorch or pytorch_lightning)"
        )
    ]
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.slow
def test_unused_parameters_name_the_spec_field(tmp_path: Path) -> None:
    config = trainer_config(tmp_path, model={"classPath": "dtrain_test_user.UnusedParameterClassifier"})
    run = run_trainer(write_config(tmp_path, config), DTRAIN_PROGRESS_SINK="none")
    assert run.returncode == EXIT_CONFIG_ERROR, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("dtrain: error: trainer.findUnusedParameters:") and "findUnusedParameters: true" in last
    assert "ddp_find_unused_parameters_true" not in last
