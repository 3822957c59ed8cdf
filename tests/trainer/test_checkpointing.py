"""Which checkpoint a start resumes from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dtrain_trainer.checkpointing import find_resume_checkpoint


def save(path: Path, step: int, mtime: int) -> Path:
    torch.save({"global_step": step}, path)
    os.utime(path, ns=(mtime, mtime))
    return path


def test_fresh_start(tmp_path: Path) -> None:
    assert find_resume_checkpoint(tmp_path / "missing") is None
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert find_resume_checkpoint(tmp_path) is None


def test_last_checkpoint_wins_over_the_step_file_it_repeats(tmp_path: Path) -> None:
    save(tmp_path / "step=00000002.ckpt", 2, 1_000)
    save(tmp_path / "step=00000004.ckpt", 4, 2_000)
    last = save(tmp_path / "last.ckpt", 4, 2_000)
    assert find_resume_checkpoint(tmp_path) == last


def test_a_step_file_newer_than_last_wins(tmp_path: Path) -> None:
    """The writer died between the step file and last.ckpt of one save."""
    save(tmp_path / "last.ckpt", 4, 2_000)
    newer = save(tmp_path / "step=00000006.ckpt", 6, 3_000)
    assert find_resume_checkpoint(tmp_path) == newer


def test_an_incomplete_checkpoint_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    older = save(tmp_path / "step=00000004.ckpt", 4, 2_000)
    last = save(tmp_path / "last.ckpt", 6, 3_000)
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    assert find_resume_checkpoint(tmp_path) == older
    assert "last.ckpt is incomplete or unreadable" in caplog.text
