"""`dtrain build-engine` with its files on object storage (s3://, gs://), as the engine Job runs it there.

The build reads and writes local files (TensorRT, ONNX Runtime and torch all want paths), so the
files are staged: the objects beside --onnx (model.onnx, its external data, artifacts.json, the
timing cache) and the checkpoint artifacts.json names are downloaded into a scratch directory,
the build runs on the local copies, and then its outputs (the engine, its report, the timing
cache) are uploaded with retries, the report last. In the report and the termination message the
scratch paths are written back as the URLs they stand for.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dtrain_common import object_store
from dtrain_engine.onnx_model import EngineError, usage_error
from dtrain_operator.api import contract
from dtrain_operator.api.storage import is_object_url

# Flags that name a file the build writes (uploaded after it), and the one it reads and writes.
_OUTPUTS = ("out", "report", "timing_cache")
_FLAGS = ("onnx", "pytorch_checkpoint", *_OUTPUTS)
STAGED_CHECKPOINT = "staged.ckpt"


def needs_staging(args: argparse.Namespace) -> bool:
    return any(is_object_url(getattr(args, flag, None)) for flag in _FLAGS)


def _download_inputs(args: argparse.Namespace, scratch: Path) -> dict[str, str]:
    """Download what the build reads; the URL each local copy stands for."""
    onnx_url = str(args.onnx)
    directory = onnx_url.rsplit("/", 1)[0]
    outputs = {str(getattr(args, flag)) for flag in ("out", "report") if getattr(args, flag, None)}
    fs, path = object_store.filesystem(directory)
    try:
        entries = fs.ls(path, detail=True, refresh=True)
    except FileNotFoundError:
        entries = []
    names = [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "file"]
    if contract.ONNX_FILE_NAME not in names and onnx_url.rsplit("/", 1)[-1] not in names:
        raise usage_error(f"--onnx {onnx_url}: no such object")
    staged: dict[str, str] = {}
    for name in names:
        url = object_store.join(directory, name)
        if url in outputs:
            continue
        object_store.download_file(url, str(scratch / name))
        staged[str(scratch / name)] = url
    return staged


def _stage_checkpoint(args: argparse.Namespace, scratch: Path, staged: dict[str, str]) -> str | None:
    """The --pytorch-checkpoint to build with: the flag's object downloaded, or the flag as it is; the checkpoint
    artifacts.json names is downloaded too, and the staged artifacts.json names the local copy."""
    local = scratch / STAGED_CHECKPOINT
    if is_object_url(args.pytorch_checkpoint):
        object_store.download_file(args.pytorch_checkpoint, str(local))
        staged[str(local)] = args.pytorch_checkpoint
        return str(local)
    record_path = scratch / contract.ARTIFACTS_FILE_NAME
    if args.pytorch_checkpoint is not None or args.no_baseline or not record_path.is_file():
        return args.pytorch_checkpoint  # type: ignore[no-any-return]
    record = json.loads(record_path.read_text())
    named = record.get(contract.ARTIFACTS_KEY_CHECKPOINT) if isinstance(record, dict) else None
    url = named.get("path") if isinstance(named, dict) else named
    if isinstance(url, str) and is_object_url(url):
        object_store.download_file(url, str(local))
        staged[str(local)] = url
        record[contract.ARTIFACTS_KEY_CHECKPOINT] = {"path": str(local)}
        record_path.write_text(json.dumps(record))
    return None


def _localised(args: argparse.Namespace, scratch: Path, staged: dict[str, str]) -> argparse.Namespace:
    local = copy.copy(args)
    local.onnx = str(scratch / str(args.onnx).rsplit("/", 1)[-1]) if is_object_url(args.onnx) else args.onnx
    for flag in _OUTPUTS:
        value = getattr(args, flag, None)
        if is_object_url(value):
            path = scratch / "out" / str(value).rsplit("/", 1)[-1]
            path.parent.mkdir(exist_ok=True)
            if flag == "timing_cache" and str(scratch / path.name) in staged:
                shutil.copyfile(scratch / path.name, path)
            setattr(local, flag, str(path))
            staged[str(path)] = str(value)
    if args.report is None and is_object_url(args.out):
        local.report = str(scratch / "out" / contract.ENGINE_REPORT_FILE_NAME)
        staged[local.report] = object_store.join(str(args.out).rsplit("/", 1)[0], contract.ENGINE_REPORT_FILE_NAME)
    local.pytorch_checkpoint = _stage_checkpoint(args, scratch, staged)
    return local


def _as_urls(path: Path, staged: dict[str, str]) -> None:
    """Rewrite the scratch paths in a text file as the URLs they stand for."""
    if not path.is_file():
        return
    text = path.read_text()
    for local, url in sorted(staged.items(), key=lambda item: -len(item[0])):
        text = text.replace(local, url)
    path.write_text(text)


def _upload_outputs(local: argparse.Namespace, staged: dict[str, str]) -> None:
    for flag in ("timing_cache", "out", "report"):
        value = getattr(local, flag, None)
        if value is None or value not in staged or not os.path.isfile(value):
            continue
        if flag == "report":
            _as_urls(Path(value), staged)
        upload = object_store.upload_file(value, staged[value])
        if not upload.ok:
            raise EngineError(f"cannot upload {staged[value]} ({upload.error})")


def run_staged(args: argparse.Namespace, build: Callable[[argparse.Namespace], int], termination_log: str | None) -> int:
    """`build` on local copies of the objects `args` names; its outputs uploaded; its exit code."""
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-engine-"))
    try:
        try:
            staged = _download_inputs(args, scratch)
            local = _localised(args, scratch, staged)
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - any SDK error: the bucket, endpoint or credentials
            raise usage_error(f"cannot read {args.onnx} and the files beside it ({object_store.describe(exc)})") from None
        code = build(local)
        _upload_outputs(local, staged)
        if termination_log:
            _as_urls(Path(termination_log), staged)
        return code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
