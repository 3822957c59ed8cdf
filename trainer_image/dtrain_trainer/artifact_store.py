"""model.onnx and artifacts.json in artifacts.dir, a directory or object storage (s3://, gs://).

The export itself writes into a local directory (it checks model.onnx with ONNX Runtime there).
For object storage that directory is a scratch one; its files are then uploaded with retries,
artifacts.json last, so that artifacts.json names only files that are in the bucket. The paths in
artifacts.json (the model's, the checkpoint's) are the URLs the engine Job reads.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain_common import object_store
from dtrain_operator.api import contract
from dtrain_operator.api.storage import is_object_url
from dtrain_trainer.export import ExportError

Export = Callable[[Path, Path | None], dict[str, Any]]


def join(directory: str, name: str) -> str:
    return object_store.join(directory, name) if is_object_url(directory) else str(Path(directory) / name)


def _relocated(record: dict[str, Any], local: Path, url: str) -> dict[str, Any]:
    """`record` with every path under the scratch directory `local` written as under `url`."""
    text = json.dumps(record).replace(json.dumps(str(local))[1:-1], url.rstrip("/"))
    return json.loads(text)  # type: ignore[no-any-return]


def _write_record(directory: Path, record: dict[str, Any]) -> None:
    (directory / contract.ARTIFACTS_FILE_NAME).write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")


def export_to(artifacts_dir: str, checkpoint: str | None, export: Export) -> dict[str, Any]:
    """Run `export` (into a directory, naming a local checkpoint) so that its files end up in `artifacts_dir`."""
    remote_checkpoint = checkpoint is not None and is_object_url(checkpoint)
    local_checkpoint = Path(checkpoint) if checkpoint is not None and not remote_checkpoint else None
    if not is_object_url(artifacts_dir):
        record = export(Path(artifacts_dir), local_checkpoint)
        if remote_checkpoint:
            record[contract.ARTIFACTS_KEY_CHECKPOINT] = {"path": checkpoint}
            _write_record(Path(artifacts_dir), record)
        return record
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-export-"))
    try:
        record = _relocated(export(scratch, local_checkpoint), scratch, artifacts_dir)
        if remote_checkpoint:
            record[contract.ARTIFACTS_KEY_CHECKPOINT] = {"path": checkpoint}
        _write_record(scratch, record)
        files = sorted(p for p in scratch.rglob("*") if p.is_file() and p.name != contract.ARTIFACTS_FILE_NAME)
        for path in [*files, scratch / contract.ARTIFACTS_FILE_NAME]:
            url = object_store.join(artifacts_dir, path.relative_to(scratch).as_posix())
            upload = object_store.upload_file(str(path), url)
            if not upload.ok:
                raise ExportError(f"artifacts.dir: cannot upload {url} ({upload.error})")
        return record
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
