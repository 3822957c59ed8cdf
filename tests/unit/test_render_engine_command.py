"""The engine Job's command, `dtrain build-engine`: spec.engine's build options rendered as its flags, as
the command parses them back, and as its help documents them (the engine Job itself: test_render.py)."""

from __future__ import annotations

import pytest

from dtrain_operator.core import engine_job
from tests.builders import a_job

MNIST = a_job("mnist").in_namespace("ml")
"""The job rendered here: every spec field at its default unless a test says otherwise."""


def test_engine_build_options_become_build_engine_flags():
    """Each spec.engine build option is the `dtrain build-engine` flag of the same name, in the spec's order;
    an option at the command's default adds none."""
    engine = {
        "precision": "fp32", "tf32": True, "hardwareCompatibilityLevel": "ampere+", "versionCompatible": True,
        "refit": True, "stripWeights": True, "builderOptimizationLevel": 5, "layerPrecisions": {"fc*": "fp16"},
        "precisionConstraints": "obey", "pluginLibraries": ["/opt/plugins/libroi.so"], "useCudaGraph": True,
        "profiles": [
            {"inputs": {"tokens": {"min": [1, 1], "opt": [4, 64], "max": [8, 128]}}},
            {"inputs": {"tokens": {"min": [16, 1], "opt": [16, 64], "max": [16, 512]}}},
        ],
    }
    command = engine_job.engine_command(MNIST.with_spec(engine=engine).as_model())
    flags = command[command.index("--report") + 2:]
    assert flags == [
        "--precision", "fp32",
        "--min-shapes", "tokens:1x1", "--opt-shapes", "tokens:4x64", "--max-shapes", "tokens:8x128",
        "--min-shapes", "tokens:16x1", "--opt-shapes", "tokens:16x64", "--max-shapes", "tokens:16x512",
        "--tf32", "--hardware-compatibility-level", "ampere+", "--version-compatible", "--refit", "--strip-weights",
        "--builder-optimization-level", "5", "--layer-precisions", "fc*:fp16", "--precision-constraints", "obey",
        "--plugin-library", "/opt/plugins/libroi.so", "--use-cuda-graph",
    ]
    default = engine_job.engine_command(MNIST.as_model())
    assert default[default.index("--report") + 2:] == ["--min-batch", "1", "--opt-batch", "32", "--max-batch", "32"]


@pytest.mark.parametrize("pattern", ["fc*", "block:1/conv", "layer one", "a?b"])
def test_a_layer_pattern_reaches_build_engine_as_written(pattern: str) -> None:
    """The last ':' ends the name and spaces inside it stay: what the engine matches is what the spec says."""
    import argparse

    from dtrain_operator.api import engine_options

    wanted = {pattern: "fp16", "head": "fp32"}
    engine = MNIST.with_spec(engine={"precision": "fp32", "layerPrecisions": wanted}).as_model().spec.engine
    parser = argparse.ArgumentParser()
    engine_options.add_flags(parser)
    flags = engine_options.to_flags(engine_options.from_spec(engine))
    assert engine_options.from_flags(parser.parse_args(flags)).layer_precisions == wanted


@pytest.mark.parametrize("pattern", ["fc1,fc2", " fc1", "fc1 ", ""])
def test_a_layer_pattern_the_flag_cannot_carry_is_refused_with_the_way_out(pattern: str) -> None:
    from dtrain_operator.api.validation import validate_object

    job = MNIST.with_spec(engine={"precision": "fp32", "layerPrecisions": {pattern: "fp16"}}).as_dict()
    [error] = validate_object(job, cluster=False).errors
    assert error.startswith(f'spec.engine.layerPrecisions["{pattern}"]: cannot be passed to dtrain build-engine')
    assert "match a ',' or a space at either end with '?'" in error


def test_build_engine_help_documents_each_spec_engine_build_option():
    """The command's help is the field's description, so that the two cannot say different things."""
    from dtrain_operator.api import EngineSettings, artifacts
    from dtrain_operator.cli import main as cli

    (engine_parser,) = (
        action.choices["build-engine"] for action in cli.build_parser()._actions if action.dest == "command"
    )
    helps = {" ".join(str(action.help).split()) for action in engine_parser._actions}
    for name, field in EngineSettings.model_fields.items():
        if any(isinstance(marker, artifacts.BuildFlag) for marker in field.metadata) and name != "profiles":
            assert any(str(field.description).rstrip(".") in text for text in helps), name


def test_the_engine_fallback_is_the_jobs_choice_rendered_as_the_flag():
    """A cluster without TensorRT: the job says what to do, and the command says it; nobody rewrites it."""
    assert "--fallback" not in engine_job.engine_command(MNIST.as_model())
    command = engine_job.engine_command(MNIST.with_spec(engine={"fallback": "onnxruntime"}).as_model())
    assert command[-2:] == ["--fallback", "onnxruntime"]
    assert engine_job.render_engine_job(MNIST.with_spec(engine={"fallback": "onnxruntime"}).as_model())[
        "spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--fallback", "onnxruntime"]
