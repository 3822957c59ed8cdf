"""Checkpoints and artifacts on s3://, against a real S3 server (versitygw, tests/s3server.py), with real trainer processes.

Exact resume from the bucket; a checkpoint whose upload was cut short is never the one resumed from; the
server going away mid-training delays or misses checkpoints but leaves none half-written; an unreachable
bucket fails the start in seconds with exit 78; and a job never resumes from another job's checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dtrain_operator.api import contract
from tests.s3server import BUCKET, S3Server

from .conftest import (
    RUN_TIMEOUT_SECONDS,
    USER_MODEL,
    process_env,
    read_jsonl,
    run_trainer,
    trainer_config,
    write_config,
)
from .test_resume import launch
from .user_code.dtrain_test_user import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow

EXIT_INVALID_CONFIG = contract.TRAINER_EXIT_INVALID_CONFIG


class Bucket:
    """What the tests read back from the server, through s3fs with the server's keys."""

    def __init__(self, server: S3Server) -> None:
        import s3fs

        env = server.env()
        self.fs = s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
            client_kwargs={"endpoint_url": server.endpoint, "region_name": env["AWS_REGION"]},
            skip_instance_cache=True, use_listings_cache=False,
        )

    @staticmethod
    def _key(url: str) -> str:
        return url.removeprefix("s3://")

    def names(self, url: str) -> list[str]:
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self._key(url), refresh=True))
        except FileNotFoundError:
            return []

    def pointer(self, url: str) -> dict[str, Any]:
        return json.loads(self.fs.cat_file(f"{self._key(url)}/{contract.LAST_POINTER_FILE_NAME}"))

    def load(self, url: str) -> dict[str, Any]:
        """A checkpoint read whole from the bucket (torch.load fails on a partial one)."""
        data = self.fs.cat_file(self._key(url))
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)  # type: ignore[no-any-return]

    def last(self, url: str) -> dict[str, Any]:
        return self.load(f"{url}/{self.pointer(url)['checkpoint']}")

    def pending_uploads(self) -> list[str]:
        """Multipart uploads begun and never completed: what a writer killed mid-upload leaves on the server."""
        reply = self.fs.call_s3("list_multipart_uploads", Bucket=BUCKET)
        return [upload["Key"] for upload in reply.get("Uploads", [])]


@pytest.fixture(scope="module")
def bucket(s3_server: S3Server) -> Bucket:
    return Bucket(s3_server)


def s3_config(tmp_path: Path, server: S3Server, prefix: str, **sections: Any) -> dict[str, Any]:
    checkpoint = {"dir": server.url(f"{prefix}/checkpoints"), "everyNSteps": 2, "keepLast": 2, **sections.pop("checkpoint", {})}
    return trainer_config(tmp_path, checkpoint=checkpoint, artifacts={"dir": server.url(f"{prefix}/artifacts")}, **sections)


