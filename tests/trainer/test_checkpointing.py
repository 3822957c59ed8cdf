"""Which checkpoint a start resumes from."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
import torch

from dtrain_trainer.checkpointing import AtomicCheckpointIO, CheckpointWriteError, find_resume_checkpoint


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


class FillsTheDisk:
    """Pickles into some bytes, then fails the way a full disk fails a write."""

    def __reduce__(self) -> tuple[object, ...]:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_leaves_the_last_complete_checkpoint_and_says_so(tmp_path: Path) -> None:
    writer = AtomicCheckpointIO()
    last = tmp_path / "last.ckpt"
    writer.save_checkpoint({"global_step": 4, "weights": torch.ones(1000)}, last)
    before = last.read_bytes()
    with pytest.raises(CheckpointWriteError) as error:
        writer.save_checkpoint({"global_step": 6, "weights": torch.ones(1000), "extra": FillsTheDisk()}, last)
    assert "is full" in str(error.value) and "last.ckpt" in str(error.value)
    # The old checkpoint is whole, and no partial file is left in the directory to be picked up.
    assert last.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert find_resume_checkpoint(tmp_path) == last


def test_checkpoints_are_staged_in_their_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A temp directory that cannot be written: the writer never goes there.
    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-such-tmp"))
    tempfile.tempdir = None
    try:
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, tmp_path / "ckpt" / "step=00000002.ckpt")
    finally:
        tempfile.tempdir = None
    assert torch.load(tmp_path / "ckpt" / "step=00000002.ckpt", weights_only=True)["global_step"] == 2
