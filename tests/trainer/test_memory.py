"""The memory pre-flight: exact state arithmetic, saved-tensor accounting, the verdict and the command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from dtrain_trainer.memory import (
    ActivationModel,
    estimate_from,
    estimate_job,
    fit,
    measure_activations,
    optimizer_slots,
    parse_memory,
    saved_tensor_bytes,
    state_bytes,
    usable_bytes,
)
from dtrain_trainer.models import ImageClassifier

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
GiB = 2**30


class TwoLayers(torch.nn.Module):
    """fc1 saves its input (B x 10 floats); relu saves its output (B x 5), which fc2 saves again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize(
    "precision,weight_bytes",
    [("32-true", 4), ("16-mixed", 4), ("bf16-mixed", 4), ("bf16-true", 2), ("16-true", 2), ("64-true", 8)],
)
@pytest.mark.parametrize("slots", [0, 1, 2, 3])
def test_state_arithmetic_is_exact(precision, weight_bytes, slots):
    state = state_bytes(trainable=1000, frozen=24, precision=precision, slots=slots, slots_note="")
    assert state.weights == 1024 * weight_bytes
    assert state.gradients == 1000 * weight_bytes
    assert state.optimizer == 1000 * weight_bytes * slots


def test_optimizer_slots_follow_the_optimizer():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert optimizer_slots(torch.optim.Adam(params))[0] == 2
    assert optimizer_slots(torch.optim.AdamW(params, amsgrad=True))[0] == 3
    assert optimizer_slots(torch.optim.SGD(params, lr=0.1, momentum=0.9))[0] == 1
    assert optimizer_slots(torch.optim.SGD(params, lr=0.1))[0] == 0
    assert optimizer_slots(None)[0] == 0


def test_each_saved_storage_is_counted_once():
    model = TwoLayers()
    x = torch.randn(8, 10)
    saved = saved_tensor_bytes(model, lambda: model(x))
    # fc1's input (8x10 floats) and relu's output (8x5) once, though relu and fc2 both save it;
    # the weights are parameters, counted elsewhere.
    assert saved.total == 8 * 10 * 4 + 8 * 5 * 4
    assert saved.largest == 8 * 10 * 4


def test_activations_scale_per_sample():
    model = TwoLayers()
    fitted = measure_activations(model, lambda b: (lambda: model(torch.randn(b, 10))), "32-true", (2, 4))
    assert fitted.per_sample == pytest.approx(60)
    assert fitted.fixed == pytest.approx(0)
    assert fitted.at(100) == (6000, 2 * 40 * 100)


def test_a_job_that_does_not_fit_gets_a_batch_that_does():
    activation = ActivationModel(fixed=0, per_sample=100 * MiB, largest_per_sample=5 * MiB)
    slots = (2, "Adam")
    estimate = estimate_from("32-true", 256, 25_000_000, 0, slots, activation, (2, 4))
    result = fit(estimate, 16 * GiB, 1, activation, 25_000_000, 0, slots)
    assert not result.fits and result.usable == usable_bytes(16 * GiB)
    assert result.suggestions[0].startswith("trainer.batchSize: 128 with trainer.accumulateGradBatches: 2")
    assert any("bf16-mixed" in s for s in result.suggestions)
    assert fit(estimate, 80 * GiB, 1, activation, 25_000_000, 0, slots).fits


@pytest.mark.parametrize("text,count", [("32Gi", 32 * GiB), ("80G", 80 * 10**9), ("40960Mi", 40 * GiB), ("1.5Gi", 3 * GiB // 2)])
def test_memory_sizes(text, count):
    assert parse_memory(text) == count


def test_a_bad_memory_size_is_refused():
    with pytest.raises(ValueError, match="32Gi"):
        parse_memory("lots")


def _job_file(tmp_path: Path, **trainer) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job["spec"]["model"]["initArgs"]["arch"] = "resnet18"
    job["spec"]["trainer"].update(trainer)
    job["spec"]["storage"] = {"claimName": "dtrain-shared"}  # a cluster's job: dtrain validate asks for shared storage
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.slow
def test_validate_estimate_prints_a_verdict(tmp_path):
    """The command on a real model: a table, exit 0 when it fits, 3 with a way out when it does not."""
    path = _job_file(tmp_path, batchSize=64)
    command = [sys.executable, "-m", "dtrain_operator.cli", "validate", "-q", "--estimate", str(path)]
    fits = subprocess.run([*command, "--gpu-memory", "80Gi"], capture_output=True, text=True, timeout=240, check=False)
    assert fits.returncode == 0, fits.stderr
    assert "peak per GPU" in fits.stdout and ": fits" in fits.stdout
    assert "Adam: exp_avg, exp_avg_sq" in fits.stdout
    small = subprocess.run(
        [*command, "--gpu-memory", "1.2Gi"], capture_output=True, text=True, timeout=240, check=False
    )
    assert small.returncode == 3, small.stdout + small.stderr
    assert "does NOT fit" in small.stdout and "fits instead" in small.stdout


@pytest.mark.parametrize("max_steps,max_epochs", [(40, None), (-1, 6)])
def test_an_optimizer_with_a_schedule_is_the_one_estimated(max_steps, max_epochs):
    """configure_optimizers of the built-in model reads the run's length from its Trainer (a cosine
    schedule): the estimate gives it one, and counts the optimizer it returns (SGD with momentum: one
    buffer per parameter), not an assumed Adam."""
    model = ImageClassifier(arch="resnet18", num_classes=10, optimizer="sgd", lr_schedule="cosine")
    settings = SimpleNamespace(precision="32-true", batch_size=4, accumulate_grad_batches=1,
                               max_steps=max_steps, max_epochs=max_epochs)
    result = estimate_job(model, None, (3, 32, 32), settings, None, batches=(2, 4))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert result.estimate.state.optimizer == trainable * 4
    assert result.estimate.state.optimizer_note == "SGD: momentum buffer"
    assert not any("assumed" in note for note in result.estimate.notes), result.estimate.notes
    assert model._trainer is None  # the stand-in is gone: training_step logs as outside a Trainer


def test_an_optimizer_that_cannot_be_built_here_says_what_was_estimated():
    class NeedsAFittedTrainer(ImageClassifier):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1 * self.trainer.num_devices)

    model = NeedsAFittedTrainer(arch="resnet18", num_classes=10)
    settings = SimpleNamespace(precision="32-true", batch_size=4, accumulate_grad_batches=1)
    result = estimate_job(model, None, (3, 32, 32), settings, None, batches=(2, 4))
    [note] = [n for n in result.estimate.notes if "configure_optimizers" in n]
    assert note.startswith("configure_optimizers() read what only a running Trainer has (AttributeError")
    assert note.endswith("estimated with Adam's state (two buffers per parameter), the built-in model's default")
    assert result.estimate.state.optimizer_note == "assumed Adam: exp_avg, exp_avg_sq"