def test_resuming_from_s3_checkpoints_ends_with_the_uninterrupted_runs_weights(
    tmp_path: Path, s3_server: S3Server, bucket: Bucket
) -> None:
    def config(prefix: str, **model_args: Any) -> dict[str, Any]:
        # Two ranks, 128 samples in batches of 8: 8 steps an epoch; 12 steps cross an epoch end.
        return s3_config(
            tmp_path / prefix, s3_server, f"resume/{prefix}",
            model={"classPath": USER_MODEL, "initArgs": model_args},
            data={"initArgs": {"num_samples": 128}},
            trainer={"maxSteps": 12, "maxEpochs": 5, "numWorkers": 0},
            checkpoint={"everyNSteps": 3, "keepLast": 1},
            export={"onnx": {"enabled": False}},
        )

    whole = launch(tmp_path, config("whole"), 2, "whole", **s3_server.env())
    assert whole.returncode == 0, whole.stderr[-3000:]

    # A worker dies right after the checkpoint of step 6, mid-epoch; the restarted gang resumes from the bucket.
    crashing = config("restarted", crash_at_step=6, crash_marker=str(tmp_path / "crashed-once"))
    first = launch(tmp_path, crashing, 2, "restarted", **s3_server.env())
    assert first.returncode == CRASH_EXIT_CODE, first.stderr[-3000:]
    directory = s3_server.url("resume/restarted/checkpoints")
    assert bucket.pointer(directory)["step"] == 6
    assert contract.LAST_CHECKPOINT_FILE_NAME not in bucket.names(directory)  # no checkpoint is uploaded twice
    second = launch(tmp_path, crashing, 2, "restarted", **s3_server.env())
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {directory}/step=00000006.ckpt" in second.stderr

    expected = bucket.last(s3_server.url("resume/whole/checkpoints"))
    resumed = bucket.last(directory)
    assert expected["global_step"] == resumed["global_step"] == 12
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def start_trainer(config_path: Path, progress: Path, **env: str) -> subprocess.Popen[str]:
    environment = process_env(**env, **{contract.ENV_PROGRESS_SINK: f"{contract.PROGRESS_SINK_JSONL_PREFIX}{progress}"})
    return subprocess.Popen(
        [sys.executable, "-m", "dtrain_trainer", "--config", str(config_path)], env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def records(progress: Path) -> Iterator[dict[str, Any]]:
    yield from (read_jsonl(progress) if progress.is_file() else [])


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_checkpoint_killed_mid_upload_is_never_the_one_resumed_from(
    tmp_path: Path, s3_server: S3Server, bucket: Bucket
) -> None:
    # A 160 MiB checkpoint: ten parts of 16 MiB, long enough to kill the writer in the middle.
    config = s3_config(
        tmp_path, s3_server, "killed",
        model={"classPath": USER_MODEL, "initArgs": {"ballast_mb": 160}},
        trainer={"maxSteps": 40, "numWorkers": 0}, export={"onnx": {"enabled": False}},
    )
    directory = s3_server.url("killed/checkpoints")
    progress = tmp_path / "progress.jsonl"
    trainer = start_trainer(write_config(tmp_path, config), progress, **s3_server.env())
    try:
        saved = lambda: [r for r in records(progress) if r["event"] == "checkpoint" and r.get("ok")]
        wait_for(lambda: saved(), 180, "the first checkpoint")
        # Kill the writer while a later checkpoint's parts are going up (a multipart upload not yet completed).
        in_flight = lambda: [k for k in bucket.pending_uploads() if k.startswith("killed/checkpoints/step=")]
        wait_for(in_flight, 120, "a later checkpoint's upload")
        os.killpg(trainer.pid, signal.SIGKILL)  # the pod dies: no cleanup, no completed upload
    finally:
        trainer.kill()
        trainer.wait()
    cut = in_flight()[-1].rsplit("/", 1)[-1]
    names = bucket.names(directory)
    assert cut not in names  # the half-written upload is no object
    pointer = bucket.pointer(directory)
    assert pointer["checkpoint"] < cut and pointer["checkpoint"] in names
    assert bucket.last(directory)["global_step"] == pointer["step"] == saved()[-1]["step"]

    longer = {**config, "trainer": {**config["trainer"], "maxSteps": pointer["step"] + 2}}
    resumed = run_trainer(write_config(tmp_path, longer), **s3_server.env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {directory}/{pointer['checkpoint']} at step {pointer['step']}" in resumed.stderr


def train_through_an_outage(
    tmp_path: Path, server: S3Server, prefix: str, max_steps: int, checkpoint: dict[str, Any], back_after: float | None
) -> tuple[int, str, Path]:
    """A slow trainer on `server`, which is stopped after the first checkpoint and started again `back_after`
    seconds later (None: never). Returns the trainer's exit code, its stderr and its progress records' file."""
    config = s3_config(
        tmp_path, server, prefix,
        model={"classPath": USER_MODEL, "initArgs": {"step_sleep": 0.25}},
        trainer={"maxSteps": max_steps, "numWorkers": 0}, checkpoint={"everyNSteps": 2, **checkpoint},
        export={"onnx": {"enabled": False}},
    )
    progress = tmp_path / "progress.jsonl"
    trainer = start_trainer(write_config(tmp_path, config), progress, **server.env())
    try:
        wait_for(lambda: any(r["event"] == "checkpoint" for r in records(progress)), 120, "the first checkpoint")
        server.stop()
        if back_after is not None:
            time.sleep(back_after)
            server.start()
        _, stderr = trainer.communicate(timeout=RUN_TIMEOUT_SECONDS)
    finally:
        trainer.kill()
        trainer.wait()
    return trainer.returncode, stderr, progress


def test_the_server_gone_for_a_while_delays_or_misses_checkpoints_but_training_goes_on(tmp_path: Path) -> None:
    server = S3Server.start_new(tmp_path / "server")  # its own: this test stops it
    try:
        # 30 s down, as the issue asks: longer than one checkpoint's retries (object_store.RETRY_DELAYS_SECONDS).
        returncode, stderr, progress = train_through_an_outage(tmp_path, server, "outage", 60, {"keepLast": 50}, 30)
        assert returncode == 0, stderr[-3000:]
        saves = [r for r in records(progress) if r["event"] == "checkpoint"]
        late_or_missed = [r for r in saves if r.get("attempts", 1) > 1 or r.get("ok") is False]
        assert late_or_missed, saves
        missed = [r for r in saves if r.get("ok") is False]
        if missed:
            assert f"checkpoint of step {missed[0]['step']} not saved" in stderr
        bucket = Bucket(server)
        directory = server.url("outage/checkpoints")
        assert bucket.pointer(directory)["step"] == 60
        # Every checkpoint in the bucket is whole. One reported missed may still be there: a write whose
        # answer the outage swallowed may have landed (or its pointer update failed after it did); the
        # trainer cannot know, says "not saved", and never resumes from it (the pointer names step 60).
        names = [n for n in bucket.names(directory) if n.startswith("step=")]
        for name in names:
            assert bucket.load(f"{directory}/{name}")["global_step"] == int(name[5:13])
        assert all(r["step"] != bucket.pointer(directory)["step"] for r in missed)
    finally:
        server.stop()


def test_with_on_write_failure_fail_a_checkpoint_not_written_stops_training(tmp_path: Path) -> None:
    server = S3Server.start_new(tmp_path / "server")  # its own: this test stops it for good
    try:
        returncode, stderr, progress = train_through_an_outage(
            tmp_path, server, "stop-on-miss", 200, {"onWriteFailure": "Fail"}, None
        )
        assert returncode == 1, stderr[-3000:]
        missed = [r for r in records(progress) if r["event"] == "checkpoint" and r.get("ok") is False]
        assert len(missed) == 1, missed
        assert f"checkpoint of step {missed[0]['step']} not saved" in stderr
        assert "checkpoint.onWriteFailure is Fail: training stops" in stderr
        steps = [r["step"] for r in records(progress) if r["event"] == "progress"]
        assert max(steps, default=0) < 200  # stopped, not trained to the end
    finally:
        server.stop()


def test_an_unreachable_bucket_fails_the_start_at_once_naming_the_url(tmp_path: Path, s3_server: S3Server) -> None:
    url = s3_server.url("unreachable/checkpoints")
    config_path = write_config(tmp_path, s3_config(tmp_path, s3_server, "unreachable"))
    closed = {**s3_server.env(), "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    started = time.monotonic()
    run = run_trainer(config_path, **closed)
    assert run.returncode == EXIT_INVALID_CONFIG, run.stderr[-3000:]
    assert time.monotonic() - started < 90
    assert f"checkpoint.dir {url} is unreachable (EndpointConnectionError" in run.stderr

    wrong_key = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-key-0123456789"}
    refused = run_trainer(config_path, **wrong_key)
    assert refused.returncode == EXIT_INVALID_CONFIG
    assert f"checkpoint.dir {url} is unreachable (" in refused.stderr
    assert "not-the-key" not in refused.stderr


def test_a_job_never_resumes_from_another_jobs_checkpoint(tmp_path: Path, s3_server: S3Server, bucket: Bucket) -> None:
    def job(name: str, **checkpoint: Any) -> Path:
        config = s3_config(tmp_path, s3_server, "shared", jobName=name, trainer={"maxSteps": 2, "numWorkers": 0},
                           checkpoint=checkpoint, export={"onnx": {"enabled": False}})
        return write_config(tmp_path, config, f"{name}.yaml")

    directory = s3_server.url("shared/checkpoints")
    first = run_trainer(job("alpha"), **s3_server.env())
    assert first.returncode == 0, first.stderr[-3000:]
    assert bucket.last(directory)[contract.CHECKPOINT_OWNER_KEY]["name"] == "alpha"

    refused = run_trainer(job("beta"), **s3_server.env())
    assert refused.returncode == EXIT_INVALID_CONFIG
    assert (f"checkpoint.dir: {directory}/step=00000002.ckpt is not this job's checkpoint: it belongs to the job "
            "default/alpha") in refused.stderr
    assert "checkpoint.foreign: StartFresh" in refused.stderr

    fresh = run_trainer(job("beta", foreign="StartFresh"), **s3_server.env())
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "training from scratch" in fresh.stderr and "resumed from" not in fresh.stderr
    assert bucket.last(directory)[contract.CHECKPOINT_OWNER_KEY]["name"] == "beta"


def test_a_changed_spec_does_not_resume_without_saying_so(tmp_path: Path) -> None:
    def config(lr: float, **checkpoint: Any) -> Path:
        return write_config(tmp_path, trainer_config(
            tmp_path, model={"classPath": USER_MODEL, "initArgs": {"lr": lr}}, trainer={"maxSteps": 2, "numWorkers": 0},
            checkpoint=checkpoint, export={"onnx": {"enabled": False}}), f"lr{lr}.yaml")

    assert run_trainer(config(0.05)).returncode == 0
    changed = run_trainer(config(0.01))
    assert changed.returncode == EXIT_INVALID_CONFIG
    assert "it was written by this job with another model, data or trainer spec" in changed.stderr
    anyway = run_trainer(config(0.01, foreign="Resume"))
    assert anyway.returncode == 0, anyway.stderr[-3000:]
    assert "checkpoint.foreign Resume: resuming from" in anyway.stderr and "resumed from" in anyway.stderr


def test_sigterm_saves_its_checkpoint_to_the_bucket_as_every_save_does(
    tmp_path: Path, s3_server: S3Server, bucket: Bucket
) -> None:
    config = s3_config(
        tmp_path, s3_server, "sigterm",
        model={"classPath": USER_MODEL, "initArgs": {"step_sleep": 0.05}}, data={"initArgs": {"num_samples": 4096}},
        trainer={"maxSteps": 100000, "maxEpochs": 1, "numWorkers": 0},
        # No step checkpoint would come for a long time: the one found is SIGTERM's.
        checkpoint={"everyNSteps": 10000}, export={"onnx": {"enabled": False}},
    )
    progress = tmp_path / "progress.jsonl"
    trainer = start_trainer(write_config(tmp_path, config), progress, **s3_server.env())
    try:
        wait_for(lambda: any((r.get("step") or 0) >= 3 for r in records(progress)), 120, "step 3")
        trainer.send_signal(signal.SIGTERM)
        _, stderr = trainer.communicate(timeout=90)
    finally:
        trainer.kill()
        trainer.wait()
    assert trainer.returncode == 143, stderr[-3000:]
    stopped = next(r for r in records(progress) if r["event"] == "stopped")
    directory = s3_server.url("sigterm/checkpoints")
    pointer = bucket.pointer(directory)
    assert stopped["checkpoint"] == f"{directory}/{pointer['checkpoint']}"
    assert bucket.last(directory)["global_step"] == pointer["step"] == stopped["step"]
